"""ADaPS tiles (issue 16, item 6): int8 segments with their inputs resized to a tile's rows, run as the ranks
run them (rows received from whichever rank computed them), give the whole int8 model's bits — for odd heights,
stride-2 SAME and padded windows, a dilated 5x5 and pooling, along H and W, on plans with and without overlaps."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from edgeplan.errors import PlanError
from edgeplan.graph.model import GraphView
from edgeplan.plan.multidevice import spec
from edgeplan.plan.spatial.blocks import region
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery import spatial


@pytest.fixture(scope="module")
def chain_model(compiled):
    d, _, _ = compiled("spatial_chain")
    return d, TfliteGraph((d / "model_int8.tflite").read_bytes())


def random_plan(sizes: list[int], n: int, rng: np.random.Generator) -> list[tuple]:
    """Per layer, ``n`` ordered row ranges covering it; neighbours share up to 3 rows."""
    plan = []
    for size in sizes:
        edges = sorted(rng.choice(np.arange(1, size), n - 1, replace=False).tolist()) + [size]
        parts, start = [], 0
        for d, e in enumerate(edges):
            parts.append((start, e))
            if d + 1 < n:
                start = max(e - int(rng.integers(0, 4)), parts[-1][0] + 1)
        plan.append(tuple(parts))
    return plan


def _check(d, graph, plan, axis):
    t = spatial.tiling(graph, plan, axis)
    blob = spatial.segments(graph, t)
    table = spatial.tables(graph, t, [{"key": f"k{i}"} for i in range(len(plan[0]))], dict.fromkeys(blob, "0" * 64))
    return t, table, spatial.verify(table, blob, graph.data, samples=2, seed=len(plan[0]))


def test_region_folds_pads_and_matches_the_int8_chain(chain_model):
    d, graph = chain_model
    r = region(GraphView(onnx.load(str(d / "model.onnx"))), "H")
    assert len(r.layers) == 7 and "GlobalAveragePool" in r.reason  # the pool's Pad joined the pool
    pool = r.layers[3]
    assert (pool.window.kernel, pool.window.stride, pool.window.pad_begin, pool.window.in_size) == (3, 2, 1, 23)
    layers = spatial.chain(graph, 1, len(r.layers))
    assert [x.ops[-1].out_size for x in layers] == [x.out_size for x in r.layers]
    assert [(x.kernel, x.stride) for x in layers] == [(x.window.kernel, x.window.stride) for x in r.layers]


@pytest.mark.parametrize("axis,n,seed", [(1, 2, 0), (1, 3, 1), (2, 3, 2), (1, 4, 3), (2, 5, 4), (1, 5, 5)])
def test_random_plans_give_the_int8_models_bits(chain_model, axis, n, seed):
    d, graph = chain_model
    sizes = [x.ops[-1].out_size for x in spatial.chain(graph, axis, 7)]
    plan = random_plan(sizes, n, np.random.default_rng(seed))
    t, table, check = _check(d, graph, plan, axis)
    assert check == {"int8_identical_builtin": 1.0, "int8_identical_xnnpack": 1.0}
    for g in t.groups:  # every tile gets right at least its rows of the plan
        for k in range(g.first, g.last + 1):
            v = g.tile.valid[k - g.first]
            assert v[0] <= plan[k][g.device][0] and plan[k][g.device][1] <= v[1]
    moved = spatial.bytes_moved(table)
    assert moved["gather"] == sum(b["nbytes"] for b in table["buffers"].values() if b["receivers"] == [0]
                                  and b["tensor"] == table["stages"][-1]["inputs"][0])


def test_rows_come_from_whichever_device_computed_them(chain_model):
    """Device 1 computes one row: device 2's halo reaches device 0's rows, device 1's reaches device 3's."""
    d, graph = chain_model
    sizes = [x.ops[-1].out_size for x in spatial.chain(graph, 1, 7)]
    plan = [((0, 20), (20, 21), (21, 22), (22, 45)), ((0, 10), (10, 11), (11, 12), (12, 23))]
    plan += [tuple(spatial_even(s, 4)) for s in sizes[2:]]
    t, _, check = _check(d, graph, plan, 1)
    assert min(check.values()) == 1.0
    assert any(abs(m.sender - m.receiver) > 1 for m in t.messages if m.layer >= 0)


def spatial_even(size: int, n: int) -> list[tuple[int, int]]:
    edges = [round(size * (i + 1) / n) for i in range(n)]
    return list(zip([0, *edges[:-1]], edges))


def test_a_misaligned_tile_is_widened_not_wrong():
    """SAME, kernel 3, stride 2 on 45 rows pads 1 before; a tile of 9 rows from row 1 pads 1 too, so its output
    rows would fall between the model's: ``simulate`` refuses it and ``fit`` grows it until aligned."""
    op = spatial.ChainOp(0, 45, 23, kernel=3, stride=2, same=True)
    layer = [spatial.ChainLayer((op,), 0, 3, 2)]
    assert spatial.simulate(layer, (1, 10)) is None
    tile = spatial.fit(layer, [(2, 4)])
    assert tile.valid[0][0] <= 2 and tile.valid[0][1] >= 4
    assert (tile.rows[0] - op.pads(tile.rows[1] - tile.rows[0])[0] + op.pad_begin) % 2 == 0


