"""The artifact records of DESIGN.md "A model's artifacts": frozen dataclasses with a JSON round trip.

Every record carries ``schema_version``; a file of another version is refused with a message that
names it. Writing goes through a temporary file and a rename, so a crash never leaves half a file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from edgeplan.errors import ArtifactError

T = TypeVar("T")
PACKAGE = Path(__file__).resolve().parent


@cache
def code_digest(packages: tuple[str, ...]) -> str:
    """What an artifact was made by: the source of these edgeplan modules/packages (paths relative to the
    package, e.g. "quantize", "pipeline/stages.py"), and edgeplan's version."""
    from edgeplan import __version__

    h = hashlib.sha256(__version__.encode())
    for name in sorted(packages):
        p = PACKAGE / name
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(f"{f.relative_to(PACKAGE)}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_jsonable(v) for k, v in obj.items()}
    return obj


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` as ``write_chunks_atomic`` writes (through a temporary file in
    the same directory, none left behind when the write fails: a full disk)."""
    write_bytes_atomic(path, (json.dumps(_to_jsonable(data), indent=2, sort_keys=False) + "\n").encode())


@contextmanager
def staged_dir(out: str | os.PathLike):
    """A scratch directory beside ``out`` that replaces ``out`` when the block ends without an error; on an
    error it is removed and ``out`` is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield scratch
        scratch.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        scratch.rename(out)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    write_chunks_atomic(path, (data,))


def write_chunks_atomic(path: str | os.PathLike, chunks: Iterable[bytes]) -> str:
    """Write the concatenated ``chunks`` to ``path`` through a temporary file in the same directory; their sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
                h.update(c)
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return h.hexdigest()


EXTERNAL_DATA_BYTES = 1 << 30  # a model with more weight bytes than this is written with its weights beside it
PROTOBUF_LIMIT = (1 << 31) - 1  # no .onnx file of more bytes can be read back


def write_onnx(path: str | os.PathLike, model, external: bool | None = None,
               data_from: str | os.PathLike | None = None, fill=None) -> str:
    """Write an ONNX model and return the sha256 of ``model.SerializeToString(deterministic=True)`` (its
    fingerprint, ``graph.model.fingerprint``), hashed in pieces (``graph/wire``). A model with more than
    ``EXTERNAL_DATA_BYTES`` of weights (or ``external``) is written as ONNX external data: the weights in
    ``<name>.data`` beside it, one after another, the model pointing at them (what ``onnx.load`` reads back); every
    other model as one file. Both files through temporary files; the model's last.

    ``data_from``: an .onnx model with external data that holds some of these weights (the model a segment is cut
    from). A weight it holds under the same name, with the same bytes (compared), is not written again: its data
    file is linked beside ``path`` (a hard link where the file system allows, else a copy) and the weight points at
    it. Ten cut points of a 2.3 GB model wrote 23 GB of copies of one file and filled the disk.

    ``fill``: ``name -> TensorProto`` for the stubs of a light model (``graph.wire.light_copy``): written, and
    fingerprinted, as the model holding those tensors would be, which is never made (a cut point's prefix of VGG16
    or of a 2 GB model was a copy of its weights)."""
    from edgeplan.graph import wire

    path = Path(path)
    tensors = list(model.graph.initializer)
    if fill is not None:
        missing = [t.name for t in tensors if wire.is_stub(t) and t.name not in fill]
        if missing:
            raise ValueError(f"write_onnx: no tensor to fill the stub of {missing[0]!r}")
        tensors = [fill[t.name] if wire.is_stub(t) else t for t in tensors]
    big = [t for t in tensors if wire.raw_size(t) > 1024]
    if external is None:
        external = writes_external(big)
    if not external:
        return write_chunks_atomic(path, wire.chunks(model, tensors))
    h = hashlib.sha256()
    for c in wire.chunks(model, tensors):
        h.update(c)
    refs = _shared(big, Path(data_from), path.parent) if data_from is not None else {}
    own = [t for t in big if id(t) not in refs]
    if own:
        location, offsets = f"{path.name}.data", []
        write_chunks_atomic(path.with_name(location), _raw(own, offsets))
        refs.update({id(t): (location, *off) for t, off in zip(own, offsets)})
    light = wire.without(model, "graph")
    light.graph.CopyFrom(wire.without(model.graph, "initializer"))
    g = light.graph
    for t in tensors:
        if id(t) not in refs:
            g.initializer.append(t)
            continue
        g.initializer.append(wire.external_stub(t, *refs[id(t)]))
    write_bytes_atomic(path, light.SerializeToString())
    return h.hexdigest()


def writes_external(tensors) -> bool:
    """Whether ``write_onnx`` (left to choose) writes a model of these initializers with external data."""
    from edgeplan.graph import wire

    return sum(size for t in tensors if (size := wire.raw_size(t)) > 1024) > EXTERNAL_DATA_BYTES


def _shared(tensors, source: Path, dest: Path) -> dict[int, tuple[str, int, int]]:
    """``id(tensor) -> (location, offset, length)`` for the ``tensors`` that ``source``'s external data holds with
    the same name and bytes, that data file linked into ``dest`` (``write_onnx``'s ``data_from``)."""
    import onnx

    table = external_data(onnx.load(str(source), load_external_data=False))
    out: dict[int, tuple[str, int, int]] = {}
    linked: set[str] = set()
    for t in tensors:
        loc, offset, length = table.get(t.name, ("", 0, -1))
        if not loc:
            continue
        data = t.raw_data
        if length != len(data) or not _same_bytes(source.parent / loc, offset, data):
            continue
        if loc not in linked:
            link_or_copy(source.parent / loc, dest / loc)
            linked.add(loc)
        out[id(t)] = (loc, offset, length)
    return out


def external_data(model) -> dict[str, tuple[str, int, int]]:
    """``name -> (location, offset, length)`` of ``model``'s initializers held as external data in a file of its
    own directory (a bare file name: not ``.``, ``..``, nor with a path separator); others, and locations that do
    not parse, left out (``length`` -1 when not given)."""
    import onnx

    table = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        ext = {e.key: e.value for e in t.external_data}
        loc = ext.get("location", "")
        if not loc or Path(loc).name != loc or "\\" in loc or loc in (".", ".."):
            continue
        try:
            table[t.name] = (loc, int(ext.get("offset", 0)), int(ext.get("length", -1)))
        except ValueError:
            continue
    return table


def external_files(path: Path) -> list[Path]:
    """The external data files an .onnx model names that exist in its directory (read without its data; a file
    that is not a model, or names outside the directory, are left for ingest to refuse)."""
    import onnx

    if path.suffix != ".onnx":
        return []
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 (not a model: ingest says so)
        return []
    files = [path.parent / n for n in sorted({loc for loc, _, _ in external_data(model).values()})]
    return [f for f in files if f.is_file()]


def _same_bytes(path: Path, offset: int, data: bytes, chunk: int = 1 << 24) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            view = memoryview(data)
            for at in range(0, len(view), chunk):
                if f.read(min(chunk, len(view) - at)) != view[at:at + chunk]:
                    return False
    except OSError:
        return False
    return True


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` the same file as ``src``: a hard link where the file system allows, else a copy (atomic)."""
    if dst.exists() and os.path.samefile(src, dst):
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    os.close(fd)
    os.unlink(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _raw(tensors, offsets: list) -> Iterable[bytes]:
    """The raw data of ``tensors`` one after another, each at an offset aligned to 4 KiB; ``offsets`` gets
    (offset, length) per tensor."""
    at = 0
    for t in tensors:
        pad = -at % 4096
        if pad:
            yield bytes(pad)
            at += pad
        data = t.raw_data
        offsets.append((at, len(data)))
        yield data
        at += len(data)


class _Record:
    """Mixin: ``to_json``/``from_json``/``save``/``load`` for a frozen dataclass with ``SCHEMA_VERSION``."""

    SCHEMA_VERSION = 1

    def to_json(self) -> dict:
        return _to_jsonable(self)

    @classmethod
    def from_json(cls: type[T], data: dict, *, source: str = "<dict>") -> T:
        version = data.get("schema_version")
        if version != cls.SCHEMA_VERSION:  # type: ignore[attr-defined]
            raise ArtifactError(
                f"{source}: {cls.__name__} schema_version {version!r}, this edgeplan reads "
                f"{cls.SCHEMA_VERSION} only; rebuild the artifact with this version."  # type: ignore[attr-defined]
            )
        return _from_jsonable(cls, data)

    def save(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self)

    @classmethod
    def load(cls: type[T], path: str | os.PathLike) -> T:
        path = Path(path)
        if not path.is_file():
            raise ArtifactError(f"{path}: missing; run the stage that writes it first.")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ArtifactError(f"{path}: not valid JSON ({e}).") from e
        return cls.from_json(data, source=str(path))  # type: ignore[attr-defined]


def _from_jsonable(cls: type, data: Any) -> Any:
    if not dataclasses.is_dataclass(cls):
        return data
    if not isinstance(data, dict):
        raise TypeError(f"a JSON {type(data).__name__} where a {cls.__name__} object belongs")
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__} lacks field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    kwargs = {}
    for name in (f.name for f in fields):
        if name not in data:
            continue
        value = data[name]
        sub = _FIELD_TYPES.get((cls.__name__, name))
        if sub is not None and value is not None:
            if isinstance(value, list):
                value = tuple(_from_jsonable(sub, v) for v in value)
            else:
                value = _from_jsonable(sub, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModelInfo(_Record):
    """``model.json``: the canonical ONNX model's fingerprint and sizes."""

    name: str
    version: str
    sha256: str
    source: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameter_bytes: int
    parameter_count: int
    macs: int
    node_count: int
    schema_version: int = 1


@dataclass(frozen=True)
class Point:
    """One partition point: the prefix [0..point] goes to the TPU, the suffix to the CPU (SwapLess §IV)."""

    index: int
    tensor: str
    tflite_tensor: str | None
    prefix_param_bytes: int
    prefix_macs: int
    boundary_bytes: int
    shape: tuple[int, ...] = ()
    onnx_node: str | None = None


@dataclass(frozen=True)
class DroppedPoint:
    tensor: str
    reason: str


@dataclass(frozen=True)
class Analysis(_Record):
    """``analysis.json``: the candidate partition points, in topological order (point 0 all-CPU, P all-TPU)."""

    model_sha256: str
    points: tuple[Point, ...]
    dropped: tuple[DroppedPoint, ...] = ()
    max_points: int | None = None
    complete: bool = False  # True once the compile stage matched every point to the int8 model
    onnx_candidates: int = 0
    note: str = ""
    schema_version: int = 1

    @property
    def last(self) -> int:
        return len(self.points) - 1


@dataclass(frozen=True)
class OperatorRow:
    """One row of the compiler's ``Operator  Count  Status`` table."""

    op: str
    count: int
    status: str


@dataclass(frozen=True)
class CompileReport(_Record):
    """``compile.json``: what the Edge TPU compiler (real or emulated) made of one prefix."""

    compiler: str  # "edgetpu_compiler" or "emulated"
    compiler_version: str
    model: str
    onchip_param_bytes: int
    offchip_param_bytes: int
    onchip_remaining_bytes: int
    subgraph_count: int
    total_ops: int
    tpu_ops: int
    cpu_ops: int
    operators: tuple[OperatorRow, ...]
    first_unmapped: dict | None = None  # {"op", "index", "reason"}: the op that ends the TPU part
    cocompiled_with: tuple[str, ...] = ()
    log: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class PointCheck:
    point: int
    float_max_abs_diff: float | None
    float_tolerance: float | None
    float_ok: bool
    int8_identical_fraction: float
    int8_ok: bool
    int8_float_cosine: float
    cosine_ok: bool
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.float_ok and self.int8_ok and self.cosine_ok and self.error is None


@dataclass(frozen=True)
class VerifyReport(_Record):
    """``verify.json``: the checks of DESIGN.md at every point."""

    model_sha256: str
    samples: int
    min_cosine: float
    input_dependence: float
    input_dependence_ok: bool
    points: tuple[PointCheck, ...]
    ok: bool
    schema_version: int = 1


@dataclass(frozen=True)
class AccuracyPoint:
    point: int
    top1: float  # the int8 chain at this point (Edge TPU prefix run as its int8 model), on the evaluation set
    drop: float  # float top-1 minus this, a fraction
    publishable: bool


@dataclass(frozen=True)
class AccuracyReport(_Record):
    """``accuracy.json``: the accuracy gate (params.yaml ``accuracy``). Top-1 of the float model and of the int8
    chain at every point on a labelled evaluation set; a point whose drop exceeds ``max_top1_drop`` is not
    publishable (the planner never chooses it, the runtime never switches to it), and a model with no
    publishable point is not published."""

    model_sha256: str
    dataset: str
    dataset_sha256: str
    samples: int
    max_top1_drop: float
    float_top1: float
    points: tuple[AccuracyPoint, ...]
    kernels: str  # the int8 kernels the chains ran on (the device's: XNNPACK)
    schema_version: int = 1

    @property
    def excluded(self) -> tuple[int, ...]:
        return tuple(p.point for p in self.points if not p.publishable)

    @property
    def ok(self) -> bool:
        return any(p.publishable for p in self.points)


@dataclass(frozen=True)
class StreamLayer:
    """One layer of ``stream/``: its one-layer segment (cut from ``model_split.tflite``) and its boundary."""

    index: int
    name: str
    op: str
    op_class: str  # FlashMem Table 5
    weight_bytes: int
    first_op: int
    last_op: int
    file: str  # relative to the artifact directory
    sha256: str
    size: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class StreamInfo(_Record):
    """``stream/stream.json``: the int8 model as streaming layers (FlashMem §4.3), checked identical."""

    model_int8_sha256: str
    split_file: str
    split_sha256: str
    max_segment_bytes: int
    split_ops: tuple[str, ...]  # weights split along output channels (name: parts)
    layers: tuple[StreamLayer, ...]
    identical: dict  # kernels -> the one-layer chain equals the int8 model on every sample
    samples: int
    schema_version: int = 1

    @property
    def ok(self) -> bool:
        return bool(self.identical) and all(self.identical.values())


_FIELD_TYPES: dict[tuple[str, str], type] = {
    ("ModelInfo", "inputs"): TensorSpec,
    ("ModelInfo", "outputs"): TensorSpec,
    ("Analysis", "points"): Point,
    ("Analysis", "dropped"): DroppedPoint,
    ("CompileReport", "operators"): OperatorRow,
    ("VerifyReport", "points"): PointCheck,
    ("AccuracyReport", "points"): AccuracyPoint,
    ("StreamInfo", "layers"): StreamLayer,
}

__all__ = [
    "AccuracyPoint",
    "AccuracyReport",
    "Analysis",
    "CompileReport",
    "DroppedPoint",
    "ModelInfo",
    "OperatorRow",
    "Point",
    "PointCheck",
    "StreamInfo",
    "StreamLayer",
    "TensorSpec",
    "VerifyReport",
    "code_digest",
    "link_or_copy",
    "write_bytes_atomic",
    "write_chunks_atomic",
    "write_json_atomic",
    "write_onnx",
]
