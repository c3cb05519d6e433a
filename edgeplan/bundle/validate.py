"""What a device accepts from a store, checked before anything is written: field types, names that become
paths, sizes that become allocations (standard library only).

A signature proves who wrote a record, not that the writer was careful: a signed manifest whose blob name
climbs out of the revision directory, whose size is 10^18 or whose revision is a string is refused here,
with one line naming the record and the field.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types as _pytypes
import typing

from edgeplan.errors import BundleVerificationError

# one path component: no separators, no leading dot (no ".", "..", hidden or temporary names), a bounded length
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
MAX_NAME_CHARS = 1024
MAX_DEPTH = 16
MAX_BLOB_BYTES = 1 << 36  # 64 GiB: larger than any segment; a bigger claim is an attack or a bug
MAX_BLOBS = 100_000
MAX_POINTS = 4096
MAX_TENSOR_ELEMENTS = 1 << 28
REVISION_MAX = 1 << 53
PLANNERS = ("swapless", "flashmem", "parallax", "autodice", "spatial")  # DESIGN.md "Plans"
RESERVED = frozenset({"manifest.json", "latest"})  # written beside the blobs in a revision directory
DTYPES = frozenset({"int8", "uint8", "int16", "int32", "float16", "float32"})


def _fail(where: str, what: str) -> typing.NoReturn:
    raise BundleVerificationError(f"{where}: {what}; refused (nothing was written)")


def component(value, where: str, field: str) -> str:
    """A name used as one path component (deployment, model name, version)."""
    if not isinstance(value, str) or not _COMPONENT.match(value):
        _fail(where, f"{field} {_show(value)} is not a plain name (letters, digits, '._+-', not starting with '.', "
                     "at most 128 characters)")
    return value


def relpath(value, where: str, field: str) -> str:
    """A blob name: a relative path of plain components joined by '/'."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        _fail(where, f"{field} {_show(value)} is not a name of 1..{MAX_NAME_CHARS} characters")
    parts = value.split("/")
    if len(parts) > MAX_DEPTH or not all(_COMPONENT.match(p) for p in parts):
        _fail(where, f"{field} {_show(value)} is not a relative path of plain names (no '..', no absolute path, "
                     f"no empty or hidden component, at most {MAX_DEPTH} deep)")
    return value


def sha256_hex(value, where: str, field: str) -> str:
    if not isinstance(value, str) or not _SHA256.match(value):
        _fail(where, f"{field} {_show(value)} is not a lowercase hex sha256")
    return value


def integer(value, where: str, field: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        _fail(where, f"{field} {_show(value)} is not an integer in [{lo}, {hi}]")
    return value


def check_types(record, where: str) -> None:
    """Every field of a (nested) frozen dataclass has its annotated type: str, int (not bool), float (int
    accepted, finite), bool, tuple[X, ...] of those or of dataclasses. What JSON decoding let through
    (a list where a string belongs, a dict where an int does) stops here."""
    hints = typing.get_type_hints(type(record))
    for f in dataclasses.fields(record):
        _check(getattr(record, f.name), hints[f.name], where, f"{type(record).__name__}.{f.name}")


def _check(value, hint, where: str, field: str) -> None:
    origin = typing.get_origin(hint)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, tuple):
            _fail(where, f"{field} is {type(value).__name__}, not a list")
        for k, v in enumerate(value):
            _check(v, item, where, f"{field}[{k}]")
    elif origin in (typing.Union, _pytypes.UnionType):
        if not any(_ok(value, h) for h in typing.get_args(hint)):
            _fail(where, f"{field} {_show(value)} has the wrong type")
    elif dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            _fail(where, f"{field} is {type(value).__name__}, not an object")
        check_types(value, where)
    elif not _ok(value, hint):
        _fail(where, f"{field} {_show(value)} is not {getattr(hint, '__name__', hint)}")


def _ok(value, hint) -> bool:
    if hint is type(None):
        return value is None
    if hint is bool:
        return type(value) is bool
    if hint is int:
        return type(value) is int
    if hint is float:
        return type(value) in (int, float) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def latest(record, where: str, deployment: str) -> None:
    check_types(record, where)
    if record.deployment != deployment:
        _fail(where, f"names deployment {_show(record.deployment)}, not {deployment!r}")
    integer(record.revision, where, "revision", 1, REVISION_MAX)
    sha256_hex(record.manifest_sha256, where, "manifest_sha256")


def device(doc, where: str) -> dict:
    """``devices/<id>.json`` after its signature: the names a device turns into paths and keys."""
    if not isinstance(doc, dict):
        _fail(where, "not a JSON object")
    for field in ("device_id", "deployment", "device_class"):
        if field not in doc:
            _fail(where, f"no {field}")
        component(doc[field], where, field)
    return doc


