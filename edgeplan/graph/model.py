"""A read-only view of a canonical ONNX model: shapes, producers, consumers, parameters, MACs."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnx

from edgeplan.artifacts import ModelInfo, TensorSpec
from edgeplan.errors import CutError
from edgeplan.graph.costs import node_macs


def _dims(t: onnx.TypeProto) -> tuple[int, ...]:
    return tuple(int(d.dim_value) for d in t.tensor_type.shape.dim)


def _dtype(t: onnx.TypeProto) -> str:
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type)))


@dataclass(frozen=True)
class GraphView:
    """Index of a canonical (static-shape, shape-inferred, topologically sorted) model."""

    model: onnx.ModelProto

    @cached_property
    def graph(self) -> onnx.GraphProto:
        return self.model.graph

    @cached_property
    def initializers(self) -> dict[str, onnx.TensorProto]:
        return {t.name: t for t in self.graph.initializer}

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for vi in list(self.graph.input) + list(self.graph.value_info) + list(self.graph.output):
            out[vi.name] = _dims(vi.type)
        for name, t in self.initializers.items():
            out[name] = tuple(int(d) for d in t.dims)
        return out

    @cached_property
    def dtypes(self) -> dict[str, str]:
        out = {}
        for vi in list(self.graph.input) + list(self.graph.value_info) + list(self.graph.output):
            out[vi.name] = _dtype(vi.type)
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        try:
            return self.shapes[name]
        except KeyError:
            raise CutError(f"tensor {name!r} has no inferred shape in the canonical model") from None

    @cached_property
    def producer(self) -> dict[str, int]:
        return {o: i for i, n in enumerate(self.graph.node) for o in n.output if o}

    @cached_property
    def consumers(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, n in enumerate(self.graph.node):
            for x in n.input:
                if x and x not in self.initializers:
                    out.setdefault(x, []).append(i)
        return out

    @cached_property
    def input(self) -> onnx.ValueInfoProto:
        return self.graph.input[0]

    @cached_property
    def output(self) -> onnx.ValueInfoProto:
        return self.graph.output[0]

    @cached_property
    def node_macs(self) -> list[int]:
        return [node_macs(n, self.shape) for n in self.graph.node]

    @cached_property
    def node_param_bytes(self) -> list[int]:
        """int8 parameter bytes of each node: weights 1 byte per element, 1-D biases 4 (int32)."""
        out = []
        for n in self.graph.node:
            b = 0
            for i, x in enumerate(n.input):
                t = self.initializers.get(x)
                if t is None:
                    continue
                elems = math.prod(t.dims)
                if elems <= 1 and n.op_type not in ("Conv", "Gemm", "MatMul"):
                    continue  # scalars folded into element-wise ops
                b += elems * (4 if (len(t.dims) == 1 and i == 2) else 1)
            out.append(b)
        return out

    @cached_property
    def ancestors(self) -> list[int]:
        """Bitset per node: the node and every node it depends on."""
        anc = [0] * len(self.graph.node)
        for i, n in enumerate(self.graph.node):
            a = 1 << i
            for x in n.input:
                p = self.producer.get(x)
                if p is not None:
                    a |= anc[p]
            anc[i] = a
        return anc

    def info(self, name: str, version: str, source: str, sha256: str) -> ModelInfo:
        # sizes from dims and types: no copy of the weights (numpy_helper.to_array of VGG16's: +553 MB)
        counts = [math.prod(t.dims) for t in self.graph.initializer]
        sizes = [n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
                 for n, t in zip(counts, self.graph.initializer)]
        return ModelInfo(
            name=name,
            version=version,
            sha256=sha256,
            source=source,
            opset=next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 0),
            inputs=tuple(TensorSpec(v.name, _dims(v.type), _dtype(v.type)) for v in self.graph.input),
            outputs=tuple(TensorSpec(v.name, _dims(v.type), _dtype(v.type)) for v in self.graph.output),
            parameter_bytes=int(sum(sizes)),
            parameter_count=int(sum(counts)),
            macs=int(sum(self.node_macs)),
            node_count=len(self.graph.node),
        )


def load(path) -> onnx.ModelProto:
    """An ``.onnx`` model edgeplan wrote (``artifacts.write_onnx``) with its external data, if any, read into it as
    written (``read_external_data``)."""
    from pathlib import Path

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    read_external_data(model, path)
    return model


def read_external_data(model: onnx.ModelProto, path) -> None:
    """Read each initializer's external data into it, leaving no ``data_location`` (as in a model written whole:
    onnx's loader marks each tensor it filled ``DEFAULT`` explicitly, which changes the bytes, so the fingerprint).
    A location must be a file name of ``path``'s directory (``artifacts.external_data``) and hold the bytes the
    tensor declares. Not onnx's loader: it refuses a data file with several hard links, and a build links a model's
    data file into its cut points, so a model.onnx past 1 GiB could not be loaded again once built."""
    from edgeplan.errors import CorruptModelError

    for t, location, offset, length in _external_spans(model, path):
        try:
            with open(path.parent / location, "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except OSError as e:
            raise CorruptModelError(f"{path}: initializer {t.name[:80]!r}: its external data could not be read "
                                    f"({e.strerror or e}).") from e
        if len(data) != length:
            raise CorruptModelError(f"{path}: initializer {t.name[:80]!r}: {len(data):,} bytes of external data in "
                                    f"{location} where its shape {list(t.dims)} declares {length:,}.")
        t.raw_data = data
        del t.external_data[:]
        t.ClearField("data_location")


def load_stored(path) -> onnx.ModelProto:
    """An ``.onnx`` model edgeplan wrote with its external data left where it is, checked as ``load`` checks it (a
    file of the model's directory holding the bytes each tensor declares): for onnxruntime to read from the file
    (``graph.evaluate``), never copied into this process."""
    from pathlib import Path

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    for _ in _external_spans(model, path):
        pass
    return model


def load_mapped(path, min_bytes: int = 1024) -> onnx.ModelProto:
    """An ``.onnx`` model edgeplan wrote, its weights left in the file: each inline initializer of ``min_bytes`` or
    more becomes an external-data reference to its own bytes inside ``path`` (location ``path``'s name, offset,
    length), found by walking the protobuf encoding; external data beside it is checked as ``load_stored`` checks
    it. Only the rest is parsed. For onnxruntime to read from the file (``graph.evaluate``'s ``folder``) and for a
    split's float stages to point at (``surgery.multidevice``); the weights are never copied into this process
    (VGG-19, 553 MB inline: ``load`` reads and parses it in 0.65 s and holds it; this, a few ms). A symbolic link
    is followed first: the references name the file it leads to, in ``weights_folder(path)`` (onnxruntime refuses
    data outside the folder it is told)."""
    import mmap
    from pathlib import Path

    from google.protobuf.message import DecodeError

    from edgeplan.graph import wire

    path = Path(path).resolve()
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            graphs = [span for span in wire.fields(data, 0, len(data)) if span.field == wire.MODEL_GRAPH]
            if len(graphs) != 1 or graphs[0].kind != wire.LEN:
                return load(path)  # not as edgeplan writes a model: parsed whole
            g = graphs[0]
            model = onnx.ModelProto.FromString(data[:g.start] + data[g.end:])
            rest, tensors = bytearray(), []
            for span in wire.fields(data, g.payload, g.end):
                if span.field != wire.GRAPH_INITIALIZER:
                    rest += data[span.start:span.end]
                    continue
                raw = [r for r in wire.fields(data, span.payload, span.end) if r.field == wire.TENSOR_RAW]
                if len(raw) != 1 or raw[0].end - raw[0].payload < min_bytes:
                    tensors.append(onnx.TensorProto.FromString(data[span.payload:span.end]))
                    continue
                r = raw[0]
                t = onnx.TensorProto.FromString(data[span.payload:r.start] + data[r.end:span.end])
                tensors.append(wire.external_stub(t, path.name, r.payload, r.end - r.payload))
    except (ValueError, IndexError, OSError, DecodeError):
        return load(path)  # empty, truncated or not protobuf: ``load`` says what is wrong with it
    graph = onnx.GraphProto.FromString(bytes(rest))
    graph.initializer.extend(tensors)
    model.graph.CopyFrom(graph)
    for _ in _external_spans(model, path):
        pass
    return model


def weights_folder(path):
    """The folder the weights of ``load_mapped(path)`` are read from: the model file's own, links followed."""
    from pathlib import Path

    return Path(path).resolve().parent


def _external_spans(model: onnx.ModelProto, path):
    """``(initializer, location, offset, length)`` of each initializer held as external data, checked: a file of
    ``path``'s directory (``artifacts.external_data``) that holds the bytes the tensor's shape declares."""
    from edgeplan.artifacts import external_data
    from edgeplan.errors import CorruptModelError
    from edgeplan.graph.wire import declared_size

    table = external_data(model)
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if t.name not in table:
            raise CorruptModelError(f"{path}: initializer {t.name[:80]!r}: its external data is not in a file of the "
                                    "model's own directory.")
        location, offset, length = table[t.name]
        try:
            size = (path.parent / location).stat().st_size
        except OSError as e:
            raise CorruptModelError(f"{path}: initializer {t.name[:80]!r}: its external data could not be read "
                                    f"({e.strerror or e}).") from e
        have = max(0, size - offset) if length < 0 else min(length, max(0, size - offset))
        want = declared_size(t)
        want = have if want is None else want
        if have != want or (length >= 0 and length != want):
            raise CorruptModelError(f"{path}: initializer {t.name[:80]!r}: {have:,} bytes of external data in "
                                    f"{location} where its shape {list(t.dims)} declares {want:,}.")
        yield t, location, offset, want


def data_in_place(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the explicit ``data_location: DEFAULT`` onnx's external-data loader leaves on each tensor it
    filled cleared (the default, left unsaid, as in a model written whole)."""
    for t in model.graph.initializer:
        if t.HasField("data_location") and t.data_location == onnx.TensorProto.DEFAULT:
            t.ClearField("data_location")
    return model


def fingerprint(model: onnx.ModelProto) -> str:
    """sha256 of ``model.SerializeToString(deterministic=True)``, hashed as it is made (``graph/wire``)."""
    from edgeplan.graph.wire import chunks

    h = hashlib.sha256()
    for c in chunks(model):
        h.update(c)
    return h.hexdigest()
