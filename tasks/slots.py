"""A per-machine limit on concurrent work (int8 conversions are memory-heavy, and memory is per machine):
``slot("conversion", n)`` holds one of n lock files under the machine's temp directory. The kernel releases
a lock when its holder dies, so a run killed mid-conversion never leaves a slot taken (a server-side
Prefect concurrency lease would stay held until it expired)."""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

DIR = Path(os.environ.get("EDGEPLAN_SLOTS_DIR", Path(tempfile.gettempdir()) / "edgeplan-slots"))


@contextmanager
def slot(name: str, slots: int, poll_s: float = 0.5, log=None):
    DIR.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        for k in range(max(1, slots)):
            f = open(DIR / f"{name}.{k}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            try:
                yield k
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
            return
        if not waited and log is not None:
            log.info("waiting for one of %d %s slots on this machine", slots, name)
        waited = True
        time.sleep(poll_s)
