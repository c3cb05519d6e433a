"""`edgeplan profile run` end to end on a compiled model: every point, EMULATED TPU times from the compile
reports, measured CPU times, the summary JSON; bad input recorded or refused with a message."""
from __future__ import annotations

import json
import shutil

import pytest

from edgeplan.cli import main
from edgeplan.errors import ProfileError
from edgeplan.pipeline import params as params_mod
from edgeplan.profile import cpu, fleet, run
from edgeplan.profile.schema import Profile

FAST = ["--repeats", "20", "--span-s", "0.5", "--budget-s", "2"]


@pytest.fixture(scope="module")
def tiny(compiled, tmp_path_factory):
    root, _, _ = compiled("tiny_cnn")
    copy = tmp_path_factory.mktemp("tiny") / "tiny_cnn" / "1"
    shutil.copytree(root, copy)
    return copy


@pytest.fixture(scope="module")
def profiled(tiny, tmp_path_factory):
    summary = tmp_path_factory.mktemp("summary") / "summary.json"
    code = main(["profile", "run", str(tiny), "--device-class", "coral-usb-emulated", "--summary-json", str(summary),
                 "--cpu-prefixes", *FAST])
    assert code == 0
    return Profile.load(tiny / "profiles" / "coral-usb-emulated.json"), json.loads(summary.read_text())


def test_every_point_profiled(profiled):
    prof, _ = profiled
    P = prof.last_point
    assert prof.device_class == "coral-usb-emulated" and prof.kernels == "xnnpack"
    assert {s.key for s in prof.segments} == {(k, "suffix") for k in range(P)} | {(k, "prefix") for k in range(1, P + 1)}
    for s in prof.segments:
        assert s.status == "ok", s.error
        assert [t.threads for t in s.cpu] == list(prof.threads)
        assert all(t.source == "measured" and t.median_ms > 0 and len(t.samples_ms) >= 5 for t in s.cpu)
        if s.role == "prefix":
            t = s.tpu
            assert t.source == "emulated"
            assert t.tpu_ms == pytest.approx(t.tpu_compute_ms + t.io_ms, abs=1e-4)
            # the published 500 MB/s USB 3.0 link at the desktop host's fitted link efficiency
            link = prof.tpu_model["link_bytes_per_s"]
            assert link == pytest.approx(5e8 * prof.tpu_model["calibration"]["params"]["link_efficiency"]["desktop"])
            assert t.load_ms == pytest.approx(1e3 * t.onchip_param_bytes / link, abs=1e-4)
    assert prof.tpu_model["model"] == "edgeplan-tpu-model-2"
    assert prof.probe and prof.probe_ms(1) > 0
    # measured times are brought to the class's reference speed through the probe timed beside them
    ref = params_mod.DEFAULTS["fleet"]["device_classes"]["coral-usb-emulated"]["cpu_probe_ms"]
    for s in prof.segments:
        for t in s.cpu:
            assert t.scale == pytest.approx(ref[t.threads] / prof.probe_ms(t.threads))
    assert prof.tpu_model["calibration"]["hosts"] == ["desktop", "devboard", "rpi4b"]  # one joint fit, every host
    assert prof.tpu_model["calibration"]["host"] == "desktop"  # the class's: its overhead and link


def test_deeper_prefix_costs_more_on_the_tpu(profiled):
    prof, _ = profiled
    tpu = [prof.segment(k, "prefix").tpu for k in range(1, prof.last_point + 1)]
    assert all(a.macs <= b.macs for a, b in zip(tpu, tpu[1:]))
    assert all(a.tpu_compute_ms <= b.tpu_compute_ms + 1e-9 for a, b in zip(tpu, tpu[1:]))


def test_summary_json(profiled):
    prof, summary = profiled
    assert [r["point"] for r in summary] == list(range(prof.last_point + 1))
    assert summary[0]["tpu_ms"] == 0.0 and summary[-1]["cpu_ms"] == {str(n): 0.0 for n in prof.threads}
    mid = summary[1]
    assert mid["tpu_ms"] == pytest.approx(prof.segment(1, "prefix").tpu.tpu_ms, abs=1e-3)
    assert mid["cpu_ms"]["1"] == pytest.approx(prof.segment(1, "suffix").cpu_ms(1), abs=1e-3)
    assert mid["source"] == "emulated" and mid["cpu_source"] == "measured"


def test_broken_segment_recorded_others_kept(tiny, tmp_path):
    d = tmp_path / "m" / "1"
    shutil.copytree(tiny, d)
    (d / "segments/p1/suffix_int8.tflite").write_bytes(b"not a flatbuffer")
    (d / "segments/p2/suffix_int8.tflite").unlink()
    assert main(["profile", "run", str(d), "--device-class", "coral-usb-emulated", *FAST]) == 1
    prof = Profile.load(d / "profiles" / "coral-usb-emulated.json")
    bad = {s.key: s for s in prof.segments if s.status != "ok"}
    assert set(bad) == {(1, "suffix"), (2, "suffix")}
    assert "cannot read the model" in bad[(1, "suffix")].error and "missing" in bad[(2, "suffix")].error
    assert prof.segment(0, "suffix").status == "ok" and prof.segment(3, "suffix").cpu_ms(1) > 0


def test_timeout_recorded(tiny, tmp_path):
    d = tmp_path / "m" / "1"
    shutil.copytree(tiny, d)
    fl = fleet.load(params_mod.DEFAULTS)
    settings = cpu.Settings(repeats=10**9, min_repeats=10**9, budget_s=1e9, span_s=1e9, timeout_s=2)
    prof = run.profile(d, fl.device_class("coral-usb-emulated"), settings)
    assert all(s.status == "timeout" for s in prof.segments if s.role == "suffix")
    assert all(s.tpu is not None for s in prof.segments if s.role == "prefix")  # the rest is kept


def test_unknown_device_class(tiny, capsys):
    assert main(["profile", "run", str(tiny), "--device-class", "jetson-nano"]) == 2
    assert "device class 'jetson-nano' is not in the fleet registry" in capsys.readouterr().err


def test_incomplete_artifacts(tmp_path, capsys):
    assert main(["profile", "run", str(tmp_path), "--device-class", "coral-usb-emulated"]) == 2
    assert "analysis.json: missing" in capsys.readouterr().err


def test_sample_needs_a_predictor(tiny):
    fl = fleet.load(params_mod.DEFAULTS)
    with pytest.raises(ProfileError, match="no predictor was given"):
        run.profile(tiny, fl.device_class("coral-usb-emulated"), cpu.Settings(), sample=2)


def test_sample_points():
    assert run.sample_points([0, 1, 2, 3, 4, 5, 6, 7, 8], 3) == {0, 4, 8}
    assert run.sample_points([0, 1, 2], 5) == {0, 1, 2}
    assert run.sample_points([0, 1, 2], 1) == {0}
