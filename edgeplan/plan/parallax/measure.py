"""Sub-models of a Parallax plan cut from the one int8 model, and the per-layer times the schedule decides by.

Per candidate layer, measured with real interpreters and threads on the model's own activations (one run of the
whole model keeping every tensor): each task alone on one thread (LPT packs by these), the packed worker
sub-models at once (``ParallelRunner``), and the layer as one sub-model on W XNNPACK threads; the two
configurations interleaved, medians. Then ``confirm`` checks the choices end to end, one layer at a time.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable

import numpy as np

from edgeplan.plan.parallax import schedule
from edgeplan.plan.parallax.schedule import Layer, ParallaxPlan, decide, repack
from edgeplan.profile.cpu import median_ms
from edgeplan.quantize import litert
from edgeplan.quantize.stream import cut_ops
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime.parallel import ParallelRunner, Stage, SubModel, interpreter_for
from edgeplan.runtime.stream import invoke_named


def activations(graph: TfliteGraph, x: dict[str, np.ndarray] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor of one run of the whole model by name (random int8 input unless given)."""
    it = litert.interpreter(graph.data, deterministic=True, keep_all=True)
    rng = np.random.default_rng(seed)
    for d in it.get_input_details():
        value = (x or {}).get(d["name"])
        it.set_tensor(d["index"], litert.random_value(d["shape"], d["dtype"], rng) if value is None else value)
    it.invoke()
    out = {}
    for d in it.get_tensor_details():
        try:
            out[d["name"]] = it.get_tensor(d["index"]).copy()
        except ValueError:  # a tensor with no data (freed scratch)
            continue
    return out


def runtime_stages(graph: TfliteGraph, plan: ParallaxPlan, tag: str = "px") -> list[Stage]:
    """The plan's stages as the runtime takes them; one stage of every op is the model itself, uncut."""
    if len(plan.stages) == 1 and len(plan.stages[0].submodels) == 1:
        return [Stage(None, (SubModel(f"{tag}_whole", graph.data, plan.stages[0].threads),))]
    out = []
    for k, s in enumerate(plan.stages):
        subs = tuple(SubModel(f"{tag}_s{k}w{w}", cut_ops(graph, list(ops), f"{tag}_s{k}w{w}", list(outs)), s.threads)
                     for w, (ops, outs) in enumerate(zip(s.submodels, s.outputs)))
        out.append(Stage(s.layer, subs))
    return out


def measure(graph: TfliteGraph, layers: list[Layer], *, workers: int, deterministic: bool = False,
            repeats: int = 7, live: dict[str, np.ndarray] | None = None) -> list[Layer]:
    """The candidate layers decided by measured times (other layers returned as they are)."""
    build = interpreter_for(deterministic)
    live = live if live is not None else activations(graph)
    out = []
    for layer in layers:
        if layer.mode != "branches":
            out.append(layer)
            continue
        tag = f"L{layer.index}"
        task_ms = []
        for i, ops in enumerate(layer.tasks):
            it = build(cut_ops(graph, list(ops), f"{tag}t{i}"), 1)
            invoke_named(it, live)  # warm
            task_ms.append(median_ms(lambda: invoke_named(it, live), repeats))
        packed = repack(layer, task_ms, workers)
        subs = tuple(SubModel(f"{tag}w{w}", cut_ops(graph, [v for i in b for v in layer.tasks[i]], f"{tag}w{w}"), 1)
                     for w, b in enumerate(packed.bins))
        rest = sorted(v for i, t in enumerate(layer.tasks) if i not in layer.chosen for v in t)
        after = [Stage(None, (SubModel(f"{tag}rest", cut_ops(graph, rest, f"{tag}rest"), workers),))] if rest else []
        branches = ParallelRunner([Stage(layer.index, subs), *after], build, workers=workers)
        whole = build(cut_ops(graph, sorted(v for t in layer.tasks for v in t), f"{tag}all"), workers)
        branches.run(live), invoke_named(whole, live)  # warm
        par, thr = [], []
        for r in range(repeats):  # interleaved, each first in turn
            pair = [(par, lambda: branches.run(live)), (thr, lambda: invoke_named(whole, live))]
            for sink, work in (pair if r % 2 == 0 else pair[::-1]):
                sink.append(median_ms(work, 1))
        out.append(decide(packed, task_ms, statistics.median(par), statistics.median(thr), workers))
    return out


