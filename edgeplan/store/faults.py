"""The fault hook of the reliability harness (``bench/reliability.py``): a process with ``EDGEPLAN_KILL_AT=N``
SIGKILLs itself just before its Nth *step*, so that a trial can stop a publish or a pull at each step in turn.
Steps are the calls to every store the process opens (``open_store`` wraps a store in ``KillAt`` when the
variable is set) and the file-system steps of a pull that ``edgeplan.runtime.pull`` marks with ``step``
(a hard link, a symlink swap, the state write, the health check). With ``EDGEPLAN_FAULT_TRACE=FILE`` each step
appends its label to FILE (what step N is). Without the variables a step costs one environment lookup.
Standard library only."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

from edgeplan.store import KILL_AT_ENV, TRACE_ENV
from edgeplan.store.base import Store

_STEPS = [0]  # steps this process has taken so far


def step(label: str) -> None:
    """Count one step (``label`` says what it is); SIGKILL this process when it is step number KILL_AT."""
    at, trace = os.environ.get(KILL_AT_ENV), os.environ.get(TRACE_ENV)
    if not (at or trace):
        return
    _STEPS[0] += 1
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{label}\n")
    if at and _STEPS[0] == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


def calls() -> int:
    """Steps this process has taken (store calls and marked file-system steps)."""
    return _STEPS[0]


class KillAt(Store):
    """``store`` with every call a step."""

    def __init__(self, store: Store):
        self.inner, self.uri = store, store.uri

    def get(self, key: str) -> bytes:
        step(f"get {key}")
        return self.inner.get(key)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        step(f"put {key}")
        return self.inner.put(key, data, if_absent=if_absent)

    def exists(self, key: str) -> bool:
        step(f"exists {key}")
        return self.inner.exists(key)

    def size(self, key: str) -> int | None:
        step(f"size {key}")
        return self.inner.size(key)

    def list(self, prefix: str = "") -> list[str]:
        step(f"list {prefix}")
        return self.inner.list(prefix)

    def read_range(self, key: str, start: int, end: int | None = None) -> bytes:
        step(f"read_range {key}")
        return self.inner.read_range(key, start, end)

    def read_from(self, key: str, start: int, total: int) -> Iterator[bytes]:
        step(f"read_from {key}")
        return self.inner.read_from(key, start, total)

    def put_file(self, key: str, path: Path, *, if_absent: bool = False) -> bool:
        step(f"put_file {key}")
        return self.inner.put_file(key, path, if_absent=if_absent)
