"""What every store backend offers."""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20


class Store(ABC):
    """Keys are '/'-separated relative paths (``blobs/sha256/<hex>``, ``deployments/<name>/latest``)."""

    uri: str

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; StoreKeyNotFound when absent, StoreError when the store fails."""

    @abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write ``data`` at ``key``. With ``if_absent`` (If-None-Match: *) an existing object is kept and
        False is returned; otherwise True."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes, None when absent."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, sorted."""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object (to its end when ``end`` is None)."""

    def read_from(self, key: str, start: int, total: int) -> Iterator[bytes]:
        """Bytes [start, total) of the object, in pieces of at most CHUNK (one ``read_range`` each here; a
        backend that streams one response overrides it)."""
        while start < total:
            chunk = self.read_range(key, start, min(total, start + CHUNK))
            if not chunk:
                return
            yield chunk
            start += len(chunk)

    def put_file(self, key: str, path: Path, *, if_absent: bool = False) -> bool:
        return self.put(key, Path(path).read_bytes(), if_absent=if_absent)

    def download(self, key: str, dest: Path, *, sha256: str | None = None, size: int | None = None,
                 progress=None) -> int:
        """Fetch ``key`` into ``dest``, resuming a partial ``dest.part`` left by an interrupted download;
        with ``sha256`` the result is checked before it is moved into place; with ``size`` an object of
        another size is refused before a byte is fetched (and a held ``dest`` of another size too). Returns
        the bytes transferred now (0 when ``dest`` already holds the object)."""
        from edgeplan.errors import BundleVerificationError

        dest = Path(dest)
        if dest.is_file() and (sha256 is None or file_sha256(dest) == sha256):
            if size is not None and dest.stat().st_size != size:
                raise BundleVerificationError(f"{self.uri}/{key}: the manifest says {size} bytes; its content (sha256 "
                                              f"{sha256}) has {dest.stat().st_size}; refused")
            return 0
        total = self.size(key)
        if total is None:
            from edgeplan.errors import StoreKeyNotFound

            raise StoreKeyNotFound(f"{self.uri}: no object {key!r}")
        if size is not None and total != size:
            raise BundleVerificationError(f"{self.uri}/{key}: {total} bytes in the store; the manifest says {size}; "
                                          "refused before fetching")
        part = dest.with_name(dest.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.is_file() else 0
        if have > total:  # not a prefix of this object
            part.unlink()
            have = 0
        moved = 0
        h = hashlib.sha256()  # hashed as it arrives (what a resumed download kept, first): read once, not twice
        if have:
            _hash_file(h, part)
        with open(part, "ab") as f:
            for chunk in self.read_from(key, have, total):
                f.write(chunk)
                h.update(chunk)
                have += len(chunk)
                moved += len(chunk)
                if progress:
                    progress(len(chunk))
        if sha256 is not None and h.hexdigest() != sha256:
            part.unlink()
            raise BundleVerificationError(f"{self.uri}/{key}: sha256 does not match the manifest; the download "
                                          "was discarded (the blob in the store is corrupt or was replaced)")
        part.replace(dest)
        return moved


def _hash_file(h, path: Path):
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h


def file_sha256(path: Path) -> str:
    return _hash_file(hashlib.sha256(), path).hexdigest()


def check_key(key: str) -> str:
    """Refuse keys that could escape the root or are not plain relative paths."""
    from edgeplan.errors import StoreError

    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in key:
        raise StoreError(f"store key {key!r}: not a plain relative path")
    return key