def test_bad_plans_are_refused(chain_model, tmp_path):
    d, graph = chain_model
    with pytest.raises(PlanError, match="does not cover rows"):
        spatial.tiling(graph, [((0, 20), (25, 45))], 1)
    with pytest.raises(PlanError, match="partitionable layers, the plan 9: it stops at MEAN"):
        spatial.tiling(graph, [((0, 1), (1, 2))] * 9, 1)
    p = spec.parse_text("dev0, cpu, slots=0, host=localhost\n", "platform")
    with pytest.raises(PlanError, match="2 ways, 1 devices"):
        spatial.split(d, [((0, 20), (20, 45))], list(p.devices), tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_split_writes_a_verified_directory(chain_model, tmp_path):
    d, graph = chain_model
    sizes = [x.ops[-1].out_size for x in spatial.chain(graph, 1, 7)]
    p = spec.parse_text("dev0, cpu, slots=0, host=localhost\ndev1, cpu, slots=1, host=localhost\n", "platform")
    plan = [tuple(spatial_even(s, 2)) for s in sizes]
    summary = spatial.split(d, plan, list(p.devices), tmp_path / "s")
    t = json.loads((tmp_path / "s" / "tables.json").read_text())
    assert summary["verify"]["int8_identical_xnnpack"] == 1.0 and t["axis"] == 1
    assert sorted(x.name for x in (tmp_path / "s" / "int8").iterdir()) == sorted(
        s["int8"].split("/")[1] for s in t["stages"])
    assert (tmp_path / "s" / "rankfile").read_text() == "rank 0=localhost slot=0\nrank 1=localhost slot=1\n"


@pytest.mark.parametrize("axis,n,seed", [(1, 2, 0), (2, 3, 2), (1, 5, 5)])
def test_float_tiles_give_the_whole_float_models_values_exactly(chain_model, axis, n, seed):
    """The float tiles, cut as the int8 ones (a SAME window padded as TF pads the tile), each reading the rows the
    tiles before it computed, equal the whole float model at every row they keep: 0 difference."""
    from edgeplan.surgery import spatial_float

    d, graph = chain_model
    view = GraphView(onnx.load(str(d / "model.onnx"), load_external_data=False))
    r = region(view, "H" if axis == 1 else "W")
    sizes = [x.ops[-1].out_size for x in spatial.chain(graph, axis, len(r.layers))]
    t = spatial.tiling(graph, random_plan(sizes, n, np.random.default_rng(seed)), axis)
    check = spatial_float.verify(d / "model.onnx", r, t, graph, samples=2, seed=seed)

    def row(k: int) -> int:  # values in a row of layer k's output (NCHW, the axis one further on than NHWC's)
        shape = view.shape(spatial_float.FloatLayers.of(view, r).outputs[k])
        return int(np.prod(shape)) // shape[axis + 1]

    # every value of every row a group keeps, over both samples
    per_sample = sum((g.tile.valid[k - g.first][1] - g.tile.valid[k - g.first][0]) * row(k)
                     for g in t.groups for k in g.outputs)
    assert check["float_max_abs_diff"] == 0.0
    assert check["float_values_compared"] == 2 * per_sample > 0


def test_a_split_whose_float_tiles_are_misplaced_is_refused(chain_model, tmp_path, monkeypatch):
    """Float tiles padded one row off (their rows land one row away): split says so and writes nothing; padded
    right, the same split is written, its float check beside the int8 one."""
    from edgeplan.surgery import spatial_float

    d, graph = chain_model
    r = region(GraphView(onnx.load(str(d / "model.onnx"), load_external_data=False)), "H")
    sizes = [x.ops[-1].out_size for x in spatial.chain(graph, 1, len(r.layers))]
    p = spec.parse_text("dev0, cpu, slots=0, host=localhost\ndev1, cpu, slots=1, host=localhost\n", "platform")
    plan = [tuple(spatial_even(s, 2)) for s in sizes]
    right = spatial_float.tile_pads
    monkeypatch.setattr(spatial_float, "tile_pads", lambda *a: {k: (b + 1, e - 1) if e else (b - 1, e + 1)
                                                                for k, (b, e) in right(*a).items()})
    with pytest.raises(PlanError, match="float tiles"):
        spatial.split(d, plan, list(p.devices), tmp_path / "s", region=r)
    assert not (tmp_path / "s").exists()
    monkeypatch.setattr(spatial_float, "tile_pads", right)
    summary = spatial.split(d, plan, list(p.devices), tmp_path / "s", region=r)
    assert summary["verify"]["float_max_abs_diff"] == 0.0 and summary["verify"]["int8_identical_builtin"] == 1.0


def test_short_conv_tiles_are_blocked_as_the_whole_tensor_and_exact():
    """onnxruntime's convolution sums a tile of few rows (N = rows x width <= 64 here) in other chunks than the
    whole tensor, so it rounds differently; ``blocked_as_whole`` pads such a tile's input with zero rows until
    MLAS blocks it as the whole tensor, then cuts the output back: the rows kept are the whole model's exactly."""
    from onnx import TensorProto, helper, numpy_helper

    from edgeplan.graph.evaluate import session
    from edgeplan.surgery.spatial_float import blocked_as_whole, sgemm_strides

    rng = np.random.default_rng(0)
    cin, width = 192, 13
    w = numpy_helper.from_array((rng.standard_normal((384, cin, 3, 3)) * 0.05).astype(np.float32), "w")

    def conv(h: int, pads: list[int]) -> onnx.ModelProto:
        g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[3, 3], pads=pads)],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    whole_model = conv(13, [1, 1, 1, 1])
    view = GraphView(onnx.shape_inference.infer_shapes(whole_model))
    x = rng.standard_normal((1, cin, 13, width)).astype(np.float32)
    whole = session(whole_model).run(None, {"x": x})[0]
    assert sgemm_strides(13 * width, 9 * cin) != sgemm_strides(3 * width, 9 * cin)
    differed = 0.0
    for rows in range(1, 8):  # output rows [4, 4 + rows): input rows [3, 5 + rows), no pad along H
        tile = conv(rows + 2, [0, 1, 0, 1])
        part = x[:, :, 3:5 + rows]
        differed = max(differed, float(np.abs(session(tile).run(None, {"x": part})[0] - whole[:, :, 4:4 + rows]).max()))
        blocked = blocked_as_whole(conv(rows + 2, [0, 1, 0, 1]), view, "H")
        padded = sgemm_strides(rows * width, 9 * cin) != sgemm_strides(13 * width, 9 * cin)
        assert [n.op_type for n in blocked.graph.node] == (["Pad", "Conv", "Slice"] if padded else ["Conv"])
        np.testing.assert_array_equal(session(blocked).run(None, {"x": part})[0], whole[:, :, 4:4 + rows])
    assert differed > 0  # without the padding the short tiles do round differently
