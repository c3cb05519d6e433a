"""The XGBoost latency predictor: trained on real measured profiles, saved and loaded, used by the pipeline
to fill the suffixes it did not measure (marked `predicted`)."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from edgeplan.errors import ProfileError
from edgeplan.pipeline import params as params_mod
from edgeplan.profile import cpu, fleet, run
from edgeplan.profile.predictor import BASE, Predictor, examples, fit_base

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


def test_profiles_with_the_old_op_families_are_refused(trained):
    profiles, _ = trained
    old = profiles[0]
    seg = next(s for s in old.segments if s.features)
    stale = {k: v for k, v in seg.features.items() if k not in ("ops_mul", "macs_mul", "act_mul")}
    old = dataclasses.replace(old, segments=tuple(dataclasses.replace(s, features=stale) if s is seg else s
                                                  for s in old.segments))
    with pytest.raises(ProfileError, match=r"predate the op families .*ops_mul.*profile it again"):
        examples([old])


def test_a_predictor_file_without_its_base_is_refused(trained, tmp_path):
    _, model = trained
    model.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    for bad in (None, {}, {"1": [1.0]}, {"1": [-1.0] * len(BASE)}, {"x": [0.0] * len(BASE)}):
        data["base"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(ProfileError, match="base .* is missing or malformed"):
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
