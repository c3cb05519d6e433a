"""Parallax's schedule (plan/parallax/schedule.py), its measured decision (measure.py) and the branch-parallel
runtime (runtime/parallel.py): every plan, run on real threads, gives the int8 model's own bits."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeplan.plan.parallax import measure, schedule
from edgeplan.quantize import litert
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime.parallel import ParallelError, ParallelRunner, Pool, interpreter_for
from edgeplan.runtime.stream import invoke_named

MODELS = ["light_squeezenet", "light_inception_v1"]


@given(st.lists(st.integers(1, 100), min_size=1, max_size=7), st.integers(1, 3))
@settings(max_examples=200, deadline=None)
def test_lpt_is_within_four_thirds_of_the_best_packing(times, workers):
    bins = schedule.lpt([float(t) for t in times], workers)
    assert sorted(i for b in bins for i in b) == list(range(len(times)))
    assert len(bins) <= workers
    best = min(max(sum(times[i] for i, w in enumerate(assign) if w == k) for k in range(workers))
               for assign in itertools.product(range(workers), repeat=len(times)))
    assert max(sum(times[i] for i in b) for b in bins) <= 4 / 3 * best + 1e-9


@given(st.lists(st.integers(1, 50), min_size=1, max_size=8), st.integers(0, 200))
@settings(max_examples=200, deadline=None)
def test_largest_subset_is_the_most_tasks_within_the_budget(peaks, budget):
    chosen = schedule.largest_subset(peaks, budget)
    assert sum(peaks[i] for i in chosen) <= budget
    most = max((len(c) for n in range(len(peaks) + 1) for c in itertools.combinations(range(len(peaks)), n)
                if sum(peaks[i] for i in c) <= budget), default=0)
    assert len(chosen) == most


def _graph(compiled, name) -> TfliteGraph:
    d, _, _ = compiled(name)
    return TfliteGraph((d / "model_int8.tflite").read_bytes())


def _candidates(g: TfliteGraph, budget: int = 1 << 30) -> list[schedule.Layer]:
    """Every layer with two branches a candidate (SqueezeNet's are one fused op each, 9x apart in FLOPs: the
    defaults, 3 ops and 1.5x, leave it none)."""
    return schedule.candidates(g, workers=2, budget_bytes=budget, min_nodes=1, beta=100.0)


def _inputs(g: TfliteGraph, live: dict) -> dict:
    return {d["name"]: live[d["name"]] for d in litert.interpreter(g.data).get_input_details()}


@pytest.mark.parametrize("model", MODELS)
def test_every_plan_runs_branch_parallel_to_the_int8_models_bits(compiled, model):
    g = _graph(compiled, model)
    live = measure.activations(g, seed=1)
    layers = measure.measure(g, _candidates(g), workers=2, repeats=3,
                             live=live)
    assert any(layer.task_ms for layer in layers)  # some layer was a candidate and got measured
    # whatever the times said, force each candidate both ways: every mix must be exact
    forced = [layer if layer.mode == "sequential" else
              replace(layer, mode="branches" if k % 2 == 0 else "threads") for k, layer in enumerate(layers)]
    every = [replace(layer, mode="branches") if layer.task_ms else layer for layer in layers]
    for chosen in (layers, forced, every):
        plan = schedule.plan(g, chosen, workers=2, budget_bytes=1 << 30)
        if chosen is every and model == "light_inception_v1":  # its concatenations fold into the next workers
            assert any(set(s.submodels[0]) & set(s.submodels[1]) for s in plan.stages if len(s.submodels) > 1)
        stages = measure.runtime_stages(g, plan)
        assert plan.parallel_layers == sum(1 for s in stages if s.parallel)
        x = _inputs(g, live)
        for deterministic in (True, False):  # reference kernels and XNNPACK
            ref = invoke_named(litert.interpreter(g.data, deterministic=deterministic), x)
            out = ParallelRunner(stages, interpreter_for(deterministic), workers=2).run(x)
            assert set(out) == set(ref)
            assert all(np.array_equal(out[k], ref[k]) for k in ref), (model, deterministic)


def test_a_budget_below_the_branches_runs_sequentially_and_says_why(compiled):
    g = _graph(compiled, "light_squeezenet")
    layers = _candidates(g)
    smallest = min(p for layer in layers if layer.mode == "branches" for p in layer.peaks)
    tight = _candidates(g, smallest)
    assert all(layer.mode == "sequential" for layer in tight)
    plan = schedule.plan(g, tight, workers=2, budget_bytes=smallest)
    assert "below the two smallest branch peaks" in plan.why
    assert len(plan.stages) == 1 and plan.stages[0].submodels[0] == tuple(range(len(g.ops)))
    assert measure.runtime_stages(g, plan)[0].submodels[0].data == g.data  # the whole model, uncut


def test_the_plans_arenas_are_held_to_the_budget(compiled):
    g = _graph(compiled, "light_squeezenet")
    layers = [replace(layer, parallel_ms=1.0, threads_ms=1.0 + layer.index)
              for layer in _candidates(g)]
    free = schedule.plan(g, layers, workers=2, budget_bytes=1 << 30)
    assert free.parallel_layers >= 2
    budget = free.arena_bytes - 1
    held = schedule.plan(g, layers, workers=2, budget_bytes=budget)
    assert held.arena_bytes <= budget or held.parallel_layers == 0
    assert held.parallel_layers < free.parallel_layers
    dropped = [a for a, b in zip(free.layers, held.layers) if a.mode != b.mode]
    assert dropped and all("over the budget" in b.why for b in held.layers if b.mode == "threads")
    kept = [layer.gain_ms for layer in held.layers if layer.mode == "branches"]
    assert all(d.gain_ms <= min(kept, default=float("inf")) for d in dropped)  # the least gain goes first


def _parallel_plan(g):
    layers = [replace(layer, parallel_ms=1.0, threads_ms=2.0)
              for layer in _candidates(g)]
    return schedule.plan(g, layers, workers=2, budget_bytes=1 << 30)


def test_without_an_idle_thread_the_sub_models_run_in_order(compiled):
    g = _graph(compiled, "light_squeezenet")
    stages = measure.runtime_stages(g, _parallel_plan(g))
    x = _inputs(g, measure.activations(g))
    ref = invoke_named(litert.interpreter(g.data), x)
    busy = Pool(1)
    assert busy.take(1) == 1  # its one thread is someone else's
    runner = ParallelRunner(stages, interpreter_for(True), workers=2, pool_=busy)
    out = runner.run(x)
    assert all(np.array_equal(out[k], ref[k]) for k in ref)


def test_a_failing_branch_fails_its_request_naming_it_and_the_next_succeeds(compiled):
    g = _graph(compiled, "light_squeezenet")
    plan = _parallel_plan(g)
    stages = measure.runtime_stages(g, plan)
    runner = ParallelRunner(stages, interpreter_for(True), workers=2)
    x = _inputs(g, measure.activations(g))
    k = next(i for i, s in enumerate(stages) if s.parallel)
    it = runner.interpreters[k][1]
    real = it.invoke

    def broken():
        raise RuntimeError("Node number 3 (CONV_2D) failed to invoke")
    it.invoke = broken
    with pytest.raises(ParallelError, match=rf"layer {stages[k].layer}, sub-model {stages[k].submodels[1].name}: "
                                            "RuntimeError: Node number 3"):
        runner.run(x)
    it.invoke = real
    ref = invoke_named(litert.interpreter(g.data), x)
    out = runner.run(x)
    assert all(np.array_equal(out[key], ref[key]) for key in ref)


def test_confirm_keeps_a_layer_only_when_the_whole_model_ran_faster_with_it(compiled):
    g = _graph(compiled, "light_inception_v1")
    live = measure.activations(g)
    layers = [replace(layer, parallel_ms=1.0, threads_ms=2.0 + layer.index) for layer in _candidates(g)]
    final, info = measure.confirm(g, layers, workers=2, budget_bytes=1 << 30, repeats=3, min_gain=0.0, live=live)
    assert [t["layer"] for t in info["trials"]] == sorted((layer.index for layer in layers if layer.mode == "branches"),
                                                         key=lambda i: -i)  # the largest gain first
    kept = {t["layer"] for t in info["trials"] if t["with_ms"] < t["without_ms"]}
    if info["final"] is not None and not info["final"]["plan_ms"] < info["final"]["whole_ms"]:
        kept = set()  # together they were no faster than the whole model: none kept
    assert {layer.index for layer in final if layer.mode == "branches"} == kept
    assert all("end to end" in layer.why for layer in final if layer.mode == "threads")
    plan = schedule.plan(g, final, workers=2, budget_bytes=1 << 30)
    x = _inputs(g, live)
    ref = invoke_named(litert.interpreter(g.data, deterministic=False), x)
    out = ParallelRunner(measure.runtime_stages(g, plan), interpreter_for(False), workers=2).run(x)
    assert all(np.array_equal(out[k], ref[k]) for k in ref)
