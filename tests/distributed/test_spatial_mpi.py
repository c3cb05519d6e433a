"""ADaPS tiles as real Open MPI ranks on loopback (issue 16, item 7): the head scatters the input rows, each rank
runs its tiles as its rows arrive and sends the rows others read, the head gathers the region and runs the rest;
the outputs are the whole int8 model's and the bytes each rank sends are the tables' bytes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgeplan.distributed import launch
from edgeplan.plan.multidevice import spec
from edgeplan.quantize import litert
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime.stream import invoke_named
from edgeplan.surgery import spatial

PLATFORM = "dev0, cpu, slots=0, host=localhost\ndev1, cpu, slots=1, host=localhost\ndev2, cpu, slots=0, host=localhost\n"



@pytest.fixture(scope="module")
def tiles(compiled, tmp_path_factory):
    """spatial_chain over 3 ranks along W, neighbours sharing rows at some layers."""
    d, _, _ = compiled("spatial_chain")
    graph = TfliteGraph((d / "model_int8.tflite").read_bytes())
    sizes = [x.ops[-1].out_size for x in spatial.chain(graph, 2, 7)]
    plan = []
    for k, size in enumerate(sizes):
        a, b = size // 3, 2 * size // 3
        share = 1 if k % 2 and a > 2 else 0
        plan.append(((0, a), (a - share, b), (b - share, size)))
    out = tmp_path_factory.mktemp("spatial") / "tiles"
    spatial.split(d, plan, list(spec.parse_text(PLATFORM, "platform").devices), out, axis=2)
    return d, out


def test_ranks_give_the_int8_models_outputs(tiles, tmp_path, ranks_left):
    d, out = tiles
    t = json.loads((out / "tables.json").read_text())
    xs = np.random.default_rng(3).integers(-128, 127, (12, *t["input"]["shape"]), endpoint=True).astype(np.int8)
    np.save(tmp_path / "x.npy", xs)
    r = launch.run(out, frames=12, timeout_s=120, extra=["--inputs", str(tmp_path / "x.npy"), "--out",
                                                         str(tmp_path / "y.npy")])
    whole = litert.interpreter((d / "model_int8.tflite").read_bytes(), deterministic=False)
    want = np.stack([invoke_named(whole, {t["input"]["name"]: x})[t["output"]["name"]] for x in xs])
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    per_frame = {r: 0 for r in range(3)}
    for b in t["buffers"].values():
        per_frame[b["sender"]] += b["nbytes"]
    assert {k["rank"]: k["sent_bytes"] for k in r.summary["ranks"]} == {k: v * 12 for k, v in per_frame.items()}
    assert not ranks_left()


def _reversed_keep(t: dict) -> None:
    s = next(s for s in t["stages"] if s["tile"]["outputs"])
    next(iter(s["tile"]["outputs"].values()))["keep"] = [5, 2]


@pytest.mark.parametrize("edit,says", [
    (_reversed_keep, r"output '.*': bad rows \[5, 2\]"),
    (lambda t: next(iter(t["buffers"].values())).update(rows=[0, 999]), r"is not rows \[0, 999\] of a tensor"),
    (lambda t: t.update(axis=3), "axis 3 is neither"),
])
def test_malformed_tile_tables_are_refused(tiles, edit, says, ranks_left, edited_split):
    _, out = tiles
    bad = edited_split(out, edit)
    with pytest.raises(launch.DistributedError, match=rf"rank \d on \S+: tables.json.*{says}"):
        launch.run(bad, frames=2, timeout_s=60)
    assert not ranks_left()


def test_a_multi_path_plan_runs_as_ranks(compiled, tmp_path, ranks_left):
    """tiny_cnn's residual region (path analysis: three sub-blocks, one merge) over 3 ranks along H: the merge's
    second input comes from whichever rank computed its rows; the outputs are the whole int8 model's."""
    import onnx

    from edgeplan.graph.model import GraphView
    from edgeplan.plan.spatial.cost import Device
    from edgeplan.plan.spatial.paths import analyse, search_paths

    d, _, _ = compiled("tiny_cnn")
    paths = analyse(GraphView(onnx.load(str(d / "model.onnx"))), "H")
    devices = tuple(Device(f"d{i}", (4 + 4 * i) * 1e-12, 1.25e6, 1e-4) for i in range(3))
    plan = list(search_paths(paths, devices, 0.15).partitions)
    out = tmp_path / "tiles"
    info = spatial.split(d, plan, list(spec.parse_text(PLATFORM, "platform").devices), out, paths=paths)
    assert {k: v for k, v in info["verify"].items() if k.startswith("int8_")} == {"int8_identical_builtin": 1.0,
                                                                                  "int8_identical_xnnpack": 1.0}
    assert info["verify"]["float_max_abs_diff"] == 0.0  # its float tiles too, a merge's included
    t = json.loads((out / "tables.json").read_text())
    assert any(len(s["inputs"]) == 2 for s in t["stages"])  # the merge
    xs = np.random.default_rng(4).integers(-128, 127, (6, *t["input"]["shape"]), endpoint=True).astype(np.int8)
    np.save(tmp_path / "x.npy", xs)
    launch.run(out, frames=6, timeout_s=120, extra=["--inputs", str(tmp_path / "x.npy"), "--out",
                                                    str(tmp_path / "y.npy")])
    whole = litert.interpreter((d / "model_int8.tflite").read_bytes(), deterministic=False)
    want = np.stack([invoke_named(whole, {t["input"]["name"]: x})[t["output"]["name"]] for x in xs])
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    assert not ranks_left()
