"""A model's protobuf bytes as a stream of chunks: exactly ``model.SerializeToString(deterministic=True)``, without
ever holding them whole.

Serializing a model makes the protobuf runtime build the whole encoding and Python copy it into one ``bytes``:
measured on VGG16 (553 MB), +2.2 GB for a moment, the peak of its ingest; and ``fingerprint`` did the same to hash
it. Here every message but the large tensors' ``raw_data`` is serialized as usual, and the raw bytes are spliced
in where the encoder would put them: protobuf's deterministic encoding writes the fields of a message in
field-number order, each length-delimited field as tag, length, payload. So the largest transient is one tensor's
raw data (``tests/graph/test_wire.py`` checks the bytes against ``SerializeToString`` on real models).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import onnx

LARGE = 1 << 20  # tensors with more raw bytes than this are spliced, smaller ones serialized whole
LEN = _LEN = 2  # wire type: length-delimited
MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW = _MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW = 7, 5, 9


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _split(data: bytes, field: int) -> tuple[bytes, bytes]:
    """``data`` (a serialized message) cut before its first field numbered above ``field``."""
    i = 0
    while i < len(data):
        start = i
        tag, i = _read_varint(data, i)
        if tag >> 3 > field:
            return data[:start], data[start:]
        kind = tag & 7
        if kind == 0:
            _, i = _read_varint(data, i)
        elif kind == 1:
            i += 8
        elif kind == 2:
            n, i = _read_varint(data, i)
            i += n
        elif kind == 5:
            i += 4
        else:
            raise ValueError(f"wire type {kind} in a serialized ONNX message")
    return data, b""


@dataclass(frozen=True)
class Field:
    """One field of a serialized message: its tag at ``start``, its payload from ``payload`` to ``end``."""
    field: int
    kind: int
    start: int
    payload: int
    end: int


def fields(data, begin: int, end: int) -> Iterator[Field]:
    """The fields of the message encoded in ``data[begin:end]`` (``data``: bytes or a mapped file, never copied),
    in order; ValueError for an encoding that runs past ``end``."""
    i = begin
    while i < end:
        start = i
        tag, i = _read_varint(data, i)
        kind = tag & 7
        if kind == 0:
            _, j = _read_varint(data, i)
        elif kind == 1:
            j = i + 8
        elif kind == _LEN:
            n, i = _read_varint(data, i)
            j = i + n
        elif kind == 5:
            j = i + 4
        else:
            raise ValueError(f"wire type {kind} in a serialized ONNX message")
        if j > end:
            raise ValueError("a field runs past the end of its message")
        yield Field(tag >> 3, kind, start, i, j)
        i = j


def without(message, field_name: str):
    """A new message of the same type with every set field of ``message`` but ``field_name`` (no deep copy of it,
    and never read: reading a bytes field copies it)."""
    out = type(message)()
    for desc in message.DESCRIPTOR.fields:
        if desc.name == field_name:
            continue
        if desc.is_repeated if hasattr(desc, "is_repeated") else desc.label == desc.LABEL_REPEATED:
            value = getattr(message, desc.name)
            if len(value):
                getattr(out, desc.name).extend(value)
        elif not message.HasField(desc.name):
            continue
        elif desc.type == desc.TYPE_MESSAGE:
            getattr(out, desc.name).CopyFrom(getattr(message, desc.name))
        else:
            setattr(out, desc.name, getattr(message, desc.name))
    return out


def raw_size(t: onnx.TensorProto) -> int:
    """Bytes of ``t``'s raw data as its dims and type declare them (0 when it has none): for choosing what to do
    with a tensor, never for writing it. Asking protobuf costs more than it tells: reading ``raw_data`` copies it,
    and ``ByteSize()`` serializes the message (a 1.07 GB weight: +4.3 GB for a moment)."""
    if not t.HasField("raw_data"):
        return 0
    size = declared_size(t)
    return t.ByteSize() if size is None else size  # a type numpy has no width for: the serialized size, once


def declared_size(t: onnx.TensorProto) -> int | None:
    """Bytes ``t``'s dims and type declare (whether or not it holds them), or None for a type of no fixed width."""
    try:
        return math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def external_stub(t: onnx.TensorProto, location: str, offset: int | None = None,
                  length: int | None = None) -> onnx.TensorProto:
    """``t``'s name, type and dims, its data "external" at ``location`` (and ``offset``, ``length`` when given): what
    a model written with external data holds in its place, or a shape-only stand-in."""
    stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims,
                            data_location=onnx.TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = stub.external_data.add()
            e.key, e.value = k, str(v)
    return stub