def manifest(m, where: str, deployment: str | None = None, revision: int | None = None) -> None:
    """Everything a device reads from a manifest before it writes a byte: types; the deployment and revision
    it was reached by; blob names as safe relative paths, unique, none a directory of another, none reserved;
    sizes and hashes; every name a model, its segments (int8 and, where an Edge TPU runs the prefix, its Edge
    TPU prefix), the plan, profile and self-tests refer to is a blob."""
    check_types(m, where)
    component(m.deployment, where, "deployment")
    if deployment is not None and m.deployment != deployment:
        _fail(where, f"is a manifest of {_show(m.deployment)}, not {deployment!r}")
    integer(m.revision, where, "revision", 1, REVISION_MAX)
    if revision is not None and m.revision != revision:
        _fail(where, f"says revision {m.revision}; `latest` names {revision}")
    component(m.device_class, where, "device_class")
    if not m.blobs or len(m.blobs) > MAX_BLOBS:
        _fail(where, f"lists {len(m.blobs)} blobs (1..{MAX_BLOBS})")
    names: set[str] = set()
    dirs: set[str] = set()
    sizes: dict[str, int] = {}
    for k, b in enumerate(m.blobs):
        relpath(b.name, where, f"blobs[{k}].name")
        if b.name in RESERVED:
            _fail(where, f"blobs[{k}].name {b.name!r} is reserved for the revision's own files")
        if b.name in names:
            _fail(where, f"blobs[{k}].name {b.name!r} is listed twice")
        names.add(b.name)
        parts = b.name.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        integer(b.size, where, f"blobs[{k}].size", 0, MAX_BLOB_BYTES)
        sha256_hex(b.sha256, where, f"blobs[{k}].sha256")
        if sizes.setdefault(b.sha256, b.size) != b.size:
            _fail(where, f"blobs[{k}] ({b.name!r}) has the content of another blob but not its size")
    clash = names & dirs
    if clash:
        _fail(where, f"blob {sorted(clash)[0]!r} is both a file and a directory of other blobs")
    _named(m.plan, names, where, "plan")
    for planner, name in m.plans.items():
        if planner not in PLANNERS:
            _fail(where, f"plans names an unknown planner {_show(planner)} (known: {', '.join(PLANNERS)})")
        _named(name, names, where, f"plans[{planner}]")
    seen = set()
    for k, e in enumerate(m.models):
        at = f"models[{k}]"
        component(e.name, where, f"{at}.name")
        component(e.version, where, f"{at}.version")
        if e.name in seen:
            _fail(where, f"{at}.name {e.name!r} is listed twice")
        seen.add(e.name)
        integer(e.points, where, f"{at}.points", 1, MAX_POINTS)
        for j, p in enumerate(e.excluded_points):
            integer(p, where, f"{at}.excluded_points[{j}]", 1, e.points)
        sha256_hex(e.model_sha256, where, f"{at}.model_sha256")
        _named(e.profile, names, where, f"{at}.profile")
        if not e.selftests:
            _fail(where, f"{at} has no self-tests (a device checks every revision before it runs it)")
        for j, t in enumerate(e.selftests):
            _named(t.input, names, where, f"{at}.selftests[{j}].input")
            _named(t.expected, names, where, f"{at}.selftests[{j}].expected")
        for side in ("input", "output"):
            _quantization(getattr(e, side), where, f"{at}.{side}")
        base = f"models/{e.name}/{e.version}/segments"
        for p in m.points_carried(e):
            for role, needed in (("prefix_int8.tflite", p > 0), ("prefix_edgetpu.tflite", p > 0),
                                 ("suffix_int8.tflite", p < e.points)):
                if needed:
                    _named(f"{base}/p{p}/{role}", names, where, f"{at} point {p}'s {role.split('.')[0]}")
    if not m.models:
        _fail(where, "lists no model")


def _named(name, names: set[str], where: str, field: str) -> None:
    if name not in names:
        _fail(where, f"{field} {_show(name)} is not one of its blobs")


def _quantization(q, where: str, field: str) -> None:
    for attr in ("float_shape", "shape"):
        shape = getattr(q, attr)
        if not 1 <= len(shape) <= 8:
            _fail(where, f"{field}.{attr} has {len(shape)} dimensions (1..8)")
        for d in shape:
            integer(d, where, f"{field}.{attr}", 1, MAX_TENSOR_ELEMENTS)
        if math.prod(shape) > MAX_TENSOR_ELEMENTS:
            _fail(where, f"{field}.{attr} {shape} has more than {MAX_TENSOR_ELEMENTS} elements")
    if math.prod(q.float_shape) != math.prod(q.shape):
        _fail(where, f"{field}: float shape {q.float_shape} and int8 shape {q.shape} differ in size")
    if q.dtype not in DTYPES:
        _fail(where, f"{field}.dtype {_show(q.dtype)} is not one of {', '.join(sorted(DTYPES))}")
    if not q.scale > 0:
        _fail(where, f"{field}.scale {q.scale!r} is not positive")
    integer(q.zero_point, where, f"{field}.zero_point", -(1 << 31), (1 << 31) - 1)
    if q.to_int8_layout and sorted(q.to_int8_layout) != list(range(len(q.float_shape))):
        _fail(where, f"{field}.to_int8_layout {q.to_int8_layout} is not a permutation of the float shape's axes")


def plan_record(rev_dir, manifest, planner: str, record_cls):
    """A revision's plan of ``planner`` parsed as ``record_cls`` with its field types checked, and where it is
    (for errors); None when the revision has none. The plan is signed with the manifest; what it names is
    still the caller's to validate."""
    import json
    from pathlib import Path

    name = manifest.plans.get(planner)
    if name is None:
        return None
    where = f"{manifest.deployment} revision {manifest.revision} {name}"
    try:
        record = record_cls.from_json(json.loads((Path(rev_dir) / name).read_text()), source=where)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise BundleVerificationError(f"{where}: not a {planner} plan ({e})") from None
    check_types(record, where)
    return record, where
