"""The XGBoost latency predictor: trained on real measured profiles, saved and loaded, used by the pipeline
to fill the suffixes it did not measure (marked `predicted`)."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest

from edgeplan.errors import ProfileError
from edgeplan.pipeline import params as params_mod
from edgeplan.profile import cpu, fleet, run
from edgeplan.profile.features import CONV_KINDS, segment_features
from edgeplan.profile.predictor import (BASE, BLOCK_MIN, BLOCK_WEIGHT, BYTE_FAMILIES, Example, Predictor, additive,
                                        blocks, examples, fit_base, thread_bounds)
from edgeplan.quantize.tflite_graph import TfliteGraph

SETTINGS = cpu.Settings(repeats=20, span_s=0.5, budget_s=2)


@pytest.fixture(scope="module")
def trained(compiled, tmp_path_factory):
    profiles = []
    for name in ("tiny_cnn", "light_squeezenet"):
        root, _, _ = compiled(name)
        d = tmp_path_factory.mktemp(name) / "1"
        shutil.copytree(root, d)
        dc = fleet.load(params_mod.DEFAULTS).device_class("coral-usb-emulated")
        profiles.append(run.profile(d, dc, SETTINGS, cpu_prefixes=True))
    return profiles, Predictor.train(examples(profiles), rounds=100)


def test_round_trip(trained, tmp_path):
    profiles, model = trained
    model.save(tmp_path / "p.json")
    again = Predictor.load(tmp_path / "p.json")
    rows = [(e.features, e.threads, e.cores, e.probe_ms) for e in examples(profiles)]
    assert again.predict_many(rows) == pytest.approx(model.predict_many(rows), rel=1e-6)
    assert again.trained_on == ["light_squeezenet/1", "tiny_cnn/1"]


def test_fits_its_training_data(trained):
    profiles, model = trained
    data = examples(profiles)
    pred = model.predict_many([(e.features, e.threads, e.cores, e.probe_ms) for e in data])
    # a time under a millisecond can double when the shared host is busy while it is measured: those count in
    # the median only
    errors = sorted(abs(p / e.ms - 1) for p, e in zip(pred, data) if e.ms >= 0.5)
    big = [(p, e.ms) for p, e in zip(pred, data) if e.ms >= 1.0]
    assert big and all(abs(p / m - 1) < 0.5 for p, m in big)
    assert errors[len(errors) // 2] < 0.25


def test_prediction_scales_with_the_runs_probe(trained):
    """A run on a machine twice as slow (its probe twice as long) gets predictions twice as long."""
    profiles, model = trained
    f = profiles[1].segment(0, "suffix").features
    base = model.predict_ms(f, 1, 2, probe_ms=2.0)
    assert model.predict_ms(f, 1, 2, probe_ms=4.0) == pytest.approx(2 * base)
    assert model.predict_ms(f, 1, 2) == pytest.approx(base * model.probe_ms["1"] / 2.0)


def test_sample_and_predict(trained, compiled, tmp_path):
    profiles, model = trained
    root, _, _ = compiled("light_squeezenet")
    d = tmp_path / "sq" / "1"
    shutil.copytree(root, d)
    dc = fleet.load(params_mod.DEFAULTS).device_class("coral-usb-emulated")
    prof = run.profile(d, dc, SETTINGS, predictor=model, sample=3)
    sources = {s.point: {t.source for t in s.cpu} for s in prof.segments if s.role == "suffix"}
    measured = {k for k, v in sources.items() if v == {"measured"}}
    assert measured == run.sample_points(sorted(sources), 3)
    assert all(v == {"predicted"} for k, v in sources.items() if k not in measured)
    rows = {r["point"]: r for r in prof.summary()}
    assert rows[1]["cpu_source"] in ("predicted", "measured")
    assert any(r["source"] == "predicted" for r in rows.values())


def test_bad_predictor_file(tmp_path):
    (tmp_path / "p.json").write_text('{"format": "something-else"}')
    with pytest.raises(ProfileError, match="another format"):
        Predictor.load(tmp_path / "p.json")
    with pytest.raises(ProfileError, match="no such predictor"):
        Predictor.load(tmp_path / "nope.json")


def test_too_little_data():
    with pytest.raises(ProfileError, match="at least 8"):
        Predictor.train([])


def test_the_base_is_a_sum_of_unit_costs():
    """The base's non-negative unit costs, fitted on times that are such a sum, price a segment twice as large
    (every count doubled) at twice the time, past anything it was fitted on."""
    rng = np.random.default_rng(3)
    costs = np.zeros(len(BASE))
    costs[[BASE.index("macs_1x1"), BASE.index("macs_fc"), BASE.index("constant")]] = [2e-8, 5e-9, 0.05]
    rows = rng.uniform(0, 1e8, (40, len(BASE)))
    rows[:, -1] = 1.0
    theta = np.array(fit_base(rows.tolist(), (rows @ costs).tolist()))
    assert (theta >= 0).all()
    big = rows.max(axis=0) * 2
    big[-1] = 1.0
    assert big @ theta == pytest.approx(big @ costs, rel=1e-3)


def test_costs_at_more_threads_stay_between_a_share_and_all_of_the_fewest_threads():
    """At 2 threads a kernel takes between half and all of its 1-thread wall time (in probe units: times the probe
    ratio); the per-op, weight and constant costs are free. A cost the 2-thread times cannot tell apart (two
    columns always equal) lands inside its bounds; one the 1-thread fit priced at 0 stays 0."""
    rng = np.random.default_rng(5)
    ref = np.zeros(len(BASE))
    a, b, c, op = (BASE.index(n) for n in ("macs_1x1", "macs_kx1", "act_bytes_relu", "ops"))
    ref[[a, b, c, op]] = [2e-8, 2e-8, 1e-6, 1e-3]
    low, high = thread_bounds(ref.tolist(), 1, 2, probe_ratio=1.8)
    assert low[a] == pytest.approx(1.8e-8) and high[a] == pytest.approx(3.6e-8)
    assert low[op] == 0 and high[op] == math.inf and low[BASE.index("macs_dw")] == high[BASE.index("macs_dw")] == 0
    rows = rng.uniform(0, 1e8, (40, len(BASE)))
    rows[:, b] = rows[:, a]  # 1x1 and kx1 MACs never apart: unidentifiable
    rows[:, -1] = 1.0
    truth = np.zeros(len(BASE))
    truth[[a, b, c, op]] = [0.9e-8 * 2, 0.9e-8 * 2, 1.8e-6, 3e-3]  # parallel, parallel, serial, slower per op
    free = np.array(fit_base(rows.tolist(), (rows @ truth).tolist()))
    bounded = np.array(fit_base(rows.tolist(), (rows @ truth).tolist(), (low, high)))
    assert all(lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9) for lo, t, hi in zip(low, bounded, high))
    assert bounded[BASE.index("macs_dw")] == 0
    assert rows @ bounded == pytest.approx(rows @ truth, rel=1e-3)
    assert rows @ free == pytest.approx(rows @ truth, rel=1e-3)


def test_profiles_with_the_old_op_families_are_refused(trained):
    profiles, _ = trained
    old = profiles[0]
    seg = next(s for s in old.segments if s.features)
    stale = {k: v for k, v in seg.features.items() if k not in ("ops_mul", "macs_mul", "act_mul")}
    old = dataclasses.replace(old, segments=tuple(dataclasses.replace(s, features=stale) if s is seg else s
                                                  for s in old.segments))
    with pytest.raises(ProfileError, match=r"predate what this edgeplan.s predictor reads .*ops_mul.*profile it again"):
        examples([old])


def test_profiles_without_the_average_pools_outputs_are_refused(trained):
    profiles, _ = trained
    old = profiles[0]
    old = dataclasses.replace(old, segments=tuple(
        dataclasses.replace(s, features={k: v for k, v in s.features.items() if k != "avgpool_outputs"})
        if s.features else s for s in old.segments))
    with pytest.raises(ProfileError, match=r"no avgpool_outputs\); profile it again"):
        examples([old])


def test_the_average_pools_are_priced_by_their_outputs():
    """An int8 3x3 stride-1 average pool and a 2x2 stride-2 one: the base's term is their output elements (the
    window reads stay a feature of their own)."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 4], tf.float32)])
    def f(x):
        a = tf.nn.avg_pool2d(x, 3, 1, "SAME")
        return tf.nn.avg_pool2d(a, 2, 2, "VALID")

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()])
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    conv.representative_dataset = lambda: ([rng.random((1, 8, 8, 4), np.float32)] for _ in range(10))
    feats = segment_features(TfliteGraph(conv.convert()))
    assert feats["ops_avgpool"] == 2
    assert feats["avgpool_outputs"] == 8 * 8 * 4 + 4 * 4 * 4
    assert feats["avgpool_window"] == 8 * 8 * 4 * 9 + 4 * 4 * 4 * 4
    row = additive(feats)
    assert row[BASE.index("avgpool_outputs")] == feats["avgpool_outputs"]
    assert "act_bytes_avgpool" not in BASE and len(row) == len(BASE)


