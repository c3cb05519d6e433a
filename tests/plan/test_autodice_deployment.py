"""`edgeplan plan autodice` on a real model (zoo tiny_cnn, compiled): the registry's devices of the deployment as
the platform, every unit timed, NSGA-II's front, the point best on the objective split and verified into
deployments/NAME/multidevice/ with plans/autodice.json and the front's plot; one split per deployment; bad input
is one line."""
from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import yaml

from edgeplan.bundle.build import _split
from edgeplan.cli import main
from edgeplan.errors import ArtifactError, PlanError
from edgeplan.pipeline import params as params_mod
from edgeplan.plan.multidevice.deployment import plan_autodice
from edgeplan.quantize import litert
from edgeplan.runtime.stream import invoke_named

DEP = "tiny-split"


def _params():
    p = params_mod.load(None)
    classes = p["fleet"]["device_classes"]
    base = {k: v for k, v in classes["coral-usb-emulated"].items() if k != "cpu_probe_ms"}
    classes["board"] = {**base, "cores": 2, "arch": "arm", "net_bytes_per_s": 1.25e7,
                        "power_w": {"idle": 2.0, "active": 5.0}, "accelerator": {"kind": "none"}}
    classes["small"] = {**classes["board"], "cores": 1, "cpu_quota": 0.5}
    p["deployments"] = [{"name": DEP, "device_class": "board", "split": "autodice",
                         "models": [{"name": "tiny", "version": "1", "rate": 1.0}]}]
    p["fleet"]["devices"] = [{"id": dev, "device_class": cls, "deployment": DEP, "work_pool": cls}
                             for dev, cls in (("dev-a", "board"), ("dev-b", "small"), ("dev-c", "small"))]
    p["multidevice"].update(population=20, generations=15, repeats=3)
    return p


@pytest.fixture(scope="module")
def tiny_root(compiled, tmp_path_factory):
    root = tmp_path_factory.mktemp("autodice-deployment")
    src, _, _ = compiled("tiny_cnn")
    shutil.copytree(src, root / "tiny" / "1")
    return root, _params()


def test_plan_explores_splits_and_verifies_end_to_end(tiny_root, tmp_path, capsys):
    root, p = tiny_root
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(p))
    assert main(["--params", str(params_file), "plan", "autodice", "--deployment", DEP, "--out", str(root),
                 "--objective", "memory"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "AutoDiCE Pareto front for tiny-split" in shown and "one device" in shown and "int8 identical" in shown
    dep = root / "deployments" / DEP
    record = json.loads((dep / "plans" / "autodice.json").read_text())
    assert [d["id"] for d in record["devices"]] == ["dev-a", "dev-b", "dev-c"]
    assert [d["cores"] for d in record["devices"]] == [2, 1, 1] and record["devices"][1]["cpu_quota"] == 0.5
    front = record["front"]
    assert front and all(q["period_s"] > 0 and q["memory_bytes"] > 0 for q in front)
    chosen = front[record["chosen"]]
    assert chosen["memory_bytes"] == min(q["memory_bytes"] for q in front)  # the objective asked
    # no point of the front is dominated by another on the three objectives
    keys = ("period_s", "memory_bytes", "energy_j_modelled")
    for a in front:
        assert not any(all(b[k] <= a[k] for k in keys) and any(b[k] < a[k] for k in keys) for b in front)
    assert (dep / "plans" / "autodice.png").stat().st_size > 10_000
    # the split written is the chosen point's, and its int8 stages in order give the whole int8 model's bits
    split = dep / "multidevice"
    tables = json.loads((split / "tables.json").read_text())
    assert len(tables["ranks"]) == len(chosen["mapping"]) == record["split"]["ranks"]
    assert [r["key"] for r in tables["ranks"]] == list(chosen["mapping"])
    int8 = (root / "tiny" / "1" / "model_int8.tflite").read_bytes()
    whole = litert.interpreter(int8, deterministic=True)
    x = {tables["input"]["name"]: np.random.default_rng(5).integers(-128, 128, tables["input"]["shape"], dtype=np.int8)}
    live = dict(x)
    for s in tables["stages"]:
        live.update(invoke_named(litert.interpreter((split / s["int8"]).read_bytes(), deterministic=True), live))
    ref = invoke_named(whole, x)
    assert all(np.array_equal(live[k], v) for k, v in ref.items())
    assert record["split"]["verify"]["int8_identical_reference"] == 1.0


def test_one_split_per_deployment_and_the_bundle_takes_it(tiny_root):
    root, p = tiny_root
    if not (root / "deployments" / DEP / "plans" / "autodice.json").is_file():
        plan_autodice(root, DEP, p)
    dep = root / "deployments" / DEP

    class Served:  # the SwapLess plan's models, as the build reads them
        models = (type("M", (), {"name": "tiny", "version": "1"}),)

    planner, files = _split(root, DEP, Served, {"dev-a", "dev-b", "dev-c"})
    tables = json.loads((dep / "multidevice" / "tables.json").read_text())
    assert planner == "autodice"
    assert set(files) == {f"deployments/{DEP}/plans/autodice.json"} | {
        f"deployments/{DEP}/multidevice/{f}" for f in ("tables.json", "rankfile", "hostfile", "split.json")} | {
        f"deployments/{DEP}/multidevice/{s['int8']}" for s in tables["stages"]}  # never the float stages
    used = {r["device"] for r in tables["ranks"]}
    with pytest.raises(ArtifactError, match="no longer assigns"):
        _split(root, DEP, Served, {"dev-a", "dev-b", "dev-c"} - {max(used)})
    # a second split's plan beside it is refused; planning one removes the other's
    (dep / "plans" / "spatial.json").write_text("{}")
    with pytest.raises(ArtifactError, match="holds spatial and autodice plans; a deployment runs one split"):
        _split(root, DEP, Served, used)
    plan_autodice(root, DEP, p)
    assert not (dep / "plans" / "spatial.json").exists()


def test_bad_inputs_are_one_clear_error(tiny_root):
    root, p = tiny_root
    with pytest.raises(PlanError, match="objective 'speed': one of throughput, memory, energy"):
        plan_autodice(root, DEP, p, objective="speed")
    with pytest.raises(PlanError, match="generations 0: at least 1"):
        plan_autodice(root, DEP, p, generations=0)
    one = copy.deepcopy(p)
    one["fleet"]["devices"] = one["fleet"]["devices"][:1]
    with pytest.raises(PlanError, match="1 device.*an AutoDiCE split needs at least 2"):
        plan_autodice(root, DEP, one)
    two = copy.deepcopy(p)
    two["deployments"][0]["models"].append({"name": "other", "version": "1", "rate": 1.0})
    with pytest.raises(PlanError, match="serves 2 models; an AutoDiCE split runs one"):
        plan_autodice(root, DEP, two)
