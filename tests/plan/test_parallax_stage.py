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


def test_a_control_flow_op_runs_alone_and_the_plan_stays_exact():
    """An int8 model with a WHILE loop (its body a subgraph) beside a parallel branch: the loop is a synchronisation
    unit of its own (Split-Merge), cut with its subgraphs into the sequential run, and the branch-parallel stages
    give the model's bits with both kernel sets."""
    import numpy as np
    import tensorflow as tf

    from edgeplan.graph.branches import from_tflite, structure
    from edgeplan.plan.parallax import measure, stage
    from edgeplan.quantize.tflite_graph import TfliteGraph

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 4], tf.float32)])
    def f(x):
        _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 0.5 + 0.1), [tf.constant(0), tf.nn.relu(x)])
        return y + tf.nn.sigmoid(x)

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()])
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    conv.representative_dataset = lambda: ([rng.random((1, 8, 8, 4), np.float32)] for _ in range(10))
    graph = TfliteGraph(conv.convert())
    (loop,) = [op.index for op in graph.ops if op.name == "WHILE"]
    s = structure(from_tflite(graph))
    assert next(b.kind for b in s.branches if loop in b.nodes) == "control"
    settings = dict(params_mod.load(None)["parallax"], min_nodes=1, beta=100.0, repeats=2, force=True)
    plan, _ = stage.plan_target(graph, settings, 1 << 30)
    assert plan.parallel_layers == 1 and any(loop in ops for st in plan.stages for ops in st.submodels)
    assert stage.identical(graph, measure.runtime_stages(graph, plan, "cf"), 2, 3, 0) == {"reference": True,
                                                                                          "xnnpack": True}