def test_a_predictor_file_without_its_base_is_refused(trained, tmp_path):
    _, model = trained
    model.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    for bad in (None, {}, {"1": [1.0]}, {"1": [-1.0] * len(BASE)}, {"x": [0.0] * len(BASE)}):
        data["base"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(ProfileError, match="base .* is missing or malformed"):
            Predictor.load(tmp_path / "bad.json")


def test_a_prediction_takes_tree_weight_of_the_trees_correction(trained, tmp_path):
    """Weight 0 is the base alone; the default is the geometric mean of the base's prediction and the full one; a
    file without a weight in [0, 1] is refused in one line."""
    profiles, model = trained
    data = examples(profiles)
    rows = [(e.features, e.threads, e.cores, e.probe_ms) for e in data[:6]]
    assert model.params["tree_weight"] == 0.5
    full = Predictor.train(data, rounds=30, tree_weight=1.0).predict_many(rows)
    base = Predictor.train(data, rounds=30, tree_weight=0.0).predict_many(rows)
    half = Predictor.train(data, rounds=30).predict_many(rows)
    assert half == pytest.approx([math.sqrt(f * b) for f, b in zip(full, base)], rel=1e-5)
    assert any(abs(f / b - 1) > 1e-3 for f, b in zip(full, base))
    with pytest.raises(ProfileError, match="tree_weight must be within"):
        Predictor.train(data, tree_weight=1.5)
    model.save(tmp_path / "p.json")
    saved = json.loads((tmp_path / "p.json").read_text())
    for bad in (None, "0.5", 2.0, True):
        saved["params"]["tree_weight"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(saved))
        with pytest.raises(ProfileError, match=r"bad.json: its tree_weight is missing or not within \[0, 1\]"):
            Predictor.load(tmp_path / "bad.json")


def test_a_predictor_file_without_its_boosters_is_refused(trained, tmp_path):
    _, model = trained
    assert len(model.boosters) == 5 and model.params["members"] == 5
    model.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    for bad in (None, [], ["x"]):
        data["boosters"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(ProfileError, match="boosters are missing or malformed"):
            Predictor.load(tmp_path / "bad.json")
    data["boosters"] = [{"learner": "nonsense"}]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"its booster 0 is not an XGBoost model; retrain it"):
        Predictor.load(tmp_path / "bad.json")
    assert (tmp_path / "p.json").is_file() and Predictor.load(tmp_path / "p.json").boosters  # the good file still loads


def _example(point: int, ms: float, counts: dict, model: str = "net", role: str = "suffix") -> Example:
    zero = [f"macs_kind_{kind}" for kind in CONV_KINDS] + ["macs_fc"] + [f"act_{fam}" for fam in BYTE_FAMILIES]
    features = {**{k: 0.0 for k in zero + ["avgpool_outputs", "ops", "param_bytes"]}, **counts}
    return Example(model, point, role, 1, 2, features, ms, probe_ms=2.0)


def test_blocks_are_what_one_segment_runs_beyond_the_next():
    """Consecutive suffixes of one model: each pair's difference (counts and probe-unit time) is a block; a pair
    whose smaller segment is not inside the larger, or whose difference is under BLOCK_MIN of the larger's time, is
    not; other models, roles and thread counts are kept apart."""
    mac = f"macs_kind_{CONV_KINDS[0]}"
    data = [_example(1, 10.0, {mac: 1e8, "ops": 30}), _example(2, 6.0, {mac: 6e7, "ops": 20}),
            _example(3, 5.8, {mac: 5.8e7, "ops": 19}),  # 0.2 ms of 6: under BLOCK_MIN
            _example(4, 2.0, {mac: 2e7, "ops": 25}),  # more ops than suffix 3: not inside it
            _example(1, 9.0, {mac: 9e7}, role="prefix"), _example(1, 4.0, {mac: 4e7}, model="other"),
            dataclasses.replace(_example(2, 1.0, {mac: 1e7}), threads=2)]
    rows, times = blocks(data, 1)
    assert BLOCK_MIN == 0.1
    assert times == [pytest.approx(2.0)]  # (10 - 6) ms at a 2 ms probe
    assert rows == [pytest.approx(np.array(additive(data[0].features)) - np.array(additive(data[1].features)))]
    assert blocks(data, 2) == ([], [])


def test_a_row_weighted_zero_does_not_move_the_fit_and_blocks_enter_at_block_weight(trained):
    rng = np.random.default_rng(4)
    costs = np.zeros(len(BASE))
    costs[[BASE.index("macs_1x1"), BASE.index("ops"), BASE.index("constant")]] = [2e-8, 1e-3, 0.05]
    rows = rng.uniform(0, 1e8, (30, len(BASE)))
    rows[:, -1] = 1.0
    times = (rows @ costs).tolist()
    alone = fit_base(rows.tolist(), times)
    wrong = rows[0] * 3
    assert fit_base(rows.tolist() + [wrong.tolist()], times + [1.0], weights=[1.0] * 30 + [0.0]) == pytest.approx(alone)
    assert fit_base(rows.tolist() + [wrong.tolist()], times + [1.0]) != pytest.approx(alone)
    profiles, model = trained
    data = examples(profiles)
    assert model.params["block_weight"] == BLOCK_WEIGHT > 0
    none = Predictor.train(data, rounds=5, block_weight=0.0)
    ones = [additive(e.features) for e in data if e.threads == 1]
    assert none.base["1"] == pytest.approx(fit_base(ones, [e.ms / (e.probe_ms or 1.0) for e in data if e.threads == 1]))
    more_rows, more_times = blocks(data, 1)
    assert more_rows
    assert model.base["1"] == pytest.approx(fit_base(ones + more_rows, [e.ms / (e.probe_ms or 1.0) for e in data
                                                                        if e.threads == 1] + more_times,
                                                     weights=[1.0] * len(ones) + [BLOCK_WEIGHT] * len(more_rows)))
    for bad in (-1.0, math.nan):
        with pytest.raises(ProfileError, match="block_weight must be at least 0"):
            Predictor.train(data, block_weight=bad)
