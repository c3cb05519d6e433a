"""The store layer's fault hook for the reliability harness (``bench/reliability.py``; ``open_store`` wraps a
store in ``KillAt`` when ``EDGEPLAN_STORE_KILL_AT`` is set): the process SIGKILLs itself just before its Nth
store call, counted over every store it opens, so that a trial can stop a publish or a pull at each of its
call boundaries in turn. Standard library only."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

from edgeplan.store.base import Store

_CALLS = [0]  # store calls made by this process so far


class KillAt(Store):
    """``store`` with every call counted; SIGKILL just before call number ``at``."""

    def __init__(self, store: Store, at: int):
        self.inner, self.at, self.uri = store, at, store.uri

    def _call(self) -> None:
        _CALLS[0] += 1
        if _CALLS[0] == self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def get(self, key: str) -> bytes:
        self._call()
        return self.inner.get(key)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        self._call()
        return self.inner.put(key, data, if_absent=if_absent)

    def exists(self, key: str) -> bool:
        self._call()
        return self.inner.exists(key)

    def size(self, key: str) -> int | None:
        self._call()
        return self.inner.size(key)

    def list(self, prefix: str = "") -> list[str]:
        self._call()
        return self.inner.list(prefix)

    def read_range(self, key: str, start: int, end: int | None = None) -> bytes:
        self._call()
        return self.inner.read_range(key, start, end)

    def read_from(self, key: str, start: int, total: int) -> Iterator[bytes]:
        self._call()
        return self.inner.read_from(key, start, total)

    def put_file(self, key: str, path: Path, *, if_absent: bool = False) -> bool:
        self._call()
        return self.inner.put_file(key, path, if_absent=if_absent)


def calls() -> int:
    """Store calls this process has made through ``KillAt`` stores."""
    return _CALLS[0]
