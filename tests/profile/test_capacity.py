"""Load capacity: the measured run on a real model's layers, the C_l rule, and the XGBoost slowdown model."""
from __future__ import annotations

import os

import pytest

from edgeplan.profile import capacity as cap
from edgeplan.profile.capacity_model import SlowdownModel, capacities
from edgeplan.profile.cpu import PROBE
from edgeplan.profile.features import segment_features
from edgeplan.quantize import stream
from edgeplan.quantize.tflite_graph import TfliteGraph


def test_operator_classes_follow_table_5():
    assert [cap.op_class(op) for op in ("CONV_2D", "FULLY_CONNECTED", "SOFTMAX", "MEAN", "ADD", "RELU")] == [
        "reusable", "reusable", "hierarchical", "hierarchical", "elemental", "elemental"]


def _layer(op_class: str, slow: list[float], alone_ms: float = 2.0) -> cap.LayerLoad:
    """A layer whose measured times give exactly ``slow`` (per rate, then beside a build)."""
    return cap.LayerLoad(0, "l", "CONV_2D", op_class, 1000, 2000, alone_ms,
                         tuple(alone_ms * (1 + s) for s in slow[:-1]), alone_ms * (1 + slow[-1]), 0.5)


def test_capacity_is_the_fastest_rate_within_the_class_threshold():
    rates = (50.0, 200.0, 800.0)
    chunk = 64 * 1024
    # reusable (20%): 800 MB/s slows it 50%, 200 MB/s 10% -> 200 MB/s for 2 ms x 1.2 = 480 kB = 7 chunks
    assert cap.capacity(_layer("reusable", [0.05, 0.1, 0.5, 0.1]), rates, chunk) == (7, 2.0)
    # a build that slows it past 20% is not shadowed
    assert cap.capacity(_layer("reusable", [0.05, 0.1, 0.5, 0.6]), rates, chunk) == (7, 0.0)
    # elemental (300%) takes the fastest rate; hierarchical never overlaps
    assert cap.capacity(_layer("elemental", [0.5, 1.0, 2.5, 0.2]), rates, chunk)[0] == int(800e6 * 8e-3 // chunk)
    assert cap.capacity(_layer("hierarchical", [0.0, 0.0, 0.0, 0.0]), rates, chunk) == (0, 0.0)
    # no rate within the threshold: nothing read beside it
    assert cap.capacity(_layer("reusable", [0.3, 0.4, 0.5, 0.0]), rates, chunk) == (0, 2.0)


@pytest.fixture(scope="module")
def measured(compiled, tmp_path_factory):
    d, _, _ = compiled("light_squeezenet")
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    ls = stream.layers(g)
    segs = [(layer.name, layer.op, layer.weight_bytes, stream.cut_range(g, layer.first_op, layer.last_op, "l"))
            for layer in ls]
    scratch = tmp_path_factory.mktemp("capacity") / "scratch.bin"
    scratch.write_bytes(os.urandom(8 << 20))
    run = cap.measure(segs, scratch, PROBE, rounds=2)
    return ls, run, [segment_features(TfliteGraph(s[3])) for s in segs]


def test_a_measured_run_times_every_layer_in_every_condition(measured):
    ls, run, _ = measured
    assert [layer.name for layer in run.layers] == [layer.name for layer in ls]
    assert run.rates_mb_s == cap.RATES_MB_S and run.probe_ms > 0 and run.rounds == 2
    for layer in run.layers:
        assert layer.alone_ms > 0 and layer.beside_build_ms > 0 and layer.build_ms > 0
        assert len(layer.beside_read_ms) == len(run.rates_mb_s) and min(layer.beside_read_ms) > 0
        assert layer.op_class == cap.op_class(layer.op)
        assert layer.arena_bytes > 0  # every layer has activations: its arena, apart from its built memory
    # each layer's build measured on its own: together, what all of them added
    assert sum(layer.built_bytes for layer in run.layers) == pytest.approx(run.rss_built_bytes, rel=0.05)


def test_the_slowdown_model_predicts_every_layer_and_condition(measured):
    _, run, feats = measured
    model = SlowdownModel.fit([(run, feats)], cores=os.cpu_count() or 1)
    pred = model.slowdowns(run, feats)
    assert len(pred) == len(run.layers) and all(len(p) == len(run.rates_mb_s) + 1 for p in pred)
    assert all(s >= 0 for p in pred for s in p)
    measured_c = capacities(run, 64 * 1024)
    predicted_c = capacities(run, 64 * 1024, pred)
    assert len(measured_c) == len(predicted_c) == len(run.layers)
    hier = [i for i, layer in enumerate(run.layers) if layer.op_class == "hierarchical"]
    assert all(predicted_c[i] == (0, 0.0) for i in hier)
