"""The SwapLess analytic model and allocators: the paper's equations on hand-computed cases, infeasible
configurations, and the allocators against the exact optimum on generated instances (hypothesis)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeplan.plan.swapless import allocate, baselines, queueing
from edgeplan.plan.swapless.instance import Config, Instance, ModelSpec

MB = 1 << 20


def model(name="m", rate=50.0, P=2, tpu=0.002, cpu=0.01, io=0.0005, load=0.004, foot=3 * MB, spread=()):
    """A model whose prefix grows linearly with p and whose suffix shrinks: p=0 all CPU, p=P all TPU.
    ``spread``: factors that turn every service time into samples (empty: deterministic)."""
    s_tpu = tuple(tpu * p for p in range(P + 1))
    s_cpu = tuple(cpu * (P - p) / P for p in range(P + 1))
    return ModelSpec(
        name, rate, s_tpu,
        tuple(io if p else 0.0 for p in range(P + 1)),
        tuple(load * p / P for p in range(P + 1)),
        tuple(int(foot * p / P) for p in range(P + 1)),
        s_cpu,
        tuple(tuple(x * f for f in spread) if p else () for p, x in enumerate(s_tpu)) if spread else (),
        tuple(tuple(x * f for f in spread) if p < P else () for p, x in enumerate(s_cpu)) if spread else (),
    )


def test_paper_equations_by_hand():
    m = model(rate=50.0)
    inst = Instance((m,), 2, 8 * MB)
    ev = queueing.evaluate(inst, Config((1,), (2,)), "paper")
    s_tpu, s_cpu, io = 0.002, 0.005, 0.0005
    w_tpu = 50 * s_tpu**2 / (2 * (1 - 50 * s_tpu))  # eq. (1), alpha = 0 (one model)
    w_cpu = 0.5 * (1 / (2 / s_cpu - 50) - 1 / (2 / s_cpu))  # eq. (3)
    assert ev.latency[0] == pytest.approx(io + w_tpu + s_tpu + w_cpu + s_cpu)  # eq. (4): d_in/B + d_out/B = io
    assert ev.objective == pytest.approx(50 * ev.latency[0])  # eq. (5)


def test_alpha_paper_and_lru():
    a, b = model("a", rate=30.0, foot=6 * MB), model("b", rate=10.0, foot=6 * MB)
    inst = Instance((a, b), 2, 8 * MB)
    # eq. (10): W(P) = 12 MB > C: alpha_i = 1 - lambda_i / lambda_TPU
    assert queueing.alpha_paper(inst, (2, 2)) == pytest.approx([0.25, 0.75])
    # LRU by model: a is evicted iff a b request came since a's last one: 1 - pi_a, here the same
    assert queueing.alpha_lru(inst, (2, 2)) == pytest.approx([0.25, 0.75])
    # both fit: no misses
    assert queueing.alpha_paper(inst, (1, 1)) == [0.0, 0.0] and queueing.alpha_lru(inst, (1, 1)) == [0.0, 0.0]
    # three models, any two fit: evicted only when both others came in between (the paper's bound is looser)
    c = model("c", rate=20.0, foot=6 * MB)
    three = Instance((a, b, c), 2, 13 * MB)
    lru = queueing.alpha_lru(three, (1, 1, 1))
    assert all(x == 0 for x in lru)  # 3 MB each at p=1: all fit
    lru = queueing.alpha_lru(three, (2, 2, 2))
    paper = queueing.alpha_paper(three, (2, 2, 2))
    pa, pb, pc = 0.5, 1 / 6, 1 / 3
    # a evicted iff both b and c appear before the next a: 1 - pa/(1-pb) - pa/(1-pc) + pa
    assert lru[0] == pytest.approx(1 - pa / (1 - pb) - pa / (1 - pc) + pa)
    assert all(x <= y + 1e-12 for x, y in zip(lru, paper))


def test_unstable_is_infinite_and_names_the_bottleneck():
    m = model(rate=300.0, tpu=0.002, cpu=0.01)
    inst = Instance((m,), 1, 8 * MB)
    ev = queueing.evaluate(inst, Config((0,), (1,)))
    assert not ev.feasible and math.isinf(ev.objective) and ev.bottleneck.startswith("CPU pool of m")
    ev = queueing.evaluate(inst, Config((2,), (0,)))  # 300/s x 4 ms on the TPU: rho = 1.2
    assert not ev.feasible and ev.bottleneck == "TPU" and all(math.isinf(t) for t in ev.latency)


def test_refined_reads_the_samples_mean_and_spread():
    """With samples, refined uses their mean (the queue's load) and SCV (P-K for one core); paper the median."""
    m = model(rate=40.0, P=1, cpu=0.01, spread=(0.5, 1.0, 1.0, 2.5))  # median 0.01, mean 0.0125
    inst = Instance((m,), 1, 8 * MB)
    mean, var = 0.0125, ((0.005 - 0.0125) ** 2 + 2 * (0.01 - 0.0125) ** 2 + (0.025 - 0.0125) ** 2) / 4
    rho = 40.0 * mean
    pk = 40.0 * (var + mean**2) / (2 * (1 - rho))  # M/G/1 by Pollaczek-Khinchine
    assert queueing.evaluate(inst, Config((0,), (1,))).latency[0] == pytest.approx(pk + mean)
    paper = queueing.evaluate(inst, Config((0,), (1,)), "paper").latency[0]
    assert paper == pytest.approx(0.5 * (1 / (1 / 0.01 - 40.0) - 1 / (1 / 0.01)) + 0.01)


def test_mdc_refined_against_exact_md1():
    # c = 1: Cosmetatos' correction vanishes and M/D/1 is exact (P-K)
    lam, s = 60.0, 0.01
    assert queueing.wait_mdc(lam, s, 1) == pytest.approx(lam * s * s / (2 * (1 - lam * s)))
    # eq. (3) with k = 1 is M/D/1 too
    assert queueing.wait_eq3(lam, s, 1) == pytest.approx(lam * s * s / (2 * (1 - lam * s)))


def test_check_config_constraints():
    inst = Instance((model("a"), model("b")), 2, 8 * MB)
    queueing.check_config(inst, Config((0, 2), (2, 0)))
    with pytest.raises(ValueError, match=r"\(8\)"):
        queueing.check_config(inst, Config((0, 2), (1, 1)))
    with pytest.raises(ValueError, match=r"\(9\)"):
        queueing.check_config(inst, Config((0, 0), (2, 1)))
    with pytest.raises(ValueError, match=r"\(6\)"):
        queueing.check_config(inst, Config((3, 0), (0, 1)))


def test_propalloc():
    inst = Instance((model("a", rate=10.0), model("b", rate=30.0)), 4, 8 * MB)
    assert allocate.propalloc(inst, (0, 0)) == (1, 3)
    assert allocate.propalloc(inst, (2, 0)) == (0, 4)
    assert allocate.propalloc(Instance(inst.models, 1, 8 * MB), (0, 0)) is None


def test_more_models_than_cores_is_legal():
    ms = tuple(model(f"m{i}", rate=20.0, P=4, foot=2 * MB) for i in range(3))
    inst = Instance(ms, 1, 8 * MB)
    paper = allocate.greedy(inst)
    # Algorithm 1 is stuck: every move of one or two layers leaves three suffixes for one core
    assert paper.config is None
    ref = allocate.refined(inst)
    opt = allocate.exact(inst)
    assert ref.config is not None and opt.config is not None
    queueing.check_config(inst, ref.config)
    assert sum(p == m.last for p, m in zip(ref.config.points, ms)) >= 1


@st.composite
def instances(draw):
    n = draw(st.integers(1, 3))
    cores = draw(st.integers(1, 3))
    ms = []
    for i in range(n):
        P = draw(st.integers(1, 4))
        ms.append(model(f"m{i}", rate=draw(st.floats(5.0, 120.0)), P=P, tpu=draw(st.floats(0.0005, 0.004)),
                        cpu=draw(st.floats(0.002, 0.03)), foot=draw(st.integers(1, 8)) * MB,
                        spread=draw(st.sampled_from([(), (0.8, 0.9, 1.0, 1.6)]))))
    return Instance(tuple(ms), cores, 8 * MB)


@settings(max_examples=60, deadline=None)
@given(instances())
def test_refined_close_to_exact(inst):
    opt = allocate.exact(inst)
    ref = allocate.refined(inst)
    if opt.config is None:
        assert ref.config is None
        return
    assert ref.config is not None  # feasible whenever a feasible allocation exists
    queueing.check_config(inst, ref.config)
    assert ref.objective == pytest.approx(queueing.evaluate(inst, ref.config).objective)
    assert ref.objective >= opt.objective * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(instances(), st.sampled_from(["refined", "paper"]), st.booleans())
def test_batch_scorer_matches_the_scalar_model(inst, variant, use_alpha):
    """The vectorised scorer the refined search uses gives, for every partitioning, the objective of the
    scalar model with the DP's best cores, an allocation that attains it, and unstable keys above all."""
    import itertools

    import numpy as np

    from edgeplan.plan.swapless.batch import UNSTABLE, BatchScorer

    points = list(itertools.product(*(range(m.last + 1) for m in inst.models)))
    key, objective, cores = BatchScorer(inst, variant, use_alpha).score(np.array(points), with_cores=True)
    for p, k, o, ks in zip(points, key, objective, cores):
        tpu = queueing.tpu_state(inst, p, variant, use_alpha)
        cost, best = allocate.best_cores(inst, p, tpu, variant) if tpu.feasible else (math.inf, None)
        if best is None:
            assert o == math.inf and k >= UNSTABLE
            continue
        expected = sum(m.rate * t for m, t in zip(inst.models, tpu.part)) + cost
        assert o == pytest.approx(expected, rel=1e-9) and k == o
        config = Config(p, tuple(int(x) for x in ks))
        queueing.check_config(inst, config)
        assert queueing.evaluate(inst, config, variant, use_alpha).objective == pytest.approx(o, rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(instances(), st.floats(0.5, 2.0))
def test_rate_variants_share_their_rate_free_rows(inst, factor):
    """``with_rate`` copies share the per-point rows the batch scorer derives (made once per model: the runtime
    re-allocates the same models as rates drift) and score exactly as models built afresh at those rates."""
    import itertools

    import numpy as np

    from edgeplan.plan.swapless.batch import BatchScorer

    allocate.refined(inst)  # derives the rows
    drifted = inst.with_rates([r * factor for r in inst.rates])
    fresh = Instance(tuple(ModelSpec(m.name, m.rate, m.s_tpu, m.io, m.t_load, m.footprint, m.s_cpu, m.tpu_samples,
                                     m.cpu_samples) for m in drifted.models), inst.cores, inst.capacity)
    assert all(d.derived and d.derived is m.derived for d, m in zip(drifted.models, inst.models))
    assert not any(m.derived for m in fresh.models)
    points = np.array(list(itertools.product(*(range(m.last + 1) for m in inst.models))))
    for a, b in zip(BatchScorer(drifted).score(points), BatchScorer(fresh).score(points)):
        np.testing.assert_array_equal(a, b)


def test_refined_mostly_optimal():
    """Over 150 generated instances (fixed seed): within 2% of the optimum on at least 90% of them."""
    import random

    rng = random.Random(11)
    close = total = 0
    for _ in range(150):
        n, cores = rng.randint(1, 3), rng.randint(1, 3)
        inst = Instance(tuple(model(f"m{i}", rate=rng.uniform(5, 120), P=rng.randint(1, 5),
                                    tpu=rng.uniform(0.0005, 0.004), cpu=rng.uniform(0.002, 0.03),
                                    foot=rng.randint(1, 8) * MB) for i in range(n)), cores, 8 * MB)
        opt = allocate.exact(inst)
        if opt.config is None:
            continue
        total += 1
        close += allocate.refined(inst).objective <= opt.objective * 1.02
    assert total > 100 and close / total >= 0.9, (close, total)


@settings(max_examples=30, deadline=None)
@given(instances(), st.integers(0, 2**32 - 1))
def test_refined_warm_starts(inst, seed):
    """From given starts (the online case; the search adds every model at its first point), it ends no worse
    than any start and no better than the optimum; a start that is not a partitioning of the models is
    refused."""
    import random

    rng = random.Random(seed)
    starts = [tuple(rng.randint(0, m.last) for m in inst.models) for _ in range(2)]
    warm = allocate.refined(inst, starts=starts)
    opt = allocate.exact(inst)
    for s in starts:
        tpu = queueing.tpu_state(inst, s)
        cost, _ = allocate.best_cores(inst, s, tpu) if tpu.feasible else (math.inf, None)
        start = sum(m.rate * t for m, t in zip(inst.models, tpu.part)) + cost if tpu.feasible else math.inf
        assert warm.objective <= start * (1 + 1e-9) or not math.isfinite(start)
    assert warm.objective >= opt.objective * (1 - 1e-9)
    with pytest.raises(ValueError, match="not a partitioning"):
        allocate.refined(inst, starts=[tuple(m.last + 1 for m in inst.models)])


@settings(max_examples=30, deadline=None)
@given(instances())
def test_exact_is_a_lower_bound_of_greedy(inst):
    opt = allocate.exact(inst, "paper")
    g = allocate.greedy(inst, "paper")
    if g.config is not None:
        assert g.objective >= opt.objective * (1 - 1e-9)


def test_baselines():
    # the last block costs the same on the CPU as on the TPU (within 10%): threshold offloads it, not the rest
    m = ModelSpec("m", 20.0, (0.0, 0.001, 0.002, 0.003), (0.0, 0.0005, 0.0005, 0.0005), (0.0, 0.001, 0.002, 0.003),
                  (0, MB, 2 * MB, 3 * MB), (0.030, 0.020, 0.00105, 0.0))
    inst = Instance((m,), 2, 8 * MB)
    config, objective = baselines.threshold(inst)
    assert config.points == (2,) and config.cores == (2,) and math.isfinite(objective)
    config, objective = baselines.compiler_default(inst)
    assert config.points == (3,) and config.cores == (0,)
    assert objective == pytest.approx(queueing.evaluate(inst, config).objective)
    # alpha = 0 plans as if two models that do not fit together never evicted each other
    a, b = model("a", rate=40.0, foot=6 * MB), model("b", rate=40.0, foot=6 * MB)
    two = Instance((a, b), 2, 8 * MB)
    config, objective = baselines.alpha_zero(two)
    assert objective >= allocate.exact(two).objective - 1e-12


# MobileNetV2 at 224 as profiled here for coral-usb-emulated (analysis.max_points 10: 12 points; TPU times
# EMULATED, CPU times measured): the TPU time jumps at the first layer and is nearly flat after it, the CPU
# suffix falls steeply. ms, and bytes for the footprint.
MOBILENETV2 = {
    "s_tpu": (0.0, 1.754, 1.816, 1.821, 1.839, 1.856, 1.864, 1.864, 1.881, 1.903, 1.903, 1.905),
    "io": (0.0, 0.339, 0.357, 0.317, 0.317, 0.317, 0.395, 0.395, 0.332, 0.426, 0.304, 0.303),
    "t_load": (0.0, 0.634, 1.247, 1.433, 2.081, 2.73, 3.045, 3.07, 3.687, 4.516, 4.516, 7.076),
    "s_cpu": (6.636, 1.938, 1.105, 1.061, 0.85, 0.625, 0.543, 0.496, 0.347, 0.145, 0.124, 0.0),
}
MOBILENETV2_FOOTPRINT = (0, 317120, 623744, 716544, 1040704, 1364864, 1522304, 1534784, 1843264, 2257984, 2257992,
                         3537992)


def test_refined_trades_at_four_models_twelve_points():
    """Four tenants of a real profile's shape on four cores, 9 points each: the best configurations
    split every model near its end, one core each, which climbs of single moves miss (they stopped with one
    model wholly on the TPU and another on two cores); trades of TPU load between two models reach them."""
    import random

    ms = {k: tuple(x / 1e3 for x in v) for k, v in MOBILENETV2.items()}
    rng = random.Random(3)
    close = total = 0
    for _ in range(12):
        models = []
        for i in range(4):
            pts = [0, *sorted(rng.sample(range(1, 11), 7)), 11]  # 9 of the 12 points: 6 561 partitionings
            models.append(ModelSpec(f"m{i}", rng.uniform(2, 20), *(tuple(ms[k][p] for p in pts) for k in
                                                                  ("s_tpu", "io", "t_load")),
                                    tuple(MOBILENETV2_FOOTPRINT[p] for p in pts), tuple(ms["s_cpu"][p] for p in pts)))
        inst = Instance(tuple(models), 4, 8 * MB)
        opt = allocate.exact(inst)
        if opt.config is None:
            continue
        ref = allocate.refined(inst)
        assert ref.config is not None
        total += 1
        close += ref.objective <= opt.objective * 1.02
    assert total >= 10 and close == total, (close, total)
