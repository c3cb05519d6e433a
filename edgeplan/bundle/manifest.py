"""The signed manifest of a deployment revision and the ``latest`` pointer (standard library + keys).

A manifest lists every blob of the revision (name, media type, size, sha256) for every model of the
deployment, the plan, the profiles, self-test inputs with expected outputs and the input/output
quantization; its signature (ed25519) covers the canonical JSON (sorted keys, no whitespace) of the
manifest without its ``signature`` field. ``latest`` = {revision, manifest_sha256}, signed the same way.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from edgeplan.artifacts import _FIELD_TYPES, _Record
from edgeplan.bundle import keys
from edgeplan.bundle.validate import check_types
from edgeplan.errors import BundleVerificationError

MEDIA = {
    ".tflite": "application/vnd.tflite",
    ".json": "application/json",
    ".npy": "application/x-npy",
    ".onnx": "application/vnd.onnx",
}


def canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def blob_key(sha256: str) -> str:
    return f"blobs/sha256/{sha256}"


def manifest_key(deployment: str, revision: int) -> str:
    return f"deployments/{deployment}/{revision}/manifest.json"


def latest_key(deployment: str) -> str:
    return f"deployments/{deployment}/latest"


class _Signed:
    """A record with ``key_id`` and ``signature`` fields, signed over the canonical JSON of the rest."""

    KIND = "record"

    def payload(self) -> bytes:
        data = self.to_json()
        data.pop("signature")
        return canonical(data)

    def signed(self, key: keys.SigningKey):
        unsigned = replace(self, key_id=key.key_id, signature="")
        return replace(unsigned, signature=key.sign(unsigned.payload()))

    def encoded(self) -> bytes:
        """The bytes stored (canonical JSON, signature included)."""
        return canonical(self.to_json())

    @classmethod
    def parse(cls, data: bytes, trusted, where: str):
        """Decode and verify a stored record against trusted public keys (by key id)."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__}, not an object")
            record = cls.from_json(doc, source=where)
        except (ValueError, TypeError, AttributeError, RecursionError) as e:
            raise BundleVerificationError(f"{where}: not a {cls.KIND} ({_short(e)})") from None
        check_types(record, where)  # before the signature check reads key_id and signature
        keys.verify(trusted, record.key_id, record.payload(), record.signature, where)
        return record


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class BlobRef:
    name: str  # the path inside the bundle, e.g. models/mobilenetv2/1/segments/p3/prefix_edgetpu.tflite
    media_type: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Quantization:
    """How the runtime turns a float tensor into the int8 model's and back: q = round(x / scale) + zero_point,
    after transposing the float layout (NCHW, as the ONNX model takes it) to the int8 model's (NHWC)."""

    float_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    scale: float
    zero_point: int
    to_int8_layout: tuple[int, ...]  # axes permutation from float_shape to shape (empty: none)


@dataclass(frozen=True)
class SelfTest:
    input: str  # blob name: float input (.npy, float layout)
    expected: str  # blob name: the whole int8 model's int8 output on it (.npy)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    version: str
    model_sha256: str  # the canonical ONNX model's fingerprint
    points: int  # P: partition points 0..P
    input: Quantization
    output: Quantization
    selftests: tuple[SelfTest, ...]
    profile: str  # blob name of profiles/<device class>.json
    excluded_points: tuple[int, ...] = ()  # points the accuracy gate refused: never switched to


@dataclass(frozen=True)
class Manifest(_Signed, _Record):
    KIND = "manifest"

    deployment: str
    revision: int
    device_class: str
    accelerator: str  # the device class's accelerator kind (a real edgetpu-usb refuses emulated prefixes)
    compiler: str  # "edgetpu_compiler" or "emulated": what made the prefixes
    code_version: str
    created: str
    content_sha256: str  # over blobs and models: equal content, equal digest (no new revision)
    key_id: str
    models: tuple[ModelEntry, ...]
    plan: str  # blob name of the SwapLess plan
    blobs: tuple[BlobRef, ...]
    signature: str = ""
    plans: dict = field(default_factory=dict)  # planner -> blob name of its plan (schema 2)
    schema_version: int = 2

    SCHEMA_VERSION = 2  # schema 1 (no ``plans`` map, nor in what its signature covers) is still read

    @classmethod
    def from_json(cls, data: dict, *, source: str = "<dict>"):
        if data.get("schema_version") == 1 and "plans" not in data:
            return replace(super().from_json({**data, "schema_version": 2}, source=source), schema_version=1)
        return super().from_json(data, source=source)

    def to_json(self) -> dict:
        """A schema-1 manifest has no ``plans`` field: neither in its bytes nor in what its signature covers."""
        data = super().to_json()
        if self.schema_version == 1:
            data.pop("plans")
        return data

    def points_carried(self, entry: ModelEntry) -> range:
        """The points whose segments the revision carries: every one for a class with an Edge TPU; only point 0
        (the whole model on the CPU) for a class without one, whose planner and runtime never choose another."""
        return carried_points(entry.points, self.accelerator)

    def blob(self, name: str) -> BlobRef:
        for b in self.blobs:
            if b.name == name:
                return b
        raise BundleVerificationError(f"manifest of {self.deployment} revision {self.revision}: no blob {name!r}")


@dataclass(frozen=True)
class Latest(_Signed, _Record):
    KIND = "latest pointer"

    deployment: str
    revision: int
    manifest_sha256: str
    key_id: str = ""
    signature: str = ""
    schema_version: int = 1


def carried_points(last: int, accelerator: str) -> range:
    """Points 0..``last`` whose segments a revision for a class with accelerator kind ``accelerator`` carries
    (``Manifest.points_carried``)."""
    return range(last + 1) if accelerator.startswith("edgetpu") else range(1)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_digest(models, blobs, plan: str, plans: dict | None = None) -> str:
    """What a revision serves, independent of its number, time and key: equal digests need no new revision."""
    doc = {"models": [_plain(m) for m in models], "blobs": sorted((b.name, b.sha256) for b in blobs), "plan": plan}
    if plans:
        doc["plans"] = dict(sorted(plans.items()))
    return sha256(canonical(doc))


def _plain(obj):
    from edgeplan.artifacts import _to_jsonable

    return _to_jsonable(obj)


_FIELD_TYPES.update({
    ("Manifest", "models"): ModelEntry,
    ("Manifest", "blobs"): BlobRef,
    ("ModelEntry", "input"): Quantization,
    ("ModelEntry", "output"): Quantization,
    ("ModelEntry", "selftests"): SelfTest,
})
