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


def test_s3_download_is_one_get_and_a_cut_stream_resumes(s3_server, tmp_path):
    """S3 blobs come in one ranged GET each, read in pieces (not a GET per MB); a connection cut part-way through
    the body is a StoreError that keeps what arrived, and the next download fetches only the rest."""
    import socket
    import threading
    from urllib.parse import urlparse

    up = urlparse(s3_server)
    cut = {"after": 1_500_000, "done": False}

    def relay(src, dst, limit=None):
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and not cut["done"] and sent + len(data) > limit:
                    cut["done"] = True  # one response cut short, the first to run past the limit
                    dst.sendall(data[:limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(lsock):
        while True:
            try:
                client, _ = lsock.accept()
            except OSError:
                return
            server = socket.create_connection((up.hostname, up.port))
            threading.Thread(target=relay, args=(client, server), daemon=True).start()
            threading.Thread(target=relay, args=(server, client, cut["after"]), daemon=True).start()

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    threading.Thread(target=serve, args=(lsock,), daemon=True).start()
    try:
        data = bytes(range(256)) * 9000  # 2.3 MB: three CHUNKs
        digest = hashlib.sha256(data).hexdigest()
        key = f"blobs/sha256/{digest}"
        open_store("s3://edgeplan/cut", endpoint_url=s3_server).put(key, data)
        store = open_store("s3://edgeplan/cut", endpoint_url=f"http://127.0.0.1:{lsock.getsockname()[1]}",
                           retries=1)
        gets = []
        store.client.meta.events.register("before-call.s3.GetObject", lambda **kw: gets.append(1))
        dest = tmp_path / "blob"
        with pytest.raises(StoreError, match="read failed"):
            store.download(key, dest, sha256=digest)
        part = tmp_path / "blob.part"
        kept = part.stat().st_size
        assert 0 < kept < len(data) and part.read_bytes() == data[:kept] and not dest.exists()
        gets.clear()
        assert store.download(key, dest, sha256=digest) == len(data) - kept
        assert dest.read_bytes() == data and len(gets) == 1
    finally:
        lsock.close()
