"""Both store backends against the same contract: the local directory and S3 on a real S3-protocol server
(moto's server mode on loopback, started by the fixture)."""
from __future__ import annotations

import hashlib

import pytest

from edgeplan.errors import BundleVerificationError, StoreError, StoreKeyNotFound
from edgeplan.store import LocalStore, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(f"file://{tmp_path / 'store'}")
    url = request.getfixturevalue("s3_server")
    return open_store(f"s3://edgeplan/{request.node.name.replace('[', '-').rstrip(']')}", endpoint_url=url)


def test_put_get_list_and_if_absent(store):
    assert store.put("blobs/sha256/ab", b"one", if_absent=True) is True
    assert store.put("blobs/sha256/ab", b"two", if_absent=True) is False  # If-None-Match: kept
    assert store.get("blobs/sha256/ab") == b"one"
    store.put("deployments/d/latest", b"x")
    store.put("deployments/d/latest", b"y")  # a plain put replaces
    assert store.get("deployments/d/latest") == b"y"
    assert store.list("deployments/") == ["deployments/d/latest"]
    assert store.list() == ["blobs/sha256/ab", "deployments/d/latest"]
    assert store.size("blobs/sha256/ab") == 3 and store.size("nope") is None
    assert store.read_range("blobs/sha256/ab", 1) == b"ne" and store.read_range("blobs/sha256/ab", 0, 2) == b"on"
    with pytest.raises(StoreKeyNotFound, match="nope"):
        store.get("nope")


def test_download_resumes_and_checks_sha256(store, tmp_path):
    data = bytes(range(256)) * 9000  # 2.3 MB: several ranged chunks
    digest = hashlib.sha256(data).hexdigest()
    store.put(f"blobs/sha256/{digest}", data)
    dest = tmp_path / "dl" / "blob"
    dest.parent.mkdir()
    (dest.parent / "blob.part").write_bytes(data[:1_000_000])  # an interrupted download
    moved = store.download(f"blobs/sha256/{digest}", dest, sha256=digest)
    assert dest.read_bytes() == data and moved == len(data) - 1_000_000
    assert store.download(f"blobs/sha256/{digest}", dest, sha256=digest) == 0  # already held: nothing moves
    store.put("blobs/sha256/bad", b"corrupt")
    with pytest.raises(BundleVerificationError, match="sha256"):
        store.download("blobs/sha256/bad", tmp_path / "dl" / "bad", sha256=digest)
    assert not (tmp_path / "dl" / "bad").exists() and not (tmp_path / "dl" / "bad.part").exists()


def test_keys_that_escape_the_root_are_refused(tmp_path):
    s = LocalStore(tmp_path)
    for key in ("../x", "/etc/passwd", "a//b", "a/./b", ""):
        with pytest.raises(StoreError, match="relative path"):
            s.put(key, b"x")


def test_unknown_scheme_and_a_store_that_is_down():
    with pytest.raises(StoreError, match="unknown scheme"):
        open_store("ftp://host/x")
    down = open_store("s3://edgeplan/x", endpoint_url="http://127.0.0.1:9", retries=2, timeout_s=1)
    with pytest.raises(StoreError, match=r"unreachable.*127\.0\.0\.1:9"):
        down.put("k", b"v")