def _runner(graph: TfliteGraph, layers: list[Layer], workers: int, budget_bytes: int, build) -> ParallelRunner:
    return ParallelRunner(runtime_stages(graph, schedule.plan(graph, layers, workers=workers, budget_bytes=budget_bytes)),
                          build, workers=workers)


def _faster(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Medians of ``a`` and ``b`` run in turn, each first every other time."""
    ta, tb = [], []
    a(), b()
    for r in range(repeats):
        pair = [(ta, a), (tb, b)]
        for sink, work in (pair if r % 2 == 0 else pair[::-1]):
            sink.append(median_ms(work, 1))
    return statistics.median(ta), statistics.median(tb)


def confirm(graph: TfliteGraph, layers: list[Layer], *, workers: int, budget_bytes: int, deterministic: bool = False,
            repeats: int = 15, min_gain: float = 0.01, live: dict[str, np.ndarray] | None = None
            ) -> tuple[list[Layer], dict]:
    """End to end, the per-layer choices as a whole: cutting costs what no single layer's time shows (an invoke
    and an arena per sub-model, copies between them). Starting from the whole model on W threads, each
    branch-parallel layer, largest measured gain first, stays only if the model runs at least ``min_gain``
    (a fraction) faster with it than without (interleaved medians: the gains are a few per cent, about the
    host's noise); a layer that does not is ``threads``, saying so. Last, the plan with the kept layers against
    the whole model once more: not ``min_gain`` faster, and none is kept."""
    build = interpreter_for(deterministic)
    live = live if live is not None else activations(graph)
    x = {d["name"]: live[d["name"]] for d in litert.interpreter(graph.data).get_input_details()}
    current = [replace(layer, mode="threads") if layer.mode == "branches" else layer for layer in layers]
    best = _runner(graph, current, workers, budget_bytes, build)
    whole_ms = best_ms = None
    trials = []
    for k in sorted((k for k, layer in enumerate(layers) if layer.mode == "branches"), key=lambda k: -layers[k].gain_ms):
        trial = list(current)
        trial[k] = layers[k]
        runner = _runner(graph, trial, workers, budget_bytes, build)
        with_ms, without_ms = _faster(lambda: runner.run(x), lambda: best.run(x), repeats)
        whole_ms = without_ms if whole_ms is None else whole_ms
        trials.append({"layer": layers[k].index, "with_ms": with_ms, "without_ms": without_ms})
        if with_ms < without_ms * (1 - min_gain):
            current, best, best_ms = trial, runner, with_ms
        else:
            current[k] = replace(layers[k], mode="threads",
                                 why=f"{layers[k].why}; end to end {with_ms:.2f} ms with it, {without_ms:.2f} ms "
                                     f"without (needs {min_gain:.0%} less)")
    final = None
    if best_ms is not None:  # the kept layers together, against the whole model once more
        whole = _runner(graph, [replace(layer, mode="threads") if layer.mode == "branches" else layer
                                for layer in current], workers, budget_bytes, build)
        best_ms, whole_ms = _faster(lambda: best.run(x), lambda: whole.run(x), repeats)
        final = {"plan_ms": best_ms, "whole_ms": whole_ms}
        if not best_ms < whole_ms * (1 - min_gain):
            current = [replace(layer, mode="threads", why=f"{layer.why}; with the other kept layers end to end "
                                                          f"{best_ms:.2f} ms, the whole model {whole_ms:.2f} ms")
                       if layer.mode == "branches" else layer for layer in current]
            best_ms = whole_ms
    return current, {"whole_ms": whole_ms, "plan_ms": best_ms if best_ms is not None else whole_ms, "trials": trials,
                     "final": final}
