"""`edgeplan submit`'s upload: the canonical ONNX under models/<name>/<version>/, idempotent, conflicts refused;
fetched back by the deployment's flow."""
from __future__ import annotations

import pytest

from edgeplan.errors import ModelVersionConflictError, StoreKeyNotFound
from edgeplan.store import open_store
from edgeplan.submit import fetch, upload


def test_upload_is_idempotent_and_refuses_another_model(tmp_path):
    store = open_store(tmp_path / "store")
    key, digest, new = upload(store, "zoo:tiny_cnn", "tiny", "1")
    assert key == "models/tiny/1/model.onnx" and new
    assert upload(store, "zoo:tiny_cnn", "tiny", "1") == (key, digest, False)
    with pytest.raises(ModelVersionConflictError, match="another model"):
        upload(store, "zoo:tiny_cnn_lrn", "tiny", "1")
    path = fetch(store, "tiny", "1", tmp_path / "got")
    assert path.read_bytes() == store.get(key)
    with pytest.raises(StoreKeyNotFound, match="submit"):
        fetch(store, "tiny", "2", tmp_path / "got")
