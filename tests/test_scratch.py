"""Scratch directories: removed when their step ends, and those a killed edgeplan process left are swept."""
from __future__ import annotations

import os
import subprocess
import sys

from edgeplan import scratch as scratch_mod


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_scratch_left_by_a_dead_process_is_swept_and_the_living_ones_are_kept(tmp_path, monkeypatch):
    dead = _dead_pid()
    left = tmp_path / f"edgeplan-convert-{dead}-abc123"
    (left / "saved_model").mkdir(parents=True)
    (left / "saved_model" / "weights.bin").write_bytes(b"\0" * 4096)
    mine = tmp_path / f"edgeplan-ingest-{os.getpid()}-def456"
    mine.mkdir()
    other = tmp_path / f"tmp-convert-{dead}-x"  # not a scratch directory of edgeplan's
    other.mkdir()
    link = tmp_path / f"edgeplan-calib-{dead}-lnk"
    link.symlink_to(other)
    assert scratch_mod.sweep(tmp_path) == [left]
    assert not left.exists() and mine.is_dir() and other.is_dir() and link.is_symlink()

    monkeypatch.setattr(scratch_mod.tempfile, "tempdir", str(tmp_path))
    (tmp_path / f"edgeplan-convert-{dead}-again").mkdir()
    with scratch_mod.scratch("convert") as d:
        assert d.is_dir() and d.parent == tmp_path and d.name.startswith(f"edgeplan-convert-{os.getpid()}-")
        assert not (tmp_path / f"edgeplan-convert-{dead}-again").exists()  # swept on the way in
        (d / "model.onnx").write_bytes(b"x")
    assert not d.exists()
