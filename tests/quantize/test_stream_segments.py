"""Streaming segments: layers cover the int8 model, segment chains (multi-tensor boundaries included) and
channel-split ops give the whole model's bits with both kernel sets."""
from __future__ import annotations

import random
from functools import partial

import numpy as np
import pytest

from edgeplan.errors import CutError
from edgeplan.quantize import litert, stream
from edgeplan.quantize.tflite_graph import TfliteGraph

KERNELS = {"reference": partial(litert.interpreter, deterministic=True),
           "xnnpack": partial(litert.interpreter, deterministic=False)}


def _inputs(graph: TfliteGraph, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {graph.tensors[i].name: rng.integers(-128, 128, graph.tensors[i].shape, dtype=np.int8)
            for i in graph.inputs}


def _whole(data: bytes, x: dict, kernels: str) -> dict[str, np.ndarray]:
    return stream.run_chain([data], x, KERNELS[kernels])


@pytest.mark.parametrize("name", ["tiny_cnn", "light_squeezenet"])
def test_layers_cover_every_op_and_weight_once(compiled, name):
    d, _, _ = compiled(name)
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    ls = stream.layers(g)
    assert ls[0].first_op == 0 and ls[-1].last_op == len(g.ops) - 1
    assert all(b.first_op == a.last_op + 1 for a, b in zip(ls, ls[1:]))
    assert sum(layer.weight_bytes for layer in ls) == sum(g.op_param_bytes)
    assert all(layer.op in stream.WEIGHTED for layer in ls[1:])


@pytest.mark.parametrize("kernels", sorted(KERNELS))
@pytest.mark.parametrize("name", ["tiny_cnn", "light_squeezenet"])
def test_segment_chains_equal_the_int8_model(compiled, name, kernels):
    d, _, _ = compiled(name)
    data = (d / "model_int8.tflite").read_bytes()
    g = TfliteGraph(data)
    x = _inputs(g)
    want = _whole(data, x, kernels)
    n = len(stream.layers(g))
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(1, n), min(3, n - 1)))
    for groups in ([(k, k) for k in range(n)],  # one segment per layer
                   [(a, b - 1) for a, b in zip([0] + cuts, cuts + [n])]):  # merged runs
        segs = stream.segments(g, groups)
        got = stream.run_chain(segs, x, KERNELS[kernels])
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    if name == "tiny_cnn":  # its residual block makes some boundary carry two tensors
        assert max(len(stream.boundary(g, layer.first_op, layer.last_op)[0]) for layer in stream.layers(g)) >= 2


def test_groups_must_cover_the_layers_in_order(compiled):
    d, _, _ = compiled("tiny_cnn")
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    n = len(stream.layers(g))
    with pytest.raises(CutError, match="do not cover"):
        stream.segments(g, [(0, 1), (3, n - 1)])


@pytest.mark.parametrize("kernels", sorted(KERNELS))
def test_splitting_large_ops_along_output_channels_is_bit_identical(compiled, kernels):
    d, _, _ = compiled("light_squeezenet")
    data = (d / "model_int8.tflite").read_bytes()
    g = TfliteGraph(data)
    biggest = max(g.tensors[op.inputs[1]].nbytes for op in g.ops if op.name in stream.SPLITTABLE)
    limit = biggest // 3
    split = stream.split_large_ops(data, limit)
    s = TfliteGraph(split)
    assert all(s.tensors[op.inputs[1]].nbytes <= limit for op in s.ops if op.name in stream.SPLITTABLE)
    assert sum(op.name == "CONCATENATION" for op in s.ops) > sum(op.name == "CONCATENATION" for op in g.ops)
    assert s.param_bytes() == g.param_bytes()  # the unsplit weights are gone, nothing duplicated
    per_channel = [t for t in s.tensors if t.constant and len(t.scale) > 1 and t.name.endswith(("_part0", "_part1"))]
    assert per_channel, "expected per-channel scales split with the weights"
    x = _inputs(g)
    want, got = _whole(data, x, kernels), _whole(split, x, kernels)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    segs = stream.segments(s, [(k, k) for k in range(len(stream.layers(s)))])
    chained = stream.run_chain(segs, x, KERNELS[kernels])
    for k in want:
        np.testing.assert_array_equal(chained[k], want[k])


def test_the_stream_stage_writes_checked_deterministic_segments(compiled, params, tmp_path):
    import copy
    import hashlib
    import shutil

    from edgeplan.artifacts import StreamInfo
    from edgeplan.pipeline import stages

    d, _, _ = compiled("light_squeezenet")
    root = tmp_path / "m"
    shutil.copytree(d, root)
    p = copy.deepcopy(params)
    p["flashmem"]["max_segment_bytes"] = 64 * 1024  # squeezenet's larger convolutions get split
    info = stages.stream(root, p)
    assert info.ok and set(info.identical) == {"reference", "xnnpack"} and info.split_ops
    assert StreamInfo.load(root / "stream" / "stream.json") == info
    for layer in info.layers:
        blob = (root / layer.file).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == layer.sha256 and len(blob) == layer.size
    first = {f.name: f.read_bytes() for f in sorted((root / "stream").rglob("*.tflite"))}
    stages.stream(root, p)  # again: the same bytes (DVC versions them)
    assert {f.name: f.read_bytes() for f in sorted((root / "stream").rglob("*.tflite"))} == first
