"""`edgeplan plan spatial` on a real model (zoo spatial_chain, compiled): conv speeds measured by `edgeplan profile
run --conv-speed`, the registry's devices of the deployment, the search along H and W, int8 tiles verified and
written with plans/spatial.json, then run in process from what was written; bad input is one line."""
from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import yaml

from edgeplan.cli import main
from edgeplan.errors import PlanError, ProfileError
from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline.planning import split_of
from edgeplan.plan.spatial.deployment import plan_spatial
from edgeplan.profile import cpu, fleet, run
from edgeplan.profile.schema import Profile
from edgeplan.quantize import litert
from edgeplan.surgery import spatial

DEP = "chain-split"


def _params():
    p = params_mod.load(None)
    net = {"net_bytes_per_s": 1.25e6, "arch": "x86"}
    classes = p["fleet"]["device_classes"]
    classes["fast"] = {**{k: v for k, v in classes["coral-usb-emulated"].items() if k != "cpu_probe_ms"}, **net,
                       "accelerator": {"kind": "none"}}
    classes["slow"] = {**classes["fast"], "cpu_quota": 0.5}  # an emulated half core: measured in a cpu cgroup
    p["deployments"] = [{"name": DEP, "device_class": "fast", "models": [{"name": "chain", "version": "1", "rate": 1.0}]}]
    p["fleet"]["devices"] = [{"id": "dev-a", "device_class": "fast", "deployment": DEP, "work_pool": "fast"},
                             {"id": "dev-b", "device_class": "slow", "deployment": DEP, "work_pool": "slow"}]
    return p


@pytest.fixture(scope="module")
def chain_root(compiled, tmp_path_factory):
    root = tmp_path_factory.mktemp("spatial-deployment")
    src, _, _ = compiled("spatial_chain")
    shutil.copytree(src, root / "chain" / "1")
    return root, _params()


