"""FlashMem's OPG / LC-OPG against a brute-force oracle that enumerates every plan of small instances.

The oracle computes residency, capacity use and both objectives from the definitions (FlashMem §3.1–3.2,
the CPU analogue in ``plan/flashmem/problem.py``), independently of the solver's encoding and of ``Ledger``.
"""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeplan.errors import MemoryBudgetError
from edgeplan.plan.flashmem import greedy, lcopg, opg
from edgeplan.plan.flashmem.plan import Ledger, Load, OverlapPlan, WeightPlan
from edgeplan.plan.flashmem.problem import Layer, Problem

S = 2048  # chunk bytes; weights of 1, 2 or 4 KiB are 1, 1 or 2 chunks of exactly 1, 2, 2 KiB


def _chunks(b: int) -> int:
    return -(-b // S)


def _options(p: Problem, i: int):
    """Every plan of layer i's weight: preloaded, or a build layer and a spread of its chunks before it."""
    b = p.layers[i].weight_bytes
    t = _chunks(b)
    yield WeightPlan(i, p.layers[i].name, b, t, True)
    loads = list(range(max(0, i - p.lookback), i))
    for build in loads:
        span = [ell for ell in loads if ell <= build]
        for spread in itertools.product(range(t + 1), repeat=len(span)):
            if sum(spread) == t:
                got = tuple(Load(ell, n) for ell, n in zip(span, spread) if n)
                yield WeightPlan(i, p.layers[i].name, b, t, False, got, build)


def _evaluate(p: Problem, plans: list[WeightPlan]):
    """(resident KiB, read KiB, build ms) per layer, and both objectives, from the definitions."""
    n = p.n
    mem = [layer.arena_bytes / 1024 for layer in p.layers]  # the running layer's arena
    read, build = [0.0] * n, [0.0] * n
    paper = resident = 0.0
    for w in plans:
        kib = w.bytes / 1024
        chunk = kib / w.chunks
        packed = p.packed_factor * kib
        if w.preload:
            for ell in range(w.layer + 1):
                mem[ell] += kib + packed
            paper += p.lam * kib
            resident += p.lam * kib
            continue
        for load in w.loads:
            read[load.layer] += load.chunks * chunk
            for ell in range(load.layer, w.layer + 1):
                mem[ell] += load.chunks * chunk
            resident += (1 - p.lam) * load.chunks * chunk * (w.layer - load.layer)
        build[w.build_layer] += p.layers[w.layer].build_ms
        for ell in range(w.build_layer, w.layer + 1):
            mem[ell] += packed
        resident += (1 - p.lam) * packed * (w.layer - w.build_layer)
        paper += (1 - p.lam) * kib * (w.layer - w.z)
    return mem, read, build, {"paper": paper, "resident": resident}


def _within_m_peak(p: Problem, mem) -> bool:
    return max(mem) <= p.m_peak / 1024 + 1e-9


def _feasible(p: Problem, mem, read, build) -> bool:
    return _within_m_peak(p, mem) and all(read[ell] <= p.layers[ell].capacity_chunks * S / 1024 + 1e-9
                                          and build[ell] <= p.layers[ell].capacity_build_ms + 1e-9
                                          for ell in range(p.n))


def _brute_force(p: Problem, soft: bool = False) -> float | None:
    """The best objective over every plan that keeps M_peak and the capacities; ``soft``: the soft tier's, the
    capacities not kept but every KiB or microsecond beyond them priced at ``lookback + 2`` (in the objective's
    KiB units: what ``opg``'s penalty is)."""
    best = None
    weights = [i for i in range(p.n) if p.layers[i].weight_bytes]
    for combo in itertools.product(*(list(_options(p, i)) for i in weights)):
        mem, read, build, obj = _evaluate(p, list(combo))
        if soft and _within_m_peak(p, mem):
            total = obj[p.objective] + (p.lookback + 2) * _over(p, read, build)
        elif not soft and _feasible(p, mem, read, build):
            total = obj[p.objective]
        else:
            continue
        best = total if best is None else min(best, total)
    return best


def _over(p: Problem, read, build) -> float:
    """KiB read and build microseconds beyond the layers' capacities, summed (the soft tier's slack)."""
    return sum(max(0.0, read[ell] - p.layers[ell].capacity_chunks * S / 1024)
               + 1000 * max(0.0, build[ell] - p.layers[ell].capacity_build_ms) for ell in range(p.n))


@st.composite
def problems(draw, max_layers: int = 4, below: int = 0, slack: int | None = None):
    n = draw(st.integers(2, max_layers))
    layers = tuple(Layer(
        f"l{i}", draw(st.sampled_from([0, 1024, 2048, 4096])), 1.0,
        draw(st.sampled_from(["elemental", "reusable", "hierarchical"])),
        draw(st.sampled_from([0, 1, 2, 2, 3])), float(draw(st.sampled_from([0, 1, 2, 2]))),
        build_ms=float(draw(st.integers(0, 1))), arena_bytes=draw(st.sampled_from([0, 0, 1024, 3072])))
        for i in range(n))
    need = [2 * layer.weight_bytes // 1024 for layer in layers] + [0]
    # below it no plan exists (``check_budget``): two neighbours read and built, the first running
    floor = max(a + layer.arena_bytes // 1024 + b for a, b, layer in zip(need, need[1:], layers))
    top = sum(need) if slack is None else floor + slack  # ``slack``: M_peak at most that many KiB above the floor
    m_peak = 1024 * draw(st.integers(max(1, floor - below), max(1, floor - below, top)))
    return Problem(layers, S, m_peak, lam=draw(st.sampled_from([0.1, 0.5, 0.9])),
                   objective=draw(st.sampled_from(["paper", "resident"])), window=n,
                   lookback=draw(st.integers(1, n)), time_limit_s=20)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(problems())
def test_one_window_matches_the_brute_force_optimum(p):
    weights = [i for i in range(p.n) if p.layers[i].weight_bytes]
    if not weights:
        return
    want = _brute_force(p)
    got = opg.solve(p, Ledger(p), weights)
    if want is None:
        assert got.status == "INFEASIBLE"
        return
    assert got.status == "OPTIMAL"
    mem, read, build, obj = _evaluate(p, list(got.weights))
    assert _feasible(p, mem, read, build)
    assert obj[p.objective] == pytest.approx(want, abs=1e-6)
    assert got.objective == pytest.approx(want, abs=1e-6)  # the solver's units are KiB: the same number


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(problems(max_layers=5, slack=4))
def test_the_soft_tier_matches_the_brute_force_optimum(p):
    """Over capacity priced, not forbidden; the solver places builds and reads only where ``build_layers`` and
    ``read_layers`` keep them (every layer with room, and the last without), which must lose no optimum. M_peak
    near the least that fits: with room to spare, preloading is cheaper than any read or build over capacity."""
    weights = [i for i in range(p.n) if p.layers[i].weight_bytes]
    if not weights:
        return
    want = _brute_force(p, soft=True)
    got = opg.solve(p, Ledger(p), weights, soft=True)
    if want is None:
        assert got.status == "INFEASIBLE"
        return
    assert got.status == "OPTIMAL"
    mem, read, build, obj = _evaluate(p, list(got.weights))
    assert _within_m_peak(p, mem)
    assert obj[p.objective] + (p.lookback + 2) * _over(p, read, build) == pytest.approx(want, abs=1e-6)
    assert got.objective == pytest.approx(want, abs=1e-6)


def test_a_build_that_costs_nothing_is_placed_just_before_its_layer():
    """Its y is fixed at the last load layer (an earlier build only holds its packed bytes longer); the brute-force
    test above checks that fixing it loses no optimum (its problems draw build costs of 0 and 1 ms)."""
    layers = tuple(Layer(f"l{i}", 0, 1.0, "elemental", 1, 0.0) for i in range(3)) + (
        Layer("l3", 2 * S, 1.0, "reusable", 0, 0.0, build_ms=0.0),)
    p = Problem(layers, S, m_peak=64 * 1024, lam=0.9, objective="resident", window=4, lookback=3)
    got = opg.solve(p, Ledger(p), [3])
    assert got.status == "OPTIMAL"
    (w,) = got.weights
    assert not w.preload and w.build_layer == 2 and w.loads == (Load(1, 1), Load(2, 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(problems(max_layers=6, below=2))
def test_every_plan_keeps_m_peak_and_reports_what_it_exceeds(p):
    """Any tier, any window size: each weight complete (C0), resident bytes within M_peak (C2), and the plan's
    predicted residency and over-capacity equal to the oracle's."""
    try:
        plan = lcopg.plan(Problem(**{**p.__dict__, "window": 2}))
    except MemoryBudgetError:
        assert any(_need(p, i) + p.layers[i].arena_bytes + _need(p, i + 1) > p.m_peak for i in range(p.n - 1)) \
            or _need(p, p.n - 1) + p.layers[-1].arena_bytes > p.m_peak
        return
    assert [w.layer for w in plan.weights] == [i for i in range(p.n) if p.layers[i].weight_bytes]
    for w in plan.weights:
        assert w.preload or sum(load.chunks for load in w.loads) == w.chunks
        assert w.preload or all(load.layer <= w.build_layer < w.layer for load in w.loads)
    mem, read, build, _ = _evaluate(p, list(plan.weights))
    assert [m * 1024 for m in mem] == list(plan.resident_bytes)
    assert max(mem) * 1024 <= p.m_peak
    over = sum(max(0.0, read[ell] - p.layers[ell].capacity_chunks * S / 1024) for ell in range(p.n))
    assert plan.over_capacity_bytes == over * 1024
    assert OverlapPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def _need(p: Problem, i: int) -> float:
    return (1 + p.packed_factor) * p.layers[i].weight_bytes


def test_rolling_windows_stay_within_the_global_optimum_gap_and_name_each_window():
    layers = tuple(Layer(f"l{i}", [4096, 0, 2048, 1024][i % 4], 1.0, "reusable", 1, 2.0, build_ms=1.0)
                   for i in range(24))
    p = Problem(layers, S, m_peak=16 * 1024, lam=0.9, objective="resident", window=6, lookback=4)
    plan = lcopg.plan(p)
    assert [(w.first, w.last) for w in plan.windows] == [(0, 5), (6, 11), (12, 17), (18, 23)]
    assert all(w.tier == "strict" and w.status == "OPTIMAL" for w in plan.windows)
    whole = lcopg.plan(Problem(**{**p.__dict__, "window": 24}))
    assert whole.windows[0].status == "OPTIMAL"
    _, _, _, rolled = _evaluate(p, list(plan.weights))
    _, _, _, best = _evaluate(p, list(whole.weights))
    assert best["resident"] <= rolled["resident"] + 1e-9  # one window sees everything: never worse


def test_no_capacity_falls_to_the_soft_tier_and_says_why():
    layers = tuple(Layer(f"l{i}", 4096, 1.0, "hierarchical", 0, 0.0) for i in range(5))
    p = Problem(layers, S, m_peak=16 * 1024, lam=0.9, objective="resident", window=5)
    plan = lcopg.plan(p)
    (window,) = plan.windows
    assert window.tier == "soft-capacity" and "strict INFEASIBLE" in window.why
    assert plan.over_capacity_bytes > 0 and plan.peak_resident_bytes <= p.m_peak


def test_greedy_latest_fit_reads_late_and_within_capacity_when_it_can():
    layers = tuple(Layer(f"l{i}", 2048 if i % 2 else 0, 1.0, "reusable", 1, 1.0) for i in range(6))
    p = Problem(layers, S, m_peak=64 * 1024, window=6)
    got = greedy.place(p, Ledger(p), [1, 3, 5])
    assert got[0].preload is False and got[0].loads == (Load(0, 1),) and got[0].build_layer == 0
    assert [w.loads for w in got[1:]] == [(Load(2, 1),), (Load(4, 1),)]


def test_greedy_preloads_what_no_layer_can_stream_when_memory_allows():
    layers = tuple(Layer(f"l{i}", 4096 if i == 2 else 0, 1.0, "hierarchical", 0, 0.0) for i in range(3))
    roomy = Problem(layers, S, m_peak=64 * 1024, window=3)
    (w,) = greedy.place(roomy, Ledger(roomy), [2])
    assert w.preload  # C3 kept: the strict tier starts from a feasible hint
    tight = Problem(layers, S, m_peak=16 * 1024, window=3)
    ledger = Ledger(tight)
    ledger.mem[0] += 10  # KiB committed at layer 0: the weight's 8 KiB (read and built) cannot stay from there
    (w,) = greedy.place(tight, ledger, [2])
    assert not w.preload and w.loads == (Load(1, 2),) and w.build_layer == 1  # over capacity, as before


@pytest.mark.parametrize("objective", ["paper", "resident"])
def test_greedy_preloads_a_weight_it_would_read_far_ahead(objective):
    """λ = 0.9: a byte read d layers ahead costs 0.1·d, preloaded 0.9 — capacity 12 layers back only: preload;
    capacity at the layer before: stream."""
    def problem(cap_at: int) -> Problem:
        layers = tuple(Layer(f"l{i}", 2048 if i == 12 else 0, 1.0, "reusable", 1 if i == cap_at else 0, 1.0)
                       for i in range(13))
        return Problem(layers, S, m_peak=64 * 1024, lam=0.9, objective=objective, window=13, lookback=12)

    far, near = problem(0), problem(11)
    assert greedy.place(far, Ledger(far), [12])[0].preload
    (w,) = greedy.place(near, Ledger(near), [12])
    assert not w.preload and w.loads == (Load(11, 1),)


def test_greedy_keeps_c3_before_it_preloads_to_save():
    """Layer 12's weight could be streamed (read at layer 0) or preloaded (cheaper: 0.9 against 0.1 x 12);
    layer 13's can only be preloaded (no capacity in its lookback). Layer 0 has room for one preload beside
    a streamed chunk, not two: the cheaper preload must not take the room the other needs."""
    layers = tuple(Layer(f"l{i}", 2048 if i in (12, 13) else 0, 1.0, "reusable", 1 if i == 0 else 0, 1.0)
                   for i in range(14))
    p = Problem(layers, S, m_peak=16 * 1024, lam=0.9, objective="paper", window=14, lookback=12)
    ledger = Ledger(p)
    ledger.mem[0] += 10  # KiB already held at layer 0: 6 left
    a, b = greedy.place(p, ledger, [12, 13])
    assert not a.preload and a.loads == (Load(0, 1),) and b.preload


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(problems(max_layers=6))
def test_greedy_cost_is_the_objective_the_solver_minimises(p):
    """``greedy.cost`` (which decides preload against streaming) prices a placement as the oracle does, in the
    solver's units (per-mille x KiB)."""
    weights = [i for i in range(p.n) if p.layers[i].weight_bytes]
    placed = greedy.place(p, Ledger(p), weights)
    _, _, _, obj = _evaluate(p, placed)
    assert sum(greedy.cost(p, w) for w in placed) / 1000 == pytest.approx(obj[p.objective], abs=1e-6)


def test_m_peak_below_two_neighbouring_weights_names_the_layer_and_the_split():
    layers = (Layer("conv", 1 << 20, 1.0, "reusable", 1, 1.0), Layer("fc1", 100 << 20, 1.0, "reusable", 1, 1.0))
    with pytest.raises(MemoryBudgetError, match=r"layer 1 \(fc1\) holds 100.0 MiB.*splitting fc1 .* into \d+ parts"):
        lcopg.plan(Problem(layers, 1 << 20, m_peak=64 << 20))


def test_m_peak_below_a_layer_of_buffers_and_arena_says_a_split_does_not_help():
    layers = (Layer("stem", 16 << 10, 1.0, "reusable", 1, 1.0, built_bytes=6 << 20, arena_bytes=2 << 20),
              Layer("conv", 64 << 10, 1.0, "reusable", 1, 1.0))
    with pytest.raises(MemoryBudgetError, match=r"layer 0 \(stem\) .* a 2.0 MiB arena; most of it is activations "
                                                r"and buffers, which a split does not shrink; or raise M_peak "
                                                r"\(at least 8.\d MiB\)"):
        lcopg.plan(Problem(layers, 1 << 16, m_peak=4 << 20))
