"""The accuracy gate: a CNN trained here on scikit-learn's digits keeps its top-1 through int8 at every point; a
deliberately broken calibration trips the gate, and what the gate refuses is never planned, bundled or run."""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgeplan.artifacts import AccuracyPoint, AccuracyReport, Analysis, ModelInfo
from edgeplan.errors import AccuracyGateError, BundleVerificationError, EdgeplanError
from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline import stages
from edgeplan.verify import accuracy as gate

BROKEN_CALIBRATION = {"kind": "random", "low": 0.0, "high": 0.05, "samples": 64, "seed": 0}  # inputs reach 1.0


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """digits_cnn compiled twice: with the default calibration (version 1) and a broken one (version 2)."""
    root = tmp_path_factory.mktemp("digits")
    good = params_mod.load(None)
    good["accuracy"]["dataset"] = "zoo:digits_cnn"
    bad = copy.deepcopy(good)
    bad["quantize"]["calibration"] = BROKEN_CALIBRATION
    out = {}
    for version, p in (("1", good), ("2", bad)):
        d = stages.ingest("zoo:digits_cnn", "digits_cnn", version, root)
        stages.build(d, p)
        assert stages.verify(d, p).ok  # verify alone does not catch the broken calibration
        out[version] = (d, p, stages.accuracy(d, p))
    return root, out


def test_a_trained_cnn_keeps_its_top1_through_int8_at_every_point(digits):
    _, out = digits
    d, p, report = out["1"]
    assert report.samples == 450 and report.float_top1 >= 0.9  # a real classifier on held-out scans
    assert len(report.points) >= 3 and report.ok and report.excluded == ()
    assert all(abs(pt.drop) <= p["accuracy"]["max_top1_drop"] for pt in report.points)
    assert gate.excluded_points(d, p) == ()
    saved = AccuracyReport.load(d / "accuracy.json")
    assert saved == report and saved.model_sha256 == ModelInfo.load(d / "model.json").sha256


def test_a_broken_calibration_trips_the_gate_and_nothing_of_the_model_is_planned(digits):
    _, out = digits
    d, p, report = out["2"]
    assert not report.ok and len(report.excluded) == len(report.points)
    assert max(pt.top1 for pt in report.points) < 0.5 < out["1"][2].float_top1
    with pytest.raises(AccuracyGateError, match="failed the accuracy gate at every point"):
        gate.excluded_points(d, p)


def test_the_cli_gate_prints_the_table_and_exits_1_when_no_point_passes(digits):
    _, out = digits
    for version, code in (("1", 0), ("2", 1)):
        d = out[version][0]
        proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "accuracy", str(d), "--dataset", "zoo:digits_cnn"],
                              capture_output=True, text=True, timeout=300, cwd=d, check=False)
        assert proc.returncode == code, proc.stderr[-2000:]
        assert "float top-1" in proc.stdout and ("passed" if code == 0 else "not published") in proc.stdout


@pytest.mark.parametrize("content, message", [
    ({"x": np.zeros((3, 1, 32, 32), np.float32)}, "no y array"),
    ({"x": np.zeros((3, 3, 32, 32), np.float32), "y": np.zeros(3, np.int64)}, "the model takes float"),
    ({"x": np.zeros((3, 1, 32, 32), np.float32), "y": np.zeros(2, np.int64)}, "one integer label per row"),
    ({"x": np.full((3, 1, 32, 32), np.nan, np.float32), "y": np.zeros(3, np.int64)}, "NaN or infinite"),
    (b"not a zip", "not a readable .npz"),
])
def test_a_bad_evaluation_set_gets_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "eval.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.savez(path, **content)
    with pytest.raises(AccuracyGateError, match=message) as e:
        gate.load(path, (1, 1, 32, 32))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- consumers
def _report(d: Path, excluded: set[int], last: int) -> None:
    sha = ModelInfo.load(d / "model.json").sha256
    points = tuple(AccuracyPoint(p, 0.5 if p in excluded else 0.9, 0.4 if p in excluded else 0.0,
                                 p not in excluded) for p in range(last + 1))
    AccuracyReport(sha, "made-up.npz", "0" * 64, 100, 0.02, 0.9, points, "xnnpack").save(d / "accuracy.json")


def test_points_the_gate_refused_are_never_planned_bundled_or_switched_to(deployment_root, tmp_path):
    from edgeplan.bundle import validate
    from edgeplan.bundle.build import build
    from edgeplan.bundle.manifest import Manifest
    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.runtime.engine import _publishable

    src, params = deployment_root
    root = tmp_path / "artifacts"
    shutil.copytree(src, root)
    d = root / "tiny_cnn" / "1"
    last = Analysis.load(d / "analysis.json").last
    before, _ = plan_swapless(root, "solo", params)
    excluded = set(range(2, last + 1))  # every prefix but point 1's
    _report(d, excluded, last)
    plan, _ = plan_swapless(root, "solo", params)
    used = {plan.models[0].point} | {r.points[0] for r in plan.regimes}
    assert not used & excluded and any("failed the accuracy gate" in n for n in plan.notes)
    bundle = build(root, "solo", params)
    entry = bundle.models[0]
    assert entry.excluded_points == tuple(sorted(excluded))
    with pytest.raises(EdgeplanError, match="failed the accuracy gate"):
        _publishable(entry, max(excluded), "asked")
    _publishable(entry, 1, "asked")
    # a manifest that names a point the model does not have is refused, signed or not
    manifest = Manifest(bundle.deployment, 1, bundle.device_class, bundle.accelerator, bundle.compiler,
                        bundle.code_version, "2026-11-24T00:00:00Z", "0" * 64, "k", bundle.models, bundle.plan,
                        bundle.refs, plans=bundle.plans)
    validate.manifest(manifest, "manifest.json")
    bad = replace(manifest, models=(replace(entry, excluded_points=(last + 5,)),))
    with pytest.raises(BundleVerificationError, match="excluded_points"):
        validate.manifest(bad, "manifest.json")
    # a plan made before the gate ran, at a point it refused, is not bundled
    stale = replace(before, models=(replace(before.models[0], point=last),))
    stale.save(root / "deployments" / "solo" / "plans" / "swapless.json")
    with pytest.raises(EdgeplanError, match="re-plan"):
        build(root, "solo", params)
    # a gate that refused every point stops the planner; one measured on another model.onnx too
    _report(d, set(range(last + 1)), last)
    with pytest.raises(AccuracyGateError, match="every point"):
        plan_swapless(root, "solo", params)
    _report(d, set(), last)
    report = AccuracyReport.load(d / "accuracy.json")
    replace(report, model_sha256="f" * 64).save(d / "accuracy.json")
    with pytest.raises(AccuracyGateError, match="another model.onnx"):
        plan_swapless(root, "solo", params)
