"""``edgeplan submit``: a model version into the store (``models/<name>/<version>/model.onnx``, the canonical
ONNX) and the ``edgeplan.model.submitted`` event that triggers the ``compile-on-new-version`` deployment."""
from __future__ import annotations

import hashlib
from pathlib import Path

from edgeplan.errors import ModelVersionConflictError, StoreKeyNotFound

EVENT = "edgeplan.model.submitted"


def model_key(name: str, version: str) -> str:
    return f"models/{name}/{version}/model.onnx"


def upload(store, source: str, name: str, version: str, input_shape=None, max_bytes: int | None = None) -> tuple[str, str, bool]:
    """Canonicalise ``source`` (any supported model, or zoo:NAME) and put it at ``model_key``; the same
    model again is a no-op, another one under the same name and version is refused. (key, sha256, new)."""
    from edgeplan.pipeline import stages
    from edgeplan.scratch import scratch

    with scratch("submit") as tmp:
        d = stages.ingest(source, name, version, tmp, input_shape, max_bytes)
        data = (d / "model.onnx").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = model_key(name, version)
    if store.put(key, data, if_absent=True):
        return key, digest, True
    held = hashlib.sha256(store.get(key)).hexdigest()
    if held != digest:
        raise ModelVersionConflictError(f"{store.uri}/{key}: {name} version {version} is another model "
                                        f"(sha256 {held[:12]}..., this one {digest[:12]}...); submit it as a new version")
    return key, digest, False


def fetch(store, name: str, version: str, dest: Path) -> Path:
    """The submitted model of ``name`` ``version`` from the store into ``dest`` (a directory)."""
    key = model_key(name, version)
    if not store.exists(key):
        raise StoreKeyNotFound(f"{store.uri}: no submitted model {key!r}; `edgeplan submit` it first")
    path = Path(dest) / name / version / "model.onnx"
    store.download(key, path)
    return path


def emit(name: str, version: str, store_uri: str, key: str, sha256: str):
    from prefect.events import emit_event

    return emit_event(EVENT, resource={"prefect.resource.id": f"edgeplan.model.{name}.{version}",
                                       "edgeplan.model": name, "edgeplan.version": version},
                      payload={"name": name, "version": version, "store": store_uri, "key": key, "sha256": sha256})
