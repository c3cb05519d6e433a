"""The emulated Edge TPU: the fit recovers known parameters, respects its bounds, and the shipped calibration
gives every published row a leave-one-out error."""
from __future__ import annotations

import pytest

from edgeplan.profile import tpu_model as tm

W = [tm.TpuWorkload(m, 4_000_000, off, 150_528, 1000, 40)
     for m, off in [(3e8, 0), (6e8, 0), (1.5e9, 0), (7e9, 17_000_000), (4e9, 2_000_000)]]


def rows_from(efficiency, overhead):
    tpu = tm.EmulatedEdgeTpu(efficiency, overhead)
    return [tm.CalibrationRow(f"m{i}", 224, "test", tpu.times(w).tpu_ms, w) for i, w in enumerate(W)]


def test_fit_recovers_parameters():
    eff, ovh = tm.fit(rows_from(0.37, 1.2))
    assert eff == pytest.approx(0.37, rel=1e-6) and ovh == pytest.approx(1.2, rel=1e-6)
    loo = tm.leave_one_out(rows_from(0.37, 1.2))
    assert all(abs(r["error"]) < 1e-6 for r in loo)


def test_fit_bounds():
    # rows faster than the published peak allows: efficiency is clamped to 1
    rows = [tm.CalibrationRow(r.model, r.input, r.host, r.measured_ms * 0.2, r.workload) for r in rows_from(0.5, 0.0)]
    eff, ovh = tm.fit(rows)
    assert eff == 1.0 and ovh >= 0.0
    with pytest.raises(ValueError, match="at least two"):
        tm.fit(rows[:1])


def test_times_follow_the_definitions():
    tpu = tm.EmulatedEdgeTpu(0.5, 1.0)
    w = tm.TpuWorkload(1e9, 8_000_000, 5_000_000, 100_000, 1000, 10)
    t = tpu.times(w)
    assert t.io_ms == pytest.approx(1e3 * 101_000 / tm.LINK_BYTES_PER_S)
    assert t.load_ms == pytest.approx(1e3 * 8e6 / tm.LINK_BYTES_PER_S)
    assert t.tpu_compute_ms == pytest.approx(1e3 * (1e9 / (2e12 * 0.5) + 5e6 / 5e8) + 1.0)
    assert t.tpu_ms == pytest.approx(t.tpu_compute_ms + t.io_ms)
    streamed = tpu.times(tm.TpuWorkload(1e9, 8_000_000, 10_000_000, 100_000, 1000, 10))
    assert streamed.tpu_compute_ms > t.tpu_compute_ms  # more streamed parameters, slower


def test_shipped_calibration():
    tpu = tm.for_host("desktop")
    assert 0 < tpu.efficiency <= 1 and tpu.overhead_ms >= 0
    loo = tpu.calibration["loo_errors"]
    assert [r["model"] for r in loo] == ["mobilenet_v1_1.0", "mobilenet_v2_1.0", "inception_v1", "squeezenet", "resnet50_v1"]
    assert all(abs(r["error"]) < 0.5 for r in loo)
    # ResNet50 streams about 17 MB per inference over USB: most of its 49 ms
    resnet = tm.calibration_rows("desktop")[-1].workload
    assert resnet.offchip_param_bytes > 10e6


def test_missing_workload_is_explained(tmp_path):
    (tmp_path / "w.json").write_text('{"workloads": {}}')
    with pytest.raises(KeyError, match="no workload for mobilenet_v1_1.0@224"):
        tm.calibration_rows("desktop", workloads_path=tmp_path / "w.json")
