"""``edgeplan parallax``: plans for the int8 model and every point's suffix, measured here, their sub-models on
disk with their hashes, checked identical with both kernel sets; a clear line for a missing model."""
from __future__ import annotations

import hashlib
import json
import shutil

import yaml

from edgeplan.cli import main
from edgeplan.pipeline import params as params_mod


def test_plans_every_target_and_writes_its_sub_models(compiled, tmp_path, capsys):
    root, _, _ = compiled("light_inception_v1")
    d = tmp_path / "light_inception_v1" / "1"
    shutil.copytree(root, d)
    settings = {**params_mod.DEFAULTS["parallax"], "min_nodes": 1, "beta": 100.0, "repeats": 3, "confirm_repeats": 3}
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump({"parallax": settings}))
    assert main(["--params", str(p), "parallax", str(d)]) == 0
    shown = capsys.readouterr().out
    assert "Parallax plans of" in shown and "reference: yes, xnnpack: yes" in shown
    record = json.loads((d / "parallax" / "parallax.json").read_text())
    names = list(record["targets"])
    assert names[0] == "model" and len(names) > 2 and all(n.startswith("p") for n in names[1:])
    planned = [r for r in record["targets"].values() if "same_as" not in r]
    assert all(r["identical"] == {"reference": True, "xnnpack": True} for r in planned)
    assert record["targets"]["model"]["layers"]  # the whole model has layers of several branches
    for r in planned:
        assert all(layer["mode"] in ("branches", "threads", "sequential") for layer in r["layers"])
        assert (r["parallel_layers"] == 0) == (r["stages"] == [])
        assert r["parallel_layers"] == sum(1 for layer in r["layers"] if layer["mode"] == "branches")
        for st in r["stages"]:
            for s in st["submodels"]:
                data = (d / s["file"]).read_bytes()
                assert hashlib.sha256(data).hexdigest() == s["sha256"] and len(data) == s["bytes"]
                assert s["inputs"] and s["outputs"]
    assert record["budget_bytes"] > 0 and record["workers"] == 2


def test_a_missing_model_is_one_line(tmp_path, capsys):
    assert main(["parallax", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_int8.tflite: missing" in err[0]
