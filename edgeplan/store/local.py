"""A store in a local directory (the embedded default: no server)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgeplan.errors import StoreError, StoreKeyNotFound
from edgeplan.store.base import Store, check_key


class LocalStore(Store):
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreKeyNotFound(f"{self.uri}: no object {key!r}") from None
        except OSError as e:
            raise StoreError(f"{self.uri}: cannot read {key!r}: {e}") from e

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if if_absent:  # a hard link fails when the name exists: create-if-absent, atomically
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        return False
                    return True
                os.replace(tmp, path)
                return True
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as e:
            raise StoreError(f"{self.uri}: cannot write {key!r}: {e}") from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        base = self.root / prefix if prefix else self.root
        start = base if base.is_dir() else base.parent
        if not start.is_dir() or not start.is_relative_to(self.root):
            return []
        keys = []
        for p in start.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def read_range(self, key: str, start: int, end: int | None = None) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            raise StoreKeyNotFound(f"{self.uri}: no object {key!r}") from None
