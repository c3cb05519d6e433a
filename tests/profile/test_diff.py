"""Drift: segments whose latency moved beyond the threshold, and the CLI around it."""
from __future__ import annotations

import json

import pytest

from edgeplan.cli import main
from edgeplan.errors import ProfileError
from edgeplan.profile.diff import diff
from edgeplan.profile.schema import SegmentProfile


def test_no_change_no_drift(profile_factory):
    assert diff(profile_factory(), profile_factory(), 0.05) == []


def test_cpu_drift_listed_per_thread_count(profile_factory):
    changes = diff(profile_factory(), profile_factory(cpu_scale=1.2), 0.10)
    assert {(c.point, c.role, c.metric) for c in changes} == {
        (0, "suffix", "cpu_ms@1"), (0, "suffix", "cpu_ms@2"), (1, "suffix", "cpu_ms@1"), (1, "suffix", "cpu_ms@2")}
    assert all(c.rel_change == pytest.approx(0.2) for c in changes)
    assert diff(profile_factory(), profile_factory(cpu_scale=1.2), 0.25) == []


def test_failed_segment_reported(profile_factory):
    b = profile_factory()
    segs = tuple(SegmentProfile(s.point, s.role, s.file, s.sha256, 0, 0, status="timeout", error="slow")
                 if s.key == (1, "suffix") else s for s in b.segments)
    changes = diff(profile_factory(), profile_factory(segments=segs), 0.5)
    assert [(c.point, c.metric, c.note) for c in changes] == [(1, "cpu_ms@1", "only in A; B: timeout"),
                                                              (1, "cpu_ms@2", "only in A; B: timeout")]


def test_other_model_refused(profile_factory):
    with pytest.raises(ProfileError, match="profiles of different models"):
        diff(profile_factory(), profile_factory(model_sha256="0" * 64), 0.1)


def test_cli(tmp_path, capsys, profile_factory):
    profile_factory().save(tmp_path / "a.json")
    profile_factory(cpu_scale=1.5).save(tmp_path / "b.json")
    assert main(["profile", "diff", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert main(["profile", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--threshold", "0.2",
                 "--json", str(tmp_path / "d.json")]) == 1
    out = capsys.readouterr().out
    assert "cpu_ms@1" in out and "+50.0%" in out
    assert len(json.loads((tmp_path / "d.json").read_text())) == 4
    assert main(["profile", "diff", str(tmp_path / "a.json"), str(tmp_path / "missing.json")]) == 2
