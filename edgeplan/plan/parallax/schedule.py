"""Parallax's schedule (§3.3) on a CPU with W workers: which layers run their branches at once, packed how, and
the stages the runtime executes.

Per layer (branches by ``graph/branches``, grouped into tasks by ``refine``): the largest subset of tasks whose
summed estimated peaks fit the budget runs at once (the paper's greedy rule: smallest peaks first), packed onto
at most W workers by LPT on their times; the rest run after them, in order. A layer with a parallel choice then
runs as its worker sub-models, or as one sub-model on W XNNPACK threads, whichever its measured times say is
faster (on 2 cores XNNPACK's own threading is the rival). Everything that does not run branch-parallel joins
the sequential run around it, one sub-model on W threads.

LiteRT gives each interpreter its arena at build and keeps it (the runtime builds every sub-model at load), so
the budget also bounds the sum of all the plan's estimated arenas: over it, the parallel layers that save the
least time go back to the sequential run until it fits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from edgeplan.graph.branches import Structure, from_tflite, refine, structure, tflite_flops
from edgeplan.plan.parallax.memory import peak_bytes
from edgeplan.quantize.tflite_graph import TfliteGraph

MIB = 1 << 20


@dataclass(frozen=True)
class Layer:
    """One layer of the structure as planned. ``tasks``: op indices per task; ``chosen``: the tasks run at once;
    ``bins``: chosen task positions per worker. ``mode``: branches | threads | sequential."""

    index: int
    branches: int
    tasks: tuple[tuple[int, ...], ...]
    peaks: tuple[int, ...]
    chosen: tuple[int, ...]
    bins: tuple[tuple[int, ...], ...]
    mode: str
    why: str
    task_ms: tuple[float, ...] = ()
    parallel_ms: float | None = None
    threads_ms: float | None = None

    @property
    def gain_ms(self) -> float:
        if self.parallel_ms is None or self.threads_ms is None:
            return 0.0
        return self.threads_ms - self.parallel_ms


@dataclass(frozen=True)
class StagePlan:
    """What the runtime runs: op indices per sub-model (several: at once, one thread each; one: on ``threads``
    XNNPACK threads), each sub-model's estimated arena and its outputs."""

    layer: int | None
    submodels: tuple[tuple[int, ...], ...]
    threads: int
    peak_bytes: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]  # tensor indices per sub-model


@dataclass(frozen=True)
class ParallaxPlan:
    workers: int
    budget_bytes: int
    layers: tuple[Layer, ...]
    stages: tuple[StagePlan, ...]
    why: str  # why nothing runs in parallel, when nothing does

    @property
    def arena_bytes(self) -> int:
        """The plan's estimated arenas, every sub-model built at once (as the runtime holds them)."""
        return sum(sum(s.peak_bytes) for s in self.stages)

    @property
    def parallel_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.mode == "branches")

    def to_json(self) -> dict:
        return {"workers": self.workers, "budget_bytes": self.budget_bytes, "why": self.why,
                "layers": [asdict(layer) for layer in self.layers],
                "stages": [asdict(s) for s in self.stages]}


def lpt(times: list[float], workers: int) -> list[list[int]]:
    """Longest processing time first: each item, heaviest first, to the least-loaded worker (4/3-optimal)."""
    bins: list[list[int]] = [[] for _ in range(min(workers, len(times)))]
    load = [0.0] * len(bins)
    for i in sorted(range(len(times)), key=lambda i: (-times[i], i)):
        w = min(range(len(bins)), key=lambda w: (load[w], w))
        bins[w].append(i)
        load[w] += times[i]
    return [sorted(b) for b in bins if b]


def largest_subset(peaks: list[int], budget: int) -> list[int]:
    """The most tasks whose peaks sum within the budget: smallest first."""
    chosen, total = [], 0
    for i in sorted(range(len(peaks)), key=lambda i: (peaks[i], i)):
        if total + peaks[i] > budget:
            break
        chosen.append(i)
        total += peaks[i]
    return sorted(chosen)


def candidates(graph: TfliteGraph, *, workers: int, budget_bytes: int, min_nodes: int = 3, beta: float = 1.5,
               regions: dict[int, int] | None = None, s: Structure | None = None) -> list[Layer]:
    """Every layer with its tasks and estimated peaks; a layer with at least two tasks inside the budget is a
    ``branches`` candidate (packed by LPT on FLOPs until measured), any other ``sequential`` with the reason."""
    s = s or structure(from_tflite(graph, regions))
    flops = tflite_flops(graph)
    out = []
    for k, (layer, tasks) in enumerate(zip(s.layers, refine(s, flops, min_nodes, beta))):
        ops = tuple(tuple(sorted(v for b in task for v in s.branches[b].nodes)) for task in tasks)
        peaks = tuple(peak_bytes(graph, list(t)) for t in ops)
        chosen = tuple(largest_subset(list(peaks), budget_bytes)) if len(ops) > 1 else ()
        why = ""
        if len(layer) == 1:
            why = "one branch"
        elif len(ops) == 1:
            why = f"{len(layer)} branches, refined to one task (under {min_nodes} ops or over {beta}x the FLOPs)"
        elif workers < 2:
            why = "one worker"
        elif len(chosen) < 2:
            low = sorted(peaks)[:2]
            why = (f"budget {budget_bytes / MIB:.2f} MiB is below the two smallest branch peaks "
                   f"({low[0] / MIB:.2f} + {low[1] / MIB:.2f} MiB)")
        if why:
            out.append(Layer(k, len(layer), ops, peaks, (), (), "sequential", why))
            continue
        work = [sum(flops[v] for v in ops[i]) for i in chosen]
        bins = tuple(tuple(chosen[j] for j in b) for b in lpt(work, workers))
        out.append(Layer(k, len(layer), ops, peaks, chosen, bins, "branches", "by FLOPs, not measured"))
    return out


