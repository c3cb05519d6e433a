"""The simulator against exact queueing results (Pollaczek-Khinchine, Erlang C) and its cache mechanics,
never against the analytic model it is meant to judge."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgeplan.plan.simulate.des import Phase, simulate, simulate_phases
from edgeplan.plan.swapless.instance import Config, Instance, ModelSpec


def single(rate, s_tpu=0.0, s_cpu=0.0, tpu_samples=(), cpu_samples=(), foot=0, t_load=0.0, name="m"):
    """Points 0 (all CPU, suffix s_cpu) and 1 (all TPU, prefix s_tpu)."""
    tpu = ((), tuple(tpu_samples)) if len(tpu_samples) else ()
    cpu = (tuple(cpu_samples), ()) if len(cpu_samples) else ()
    return ModelSpec(name, rate, (0.0, s_tpu), (0.0, 0.0), (0.0, t_load), (0, foot), (s_cpu, 0.0), tpu, cpu)


def close(sim_stats, exact, rel=0.03):
    """Within 3% or within the 95% CI (times 1.5), whichever is wider."""
    tol = max(rel * exact, 1.5 * sim_stats.mean_ci)
    assert abs(sim_stats.mean - exact) <= tol, (sim_stats.mean, exact, tol)


def test_md1_pollaczek_khinchine():
    s, lam = 0.01, 50.0
    res = simulate(Instance((single(lam, s_tpu=s),), 1, 0), Config((1,), (0,)), requests=200_000, seed=1)
    rho = lam * s
    close(res.models[0], s + lam * s * s / (2 * (1 - rho)))
    assert res.tpu_utilisation == pytest.approx(rho, rel=0.03)


def test_mm1_from_exponential_samples():
    s, lam = 0.01, 60.0
    samples = np.random.default_rng(7).exponential(s, 200_000)
    res = simulate(Instance((single(lam, s_tpu=s, tpu_samples=samples),), 1, 0), Config((1,), (0,)),
                   requests=200_000, seed=2, stochastic=True)
    close(res.models[0], samples.mean() / (1 - lam * samples.mean()), rel=0.04)


def erlang_c(c, a):
    top = a**c / math.factorial(c) / (1 - a / c)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize("c, lam", [(2, 50.0), (3, 70.0)])
def test_mmc_erlang_c(c, lam):
    s = 0.03
    samples = np.random.default_rng(3).exponential(s, 200_000)
    m = samples.mean()
    res = simulate(Instance((single(lam, s_cpu=s, cpu_samples=samples),), c, 0), Config((0,), (c,)),
                   requests=200_000, seed=4, stochastic=True)
    a = lam * m
    close(res.models[0], m + erlang_c(c, a) * m / (c - a), rel=0.04)


def test_lru_misses_follow_request_order():
    mb = 1 << 20
    a = single(20.0, s_tpu=0.001, foot=6 * mb, t_load=0.004, name="a")
    b = single(20.0, s_tpu=0.001, foot=6 * mb, t_load=0.004, name="b")
    res = simulate(Instance((a, b), 1, 8 * mb), Config((1, 1), (0, 0)), requests=50_000, seed=5)
    # 50:50 mix, only one fits: a request misses iff the other model was requested since its last one
    for st in res.models:
        assert st.miss_rate == pytest.approx(0.5, abs=0.02)
    fits = simulate(Instance((a, b), 1, 12 * mb), Config((1, 1), (0, 0)), requests=20_000, seed=5)
    assert all(st.miss_rate == 0 for st in fits.models)


def test_tandem_prefix_then_suffix_pool():
    """Light load: the latency is the sum of the services (nothing waits)."""
    m = ModelSpec("m", 1.0, (0.0, 0.002, 0.004), (0.0, 0.0005, 0.0005), (0.0, 0.0, 0.0), (0, 0, 0), (0.01, 0.006, 0.0))
    res = simulate(Instance((m,), 2, 0), Config((1,), (2,)), requests=2000, seed=6)
    assert res.models[0].mean == pytest.approx(0.002 + 0.0005 + 0.006, rel=0.01)
    assert res.models[0].p99 >= res.models[0].p50


def test_phases_switch_points_and_cores_without_losing_a_request():
    """Rates, points and cores change twice mid-run: every request that arrived finishes (the ones in
    flight under the old partition too), and each long phase settles near its own steady state."""
    m = ModelSpec("m", 1.0, (0.0, 0.002, 0.004), (0.0, 0.0005, 0.0005), (0.0, 0.001, 0.002), (0, 1, 2),
                  (0.02, 0.012, 0.0))
    inst = Instance((m,), 3, 1 << 20)
    phases = [Phase(0.0, (60.0,), Config((0,), (3,))),  # all on the CPU, three cores
              Phase(200.0, (120.0,), Config((1,), (2,))),  # split, two cores (one retires when free)
              Phase(400.0, (30.0,), Config((0,), (1,)))]  # back to the CPU, one core
    tl = simulate_phases(inst, phases, 600.0, bin_s=10.0, seed=3)
    assert tl.arrived == tl.completed > 0.9 * (60 * 200 + 120 * 200 + 30 * 200)
    assert len(tl.starts) == 60 and sum(sum(r) for r in tl.requests) == tl.completed
    for k, ph in enumerate(phases):
        steady = simulate(inst.with_rates(ph.rates), ph.config, requests=40_000, seed=4).models[0].mean
        assert tl.phase_mean[k][0] == pytest.approx(steady, rel=0.1), k


def test_phases_bad_input():
    m = ModelSpec("m", 1.0, (0.0, 0.002), (0.0, 0.0), (0.0, 0.0), (0, 0), (0.01, 0.0))
    inst = Instance((m,), 1, 0)
    with pytest.raises(ValueError, match="first starts at 0"):
        simulate_phases(inst, [Phase(1.0, (1.0,), Config((1,), (0,)))], 10.0)
    with pytest.raises(ValueError, match="cores"):
        simulate_phases(inst, [Phase(0.0, (1.0,), Config((0,), (2,)))], 10.0)


def test_phase_to_all_tpu_drains_the_old_suffixes():
    """Switching a loaded model wholly onto the TPU (0 cores) still finishes the suffixes already queued."""
    m = ModelSpec("m", 1.0, (0.0, 0.002, 0.004), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0, 0, 0), (0.02, 0.012, 0.0))
    phases = [Phase(0.0, (140.0,), Config((1,), (2,))), Phase(20.0, (140.0,), Config((2,), (0,)))]
    tl = simulate_phases(Instance((m,), 2, 1 << 20), phases, 40.0, seed=2)
    assert tl.arrived == tl.completed
