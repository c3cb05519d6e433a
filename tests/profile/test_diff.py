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


def _load(scale: float, n: int = 3):
    from edgeplan.profile.capacity import LayerLoad, LoadCapacity

    layers = tuple(LayerLoad(i, f"l{i}", "CONV_2D", "reusable", 1000, 2000, 1.0 * scale, (1.0, 1.1, 1.3 * scale),
                             1.2, 0.5) for i in range(n))
    return LoadCapacity((50.0, 200.0, 800.0), layers, 2.5, 3)


def test_load_capacity_drift_in_sum_and_presence(profile_factory):
    """FlashMem's streaming layers: their summed times drift as one change each; one side without is a change."""
    from dataclasses import replace

    a = replace(profile_factory(), load_capacity=_load(1.0))
    assert diff(a, replace(profile_factory(), load_capacity=_load(1.05)), 0.1) == []
    changes = diff(a, replace(profile_factory(), load_capacity=_load(1.3)), 0.1)
    assert [(c.point, c.role, c.metric) for c in changes] == [(-1, "stream", "alone_ms"), (-1, "stream", "loaded_ms")]
    assert changes[0].before_ms == pytest.approx(3.0) and changes[0].rel_change == pytest.approx(0.3)
    assert [c.note for c in diff(a, profile_factory(), 0.1)] == ["load capacity only in A"]
    assert [c.note for c in diff(a, replace(a, load_capacity=_load(1.0, 4)), 0.1)] == [
        "load capacity of 3 layers in A, 4 in B"]


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