STUB = "edgeplan-stub"  # the location of a large initializer's stand-in in a light copy
LIGHT_BYTES = 1 << 16  # initializers above this are stubs in a light copy


def is_stub(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL and any(e.key == "location" and e.value == STUB
                                                                 for e in t.external_data)


def large(t: onnx.TensorProto) -> bool:
    return raw_size(t) > LIGHT_BYTES or bool(t.external_data)


def light_copy(model: onnx.ModelProto, large_as_inputs: bool = False,
               keep: set[str] | frozenset[str] = frozenset()) -> onnx.ModelProto:
    """``model`` without the data of its large initializers (but those named in ``keep``): dims-only stubs (for
    shape inference, constant folding, splitting: passes that read no large value; ``artifacts.write_onnx(fill=)``
    writes the real ones in their place), or typed graph inputs of the same names (``large_as_inputs``: for passes
    that must not touch them). Every other field as in ``model``."""
    light = without(model, "graph")
    light.graph.CopyFrom(without(model.graph, "initializer"))
    lg = light.graph
    for t in model.graph.initializer:
        if t.name in keep or not large(t):
            lg.initializer.append(t)
        elif large_as_inputs:
            lg.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            lg.initializer.append(external_stub(t, STUB))
    return light


def _tensor(t: onnx.TensorProto) -> tuple[int, Iterator[bytes]]:
    """(length, chunks) of one serialized TensorProto."""
    if raw_size(t) <= LARGE:
        data = t.SerializeToString(deterministic=True)
        return len(data), iter((data,))
    before, after = _split(without(t, "raw_data").SerializeToString(deterministic=True), _TENSOR_RAW)
    raw = len(t.raw_data)  # a copy for a moment: protobuf tells a bytes field's length no other way
    tag = _varint(_TENSOR_RAW << 3 | _LEN)
    size = len(before) + len(tag) + len(_varint(raw)) + raw + len(after)

    def chunks() -> Iterator[bytes]:
        yield before
        yield tag + _varint(raw)
        yield t.raw_data
        yield after

    return size, chunks()


def _graph(g: onnx.GraphProto, initializers) -> tuple[int, Iterator[bytes]]:
    before, after = _split(without(g, "initializer").SerializeToString(deterministic=True), _GRAPH_INITIALIZER)
    tensors = [_tensor(t) for t in initializers]
    tag = _varint(_GRAPH_INITIALIZER << 3 | _LEN)
    size = len(before) + len(after) + sum(len(tag) + len(_varint(n)) + n for n, _ in tensors)

    def chunks() -> Iterator[bytes]:
        yield before
        for n, parts in tensors:
            yield tag + _varint(n)
            yield from parts
        yield after

    return size, chunks()


def chunks(model: onnx.ModelProto, initializers=None) -> Iterator[bytes]:
    """The bytes of ``model.SerializeToString(deterministic=True)``, in pieces (with ``initializers`` in place of
    its graph's when given: ``artifacts.write_onnx(fill=)``)."""
    before, after = _split(without(model, "graph").SerializeToString(deterministic=True), _MODEL_GRAPH)
    yield before
    if model.HasField("graph"):
        size, parts = _graph(model.graph, model.graph.initializer if initializers is None else initializers)
        yield _varint(_MODEL_GRAPH << 3 | _LEN) + _varint(size)
        yield from parts
    yield after
