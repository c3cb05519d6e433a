"""Shared by the MPI tests: what a job left running, and a copy of a split with its tables edited."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest


def _ranks_left() -> str:
    out = subprocess.run(["pgrep", "-af", "edgeplan.distributed.rank|prterun|prted"], capture_output=True, text=True,
                         check=False)
    return "\n".join(x for x in out.stdout.splitlines() if "pgrep" not in x)


@pytest.fixture
def ranks_left():
    """``ranks_left()``: the command lines of rank, prterun and prted processes still running ('' when none)."""
    return _ranks_left


@pytest.fixture
def edited_split(tmp_path):
    """``edited_split(out, edit)``: a copy of the split ``out`` (same name, under tmp_path) whose tables.json
    ``edit(tables)`` changed in place."""
    def make(out: Path, edit) -> Path:
        bad = tmp_path / out.name
        shutil.copytree(out, bad)
        t = json.loads((bad / "tables.json").read_text())
        edit(t)
        (bad / "tables.json").write_text(json.dumps(t))
        return bad

    return make