def decide(layer: Layer, task_ms: list[float], parallel_ms: float, threads_ms: float, workers: int) -> Layer:
    """A candidate layer with its measured times: packed by LPT on ``task_ms`` (the caller measured
    ``parallel_ms`` for ``repack(layer, task_ms, workers)``), branch-parallel if faster than the threads."""
    faster = parallel_ms < threads_ms
    why = (f"branches on {len(layer.bins)} workers {parallel_ms:.2f} ms "
           f"{'<' if faster else '>='} one sub-model on {workers} threads {threads_ms:.2f} ms")
    return replace(layer, task_ms=tuple(task_ms), parallel_ms=parallel_ms, threads_ms=threads_ms,
                   mode="branches" if faster else "threads", why=why)


def repack(layer: Layer, task_ms: list[float], workers: int) -> Layer:
    """The layer's chosen tasks packed by LPT on measured times (``task_ms`` per task of the layer)."""
    bins = lpt([task_ms[i] for i in layer.chosen], workers)
    return replace(layer, bins=tuple(tuple(layer.chosen[j] for j in b) for b in bins))


def stages(graph: TfliteGraph, layers: list[Layer], workers: int) -> list[StagePlan]:
    """The layers in order as stages: each ``branches`` layer its worker sub-models (its unchosen tasks join
    the sequential run after it), everything else one sequential run on W threads between them. A run of
    data movement only (a merge: concatenation, reshape — no FLOPs) right before a branch-parallel layer is
    folded into its workers instead, each computing the part it reads: one synchronisation and one invoke
    fewer (a cut costs about 0.2 ms per sub-model on InceptionV3)."""
    flops = tflite_flops(graph)
    groups: list[tuple[int | None, list[list[int]], list[int]]] = []  # layer, ops per worker, folded run
    run: list[int] = []
    for layer in layers:
        if layer.mode != "branches":
            run.extend(v for t in layer.tasks for v in t)
            continue
        folded: list[int] = []
        if run and all(flops[v] == 0 for v in run):
            folded, run = sorted(run), []
        if run:
            groups.append((None, [sorted(run)], []))
            run = []
        groups.append((layer.index, [sorted(v for i in b for v in layer.tasks[i]) for b in layer.bins], folded))
        run.extend(v for i, t in enumerate(layer.tasks) if i not in layer.chosen for v in t)
    if run:
        groups.append((None, [sorted(run)], []))
    return [stage_plan(graph, index, own, folded, workers) for index, own, folded in groups]


def stage_plan(graph: TfliteGraph, index: int | None, own: list[list[int]], folded: list[int], workers: int
           ) -> StagePlan:
    """Each sub-model: its ops and the folded ops it reads (all of them for the first, which also returns
    what later stages read of them); its outputs: what it makes that ops outside the stage or the model's
    output read."""
    inside = {v for ops in own for v in ops} | set(folded)
    read_outside = {x for op in graph.ops if op.index not in inside for x in graph.activations(op)} | set(graph.outputs)
    subs, outs = [], []
    for w, ops in enumerate(own):
        mine = set(ops) | (set(folded) if w == 0 else set())
        subs.append(tuple(sorted(mine | _reads(graph, ops, set(folded)))))
        outs.append(tuple(sorted({o for i in mine for o in graph.ops[i].outputs} & read_outside)))
    return StagePlan(index, tuple(subs), workers if len(own) == 1 else 1,
                     tuple(peak_bytes(graph, list(s), list(o)) for s, o in zip(subs, outs)), tuple(outs))


def _reads(graph: TfliteGraph, ops: list[int], pool: set[int]) -> set[int]:
    """The ops of ``pool`` that ``ops`` read from, directly or through each other."""
    found: set[int] = set()
    stack = [x for i in ops for x in graph.activations(graph.ops[i])]
    while stack:
        p = graph.producer.get(stack.pop())
        if p is not None and p in pool and p not in found:
            found.add(p)
            stack += graph.activations(graph.ops[p])
    return found


def plan(graph: TfliteGraph, layers: list[Layer], *, workers: int, budget_bytes: int) -> ParallaxPlan:
    """The stages for the layers as decided; while their arenas sum over the budget, the branch-parallel layer
    saving the least time runs as threads instead."""
    layers = list(layers)
    st = stages(graph, layers, workers)
    while sum(sum(s.peak_bytes) for s in st) > budget_bytes:
        parallel = [i for i, layer in enumerate(layers) if layer.mode == "branches"]
        if not parallel:
            break
        i = min(parallel, key=lambda i: (layers[i].gain_ms, i))
        layers[i] = replace(layers[i], mode="threads",
                            why=f"the plan's arenas over the budget {budget_bytes / MIB:.2f} MiB "
                                f"(it saved {layers[i].gain_ms:.2f} ms, the least)")
        st = stages(graph, layers, workers)
    why = ""
    if not any(layer.mode == "branches" for layer in layers):
        reasons = sorted({layer.why for layer in layers if layer.branches > 1})
        why = "no layer has parallel branches" if not reasons else "; ".join(reasons[:3])
    return ParallaxPlan(workers, budget_bytes, tuple(layers), tuple(st), why)
