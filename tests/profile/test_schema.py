"""Profiles: JSON round trip, the per-point summary of the issue, older schema versions refused."""
from __future__ import annotations

import json

import pytest

from edgeplan.errors import ArtifactError
from edgeplan.profile.schema import CpuTiming, Profile, SegmentProfile, least_trusted


def test_round_trip(tmp_path, profile_factory):
    p = profile_factory()
    p.save(tmp_path / "p.json")
    q = Profile.load(tmp_path / "p.json")
    assert q == p
    assert q.segment(1, "prefix").tpu.tpu_ms == 1.5
    assert q.segment(0, "suffix").cpu_timing(2).samples_ms == (4.0,) * 5


def test_summary_format(profile_factory):
    rows = profile_factory().summary()
    assert [r["point"] for r in rows] == [0, 1, 2]
    assert rows[0]["tpu_ms"] == 0.0 and rows[0]["cpu_ms"] == {"1": 8.0, "2": 4.0}
    assert rows[1]["tpu_ms"] == 1.5 and rows[1]["cpu_ms"] == {"1": 3.0, "2": 1.5}
    assert rows[2]["tpu_ms"] == 2.5 and rows[2]["cpu_ms"] == {"1": 0.0, "2": 0.0}
    # a point mixing an emulated TPU time and a measured CPU time is as trustworthy as the emulated part
    assert rows[1]["source"] == "emulated" and rows[1]["cpu_source"] == "measured"
    assert rows[0]["source"] == "measured"
    json.dumps(rows)


def test_failed_segment_gives_null_in_summary(profile_factory):
    p = profile_factory()
    segs = list(p.segments)
    segs[2] = SegmentProfile(1, "suffix", segs[2].file, "c", 0, 0, status="failed", error="boom")
    rows = Profile(**{**p.__dict__, "segments": tuple(segs)}).summary()
    assert rows[1]["cpu_ms"] == {"1": None, "2": None}


def test_older_schema_refused_with_message(tmp_path, profile_factory):
    data = profile_factory().to_json()
    data["schema_version"] = 0
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"old\.json: Profile schema_version 0, this edgeplan reads 1"):
        Profile.load(tmp_path / "old.json")


def test_robust_statistics():
    t = CpuTiming.from_samples(1, [1.0, 1.1, 0.9, 1.0, 50.0])
    assert t.median_ms == 1.0 and t.mad_ms == pytest.approx(0.1)
    assert t.mean_ms > 10  # the outlier shows in the mean, not in the median the planners use


def test_least_trusted():
    assert least_trusted("measured", None, "emulated") == "emulated"
    assert least_trusted("predicted", "measured") == "predicted"
