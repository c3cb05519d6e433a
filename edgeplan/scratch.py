"""Scratch directories of the pipeline's long steps (ingest, int8 conversion, calibration, load capacity).

Each is ``edgeplan-<kind>-<pid>-<random>`` in the system's temporary directory, removed when its step ends. A
process that is killed cannot remove its own: ten such directories were found after a day of killed compiles (a
2 GB model's conversion leaves gigabytes). So before making one, the directories of edgeplan processes that no
longer exist (their pid gone, the directory this user's) are removed.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgeplan.pipeline.local_server import alive

_NAME = re.compile(r"^edgeplan-[a-z0-9]+-(\d+)-")


@contextmanager
def scratch(kind: str) -> Iterator[Path]:
    """A fresh scratch directory for ``kind`` of work (lower-case letters and digits), removed on leaving; the
    scratch left by dead edgeplan processes removed first (``sweep``)."""
    sweep()
    with tempfile.TemporaryDirectory(prefix=f"edgeplan-{kind}-{os.getpid()}-") as tmp:
        yield Path(tmp)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories under ``root`` (the temporary directory) whose process is gone (or a zombie);
    what was removed. A directory of another user, a link, or one whose pid is alive (even if reused) is left."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for d in entries:
        m = _NAME.match(d.name)
        if not m or alive(int(m.group(1))):
            continue
        try:
            st = d.lstat()
        except OSError:
            continue
        if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid():
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed

