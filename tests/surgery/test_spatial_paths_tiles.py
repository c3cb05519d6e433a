"""Int8 tiles of multi-path ADaPS plans (path analysis, §4.2): per sub-block, a merge's inputs received from
whichever device computed their rows, several tensors gathered at the region's end — the whole int8 model's bits,
with both kernel sets, on a residual CNN and on MobileNetV2 (SAME and VALID stride-2 convolutions, ten residual
merges), along H and W, on searched plans and random ones with overlaps."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from edgeplan.errors import PlanError
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial.cost import Device
from edgeplan.plan.spatial.paths import analyse, search_paths
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery import spatial
from edgeplan.surgery import spatial_paths as sp
from test_spatial_tiles import random_plan  # (same directory: on sys.path under pytest's default import mode)

AXIS = {"H": 1, "W": 2}


@pytest.fixture(scope="module")
def models(compiled):
    out = {}
    for name in ("tiny_cnn", "mobilenetv2_0.35_96"):
        d, _, _ = compiled(name)
        out[name] = (GraphView(onnx.load(str(d / "model.onnx"))), TfliteGraph((d / "model_int8.tflite").read_bytes()),
                     d / "model.onnx")
    return out


def _check(graph: TfliteGraph, paths, plan, dim: str) -> tuple[sp.PathTiling, dict]:
    t = sp.tiling(graph, paths, plan, AXIS[dim])
    blob = sp.segments(graph, t)
    table = sp.tables(graph, t, [{"key": f"k{i}"} for i in range(len(plan[0]))], dict.fromkeys(blob, "0" * 64))
    return t, spatial.verify(table, blob, graph.data, samples=2, seed=len(plan[0]))


def test_the_int8_region_is_the_float_one_layer_for_layer(models):
    for view, graph, _ in models.values():
        paths = analyse(view, "H")
        found = sp.int8_layers(graph, 1)
        hits = sp.match(paths, found, graph, 1)
        assert len(found) == len(paths.layers) and sorted(hits) == list(range(len(found)))
        for f, j in zip(paths.layers, hits):
            assert (found[j].chain.kernel, found[j].chain.stride) == (f.layer.window.kernel, f.layer.window.stride)
    view, graph, _ = models["mobilenetv2_0.35_96"]
    paths = analyse(view, "H")
    assert len(paths.blocks) == 21 and sum(len(x.inputs) > 1 for x in paths.layers) == 10


@pytest.mark.parametrize("name,dim,n,seed", [("tiny_cnn", "H", 2, 0), ("tiny_cnn", "W", 3, 1), ("tiny_cnn", "H", 4, 2),
                                             ("mobilenetv2_0.35_96", "H", 2, 3), ("mobilenetv2_0.35_96", "W", 3, 4),
                                             ("mobilenetv2_0.35_96", "H", 3, 5)])  # (its last maps: 3 rows)
def test_random_plans_give_the_int8_models_bits(models, name, dim, n, seed):
    """... and the float tiles, cut the same way (a merge's tile reading the same rows of both its inputs), the
    whole float model's values exactly."""
    from edgeplan.surgery import spatial_float

    view, graph, onnx_path = models[name]
    paths = analyse(view, dim)
    plan = random_plan([x.layer.out_size for x in paths.layers], n, np.random.default_rng(seed))
    t, check = _check(graph, paths, plan, dim)
    assert check == {"int8_identical_builtin": 1.0, "int8_identical_xnnpack": 1.0}
    floats = spatial_float.verify(onnx_path, paths, t, graph, samples=2, seed=seed)
    assert floats["float_max_abs_diff"] == 0.0 and floats["float_values_compared"] > 0
    assert sorted(floats["float_max_abs_diff_by_layer"]) == sorted({k for g in t.groups for k in g.outputs})
    merges = [g for g in t.groups if len(t.layers[g.layers[0]].inputs) > 1]
    assert (len(merges) >= n) if name == "mobilenetv2_0.35_96" else merges  # every device runs merges
    assert len(t.gathered) == 1 and t.suffix


@pytest.mark.parametrize("n", [2, 3])
def test_a_searched_plan_gives_the_int8_models_bits(models, n):
    view, graph, _ = models["mobilenetv2_0.35_96"]
    paths = analyse(view, "H")
    devices = tuple(Device(f"d{i}", (4 + 5 * i) * 1e-12, 1.25e6, 1e-4) for i in range(n))
    plan = search_paths(paths, devices, 0.15)
    _, check = _check(graph, paths, list(plan.partitions), "H")
    assert min(check.values()) == 1.0


def test_a_float_layer_the_int8_model_lacks_is_named(models):
    view, graph, _ = models["tiny_cnn"]
    paths = analyse(view, "H")
    x = paths.layers[2]
    wrong = dataclasses.replace(x, layer=dataclasses.replace(
        x.layer, window=dataclasses.replace(x.layer.window, kernel=5, pad_begin=2, pad_end=2)))
    bad = dataclasses.replace(paths, layers=(*paths.layers[:2], wrong, *paths.layers[3:]))
    with pytest.raises(PlanError, match="layer 'conv3' .*no int8 layer of the same window"):
        sp.match(bad, sp.int8_layers(graph, 1), graph, 1)