def test_profile_plan_and_tiles_end_to_end(chain_root, tmp_path, capsys):
    root, p = chain_root
    d = root / "chain" / "1"
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(p))
    args = ["--params", str(params_file)]
    # a class with no profile: the error names the command to run
    assert main([*args, "plan", "spatial", "--deployment", DEP, "--out", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"edgeplan profile run {d} --device-class fast --conv-speed" in err[0]
    for cls in ("fast", "slow"):
        assert main([*args, "profile", "run", str(d), "--device-class", cls, "--conv-speed", "--repeats", "5",
                     "--span-s", "0.2", "--budget-s", "0.5"]) == 0
        speed = Profile.load(d / "profiles" / f"{cls}.json").conv_speed
        assert speed.s_per_mac > 0 and len(speed.macs) == len(speed.seconds) >= 4
    fast, slow = (Profile.load(d / "profiles" / f"{c}.json").conv_speed for c in ("fast", "slow"))
    assert fast.quota is None and slow.quota == 0.5
    assert slow.s_per_mac > 1.2 * fast.s_per_mac  # held to half a core, measured (not read off the quota)
    assert "ps/MAC" in capsys.readouterr().out
    # a profile run without --conv-speed keeps the fit of the same model
    kept = Profile.load(d / "profiles" / "fast.json").conv_speed
    run.profile(d, fleet.load(p).device_class("fast"), cpu.Settings(repeats=5, min_repeats=2, span_s=0.2, budget_s=0.5))
    assert Profile.load(d / "profiles" / "fast.json").conv_speed == kept

    assert main([*args, "plan", "spatial", "--deployment", DEP, "--out", str(root), "--dims", "H,W"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "ADaPS plan for chain-split" in shown and "identical to the int8 model: builtin kernels 100%, xnnpack kernels 100%" in shown
    assert "float tiles vs the float model: max |diff| 0" in shown
    record = json.loads((root / "deployments" / DEP / "plans" / "spatial.json").read_text())
    assert set(record["searched"]) == {"H", "W"} and record["axis"] in ("H", "W")
    assert record["score_s"] == min(r["score_s"] for r in record["searched"].values())
    assert [x["id"] for x in record["devices"]] == ["dev-a", "dev-b"]
    assert all(len(part) == 2 for part in record["partitions"])
    assert record["tiles"]["identical"] == {"int8_identical_builtin": 1.0, "int8_identical_xnnpack": 1.0}
    assert record["tiles"]["float_max_abs_diff"] == 0.0  # the float tiles, cut as the int8 ones, equal the model
    # the tiles written are what the ranks run: in process, they give the int8 model's bits
    out = root / "deployments" / DEP / "spatial"
    table = json.loads((out / "tables.json").read_text())
    blob = {s["int8"]: (out / s["int8"]).read_bytes() for s in table["stages"]}
    int8 = (d / "model_int8.tflite").read_bytes()
    whole = litert.interpreter(int8, deterministic=True)
    shape = whole.get_input_details()[0]["shape"]
    x = np.random.default_rng(3).integers(-128, 128, shape, dtype=np.int8)
    got = spatial.run_tables(table, blob, x, lambda data: litert.interpreter(data, deterministic=True))
    np.testing.assert_array_equal(got, litert.run(whole, x))
    assert (out / "rankfile").read_text().splitlines()[0].startswith("rank 0=dev-a ")
    # a fit measured under another quota than the class has now
    quota = copy.deepcopy(p)
    quota["fleet"]["device_classes"]["slow"]["cpu_quota"] = 0.25
    with pytest.raises(ProfileError, match="under cpu quota 0.5, the class now has 0.25"):
        plan_spatial(root, DEP, quota)


def test_bad_inputs_are_one_clear_error(chain_root):
    root, p = chain_root
    with pytest.raises(PlanError, match="split 'tiles' is not one of: spatial"):
        split_of({"name": DEP, "split": "tiles"})
    with pytest.raises(PlanError, match=r"threshold 0: .* \(0, 1\]"):
        plan_spatial(root, DEP, p, threshold=0.0)
    with pytest.raises(PlanError, match="partition along H, W"):
        plan_spatial(root, DEP, p, dims=("C",))
    one = copy.deepcopy(p)
    one["fleet"]["devices"] = one["fleet"]["devices"][:1]
    with pytest.raises(PlanError, match="1 device.* at least 2"):
        plan_spatial(root, DEP, one)


def test_profile_run_without_a_class_profiles_a_split_deployment_as_edgeplan_run_does(chain_root, tmp_path):
    """`split: spatial`: the default classes are those of the deployment's devices, each with its conv speed."""
    root, p = chain_root
    name = json.loads((root / "chain" / "1" / "model.json").read_text())["name"]  # the zoo model's own name
    d = tmp_path / "root" / name / "1"
    shutil.copytree(root / "chain" / "1", d, ignore=shutil.ignore_patterns("profiles"))
    split = copy.deepcopy(p)
    split["deployments"][0].update(split="spatial", models=[{"name": name, "version": "1", "rate": 1.0}])
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(split))
    assert main(["--params", str(params_file), "profile", "run", str(d), "--repeats", "5", "--span-s", "0.2",
                 "--budget-s", "0.5"]) == 0
    for cls in ("fast", "slow"):
        assert Profile.load(d / "profiles" / f"{cls}.json").conv_speed.s_per_mac > 0


def test_a_residual_model_is_planned_over_its_sub_blocks(compiled, tmp_path, capsys):
    """tiny_cnn: path analysis reaches past the residual fork (7 layers in 3 sub-blocks instead of the chain's 2),
    so the plan and its tiles cover the multi-path region; the tiles written give the whole int8 model's bits."""
    root = tmp_path / "art"
    src, _, _ = compiled("tiny_cnn")
    shutil.copytree(src, root / "chain" / "1")
    p = _params()
    p["fleet"]["devices"][1]["device_class"] = "fast"  # two fast devices: no cgroup needed here
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(p))
    d = root / "chain" / "1"
    assert main(["--params", str(params_file), "profile", "run", str(d), "--device-class", "fast", "--conv-speed",
                 "--repeats", "5", "--span-s", "0.2", "--budget-s", "0.5"]) == 0
    capsys.readouterr()
    assert main(["--params", str(params_file), "plan", "spatial", "--deployment", DEP, "--out", str(root)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "H: 7 layers in 3 sub-block(s) to relu5.out (GlobalAveragePool 'gap' is Type 3)" in shown
    assert "builtin kernels 100%, xnnpack kernels 100%" in shown
    assert "float tiles vs the float model: max |diff| 0" in shown
    record = json.loads((root / "deployments" / DEP / "plans" / "spatial.json").read_text())
    assert len(record["partitions"]) == 7 and record["tiles"]["float_max_abs_diff"] == 0.0  # a merge's tile too
    out = root / "deployments" / DEP / "spatial"
    table = json.loads((out / "tables.json").read_text())
    blob = {s["int8"]: (out / s["int8"]).read_bytes() for s in table["stages"]}
    whole = litert.interpreter((d / "model_int8.tflite").read_bytes(), deterministic=True)
    x = np.random.default_rng(5).integers(-128, 127, table["input"]["shape"], endpoint=True).astype(np.int8)
    got = spatial.run_tables(table, blob, x, lambda data: litert.interpreter(data, deterministic=True))
    assert np.array_equal(got, litert.run(whole, x))
