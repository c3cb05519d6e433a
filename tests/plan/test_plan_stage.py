"""`edgeplan plan swapless` on real profiles of compiled models: the plan file, the regime table, the
preload set, the baselines; bad deployments refused with a message."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from edgeplan.bundle import keys
from edgeplan.bundle.build import build
from edgeplan.bundle.publish import publish
from edgeplan.cli import main
from edgeplan.errors import EdgeplanError, PlanError, ProfileError
from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline.planning import plan_swapless
from edgeplan.plan.swapless.plan import SwapLessPlan
from edgeplan.profile import cpu, fleet, run
from edgeplan.runtime import Runtime, pull
from edgeplan.runtime.model import dequantize_output
from edgeplan.store import open_store

SETTINGS = cpu.Settings(repeats=20, span_s=0.5, budget_s=2)


@pytest.fixture(scope="module")
def root(compiled, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan-artifacts")
    dc = fleet.load(params_mod.DEFAULTS).device_class("coral-usb-emulated")
    for name in ("tiny_cnn", "light_squeezenet"):
        src, _, _ = compiled(name)
        shutil.copytree(src, out / name / "1")
        run.profile(out / name / "1", dc, SETTINGS)
    return out


def params_with(deployments):
    p = params_mod.load(None)
    p["deployments"] = deployments
    p["fleet"]["devices"] = []
    return p


DUO = [{"name": "duo", "device_class": "coral-usb-emulated",
        "models": [{"name": "tiny_cnn", "version": "latest", "rate": 50.0},
                   {"name": "light_squeezenet", "version": "1", "rate": 20.0}]}]


def test_plan_file(root):
    plan, path = plan_swapless(root, "duo", params_with(DUO))
    assert path == root / "deployments" / "duo" / "plans" / "swapless.json"
    again = SwapLessPlan.load(path)
    assert again == plan and plan.tpu_source == "emulated:edgeplan-tpu-model-2"  # the emulator that made the profiles
    assert [m.name for m in plan.models] == ["tiny_cnn", "light_squeezenet"]
    assert sum(m.cores for m in plan.models) <= plan.cores
    for m in plan.models:
        assert 0 <= m.point <= m.last_point and (m.cores >= 1) == (m.point < m.last_point)
        assert m.predicted_latency_ms > 0
    assert len(plan.regimes) == 9 and any(r.rates == (50.0, 20.0) for r in plan.regimes)
    chosen = {(m.name, m.point) for m in plan.models}
    assert chosen <= {(p.model, p.point) for p in plan.preload}
    assert sum(p.bytes for p in plan.preload) <= plan.preload_budget_bytes
    assert set(plan.baselines) == {"compiler_default", "threshold", "alpha_zero"}
    # the plan is no worse than any baseline under the model it optimises
    for b in plan.baselines.values():
        if b["mean_latency_ms"] is not None:
            assert plan.mean_latency_ms <= b["mean_latency_ms"] + 1e-9
    json.loads(path.read_text())  # strict JSON: no Infinity


def test_cli(root, tmp_path, capsys):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(DUO)))
    assert main(["--params", str(tmp_path / "params.yaml"), "plan", "swapless", "--deployment", "duo",
                 "--out", str(root)]) == 0
    out = capsys.readouterr().out
    assert "EMULATED" in out and "tiny_cnn" in out and "baselines" in out


def test_no_stable_configuration_names_the_bottleneck(root):
    heavy = [{**DUO[0], "models": [{"name": "light_squeezenet", "version": "1", "rate": 1e6}]}]
    with pytest.raises(PlanError, match=r"no stable configuration .* bottleneck: .*utilisation"):
        plan_swapless(root, "duo", params_with(heavy))


def test_bad_deployments(root):
    with pytest.raises(PlanError, match="deployment 'nope' is not in params.yaml"):
        plan_swapless(root, "nope", params_with(DUO))
    missing = [{**DUO[0], "models": [{"name": "resnet", "version": "latest", "rate": 1.0}]}]
    with pytest.raises(PlanError, match="model 'resnet': no artifacts"):
        plan_swapless(root, "duo", params_with(missing))
    other_class = [{**DUO[0], "device_class": "jetson"}]
    with pytest.raises(Exception, match="device class 'jetson' is not in the fleet registry"):
        plan_swapless(root, "duo", params_with(other_class))


def test_missing_profile(root, tmp_path):
    shutil.copytree(root / "tiny_cnn", tmp_path / "tiny_cnn")
    (tmp_path / "tiny_cnn" / "1" / "profiles" / "coral-usb-emulated.json").unlink()
    one = [{**DUO[0], "models": [{"name": "tiny_cnn", "version": "1", "rate": 5.0}]}]
    with pytest.raises(ProfileError, match="run `edgeplan profile run"):
        plan_swapless(tmp_path, "duo", params_with(one))


def test_a_class_without_an_edge_tpu_runs_every_model_on_the_cpu(root, tmp_path):
    """CPU-only boards (a split's devices): no prefix is usable, every model at point 0, the cores shared."""
    p = params_with([{**DUO[0], "device_class": "board"}])
    coral = p["fleet"]["device_classes"]["coral-usb-emulated"]
    p["fleet"]["device_classes"]["board"] = {**{k: v for k, v in coral.items() if k != "cpu_probe_ms"},
                                             "accelerator": {"kind": "none"}}
    for name in ("tiny_cnn", "light_squeezenet"):
        shutil.copytree(root / name, tmp_path / name)
        run.profile(tmp_path / name / "1", fleet.load(p).device_class("board"), SETTINGS)
    plan, _ = plan_swapless(tmp_path, "duo", p)
    assert [m.point for m in plan.models] == [0, 0]
    assert all(m.cores >= 1 for m in plan.models) and sum(m.cores for m in plan.models) <= plan.cores
    assert all("has no Edge TPU; the model runs wholly on the CPU" in " ".join(plan.notes) for _ in plan.models)
    # its revision carries point 0 alone (the whole int8 model): the points past it need an Edge TPU and are never
    # chosen there; the device checks, activates and serves it, and refuses a point it does not carry
    _, key_path, _ = keys.generate(tmp_path / "keys")
    trusted = keys.load_trusted([tmp_path / "keys"])
    bundle = build(tmp_path, "duo", p)
    segments = {n.split("/segments/", 1)[1] for n in bundle.blobs if "/segments/" in n}
    assert segments == {"p0/suffix_int8.tflite"}
    publish(open_store(tmp_path / "store"), bundle, keys.load_signing_key(key_path), trusted, [])
    res = pull(open_store(tmp_path / "store"), tmp_path / "device", trusted, deployment="duo")
    assert res.activated and res.fetched_blobs == len(bundle.blobs)
    with Runtime(tmp_path / "device", adapt=False) as rt:  # the EMULATED accelerator has no prefix to compute
        assert rt.precompute("tiny_cnn", [np.zeros(rt.models["tiny_cnn"].entry.input.float_shape, np.float32)],
                             points="all") == 0
        entry = rt.models["tiny_cnn"].entry
        y = rt.infer("tiny_cnn", np.load(rt.rev_dir / entry.selftests[0].input))
        want = dequantize_output(np.load(rt.rev_dir / entry.selftests[0].expected), entry.output)
        # served with XNNPACK; the expected output is the reference kernels': a quantization step or two apart
        assert np.abs(y - want).max() <= 2.01 * entry.output.scale
        with pytest.raises(EdgeplanError, match="point 1 outside 0..0"):
            rt.configure({**rt.points, "tiny_cnn": 1}, rt.cores)
