"""Greedy latest-fit: the last tier of C4 (FlashMem §3.2 "greedy heuristic backup").

Weights in the order of use; each segment is built at the latest layer before its use whose shadow holds
the build, and its chunks are read as late as the layers' remaining capacity and the memory headroom allow,
walking back from the build layer. What no layer can absorb is read at the build layer anyway (over
capacity: a stall the plan reports), unless preloading it fits M_peak (C3 kept). Then, most saving first, a
streamed weight whose preloading costs the objective less (read far ahead) is preloaded where memory still
allows. A weight with no layer before it, or whose reads would break M_peak everywhere, is preloaded.
"""
from __future__ import annotations

from edgeplan.plan.flashmem.plan import Ledger, Load, WeightPlan
from edgeplan.plan.flashmem.problem import Problem


def place(problem: Problem, ledger: Ledger, ws: list[int]) -> list[WeightPlan]:
    """Plans for ``ws``; ``ledger`` is left untouched (the caller commits). Two passes: C3 first (a weight is
    preloaded only where no layer can stream it), then the streamed weights whose preloading saves the most,
    while memory allows — else the first weights' cheaper preloads take the memory the later ones need to keep
    C3."""
    book = ledger.copy()
    out = {}
    for i in sorted(ws):
        out[i] = _one(problem, book, i)
        book.commit(out[i])
    saving = {i: cost(problem, w) - cost(problem, _preloaded(problem, i)) for i, w in out.items() if not w.preload}
    for i in sorted((i for i in saving if saving[i] > 0), key=lambda i: -saving[i]):
        book.commit(out[i], -1)
        if _preload_fits(problem, book, i):
            out[i] = _preloaded(problem, i)
        book.commit(out[i])
    return [out[i] for i in sorted(ws)]


def _preloaded(problem: Problem, i: int) -> WeightPlan:
    layer = problem.layers[i]
    return WeightPlan(i, layer.name, layer.weight_bytes, problem.chunks(i), True)


def _preload_fits(problem: Problem, book: Ledger, i: int) -> bool:
    return min(book.mem_room(k) for k in range(i + 1)) >= problem.full_kib(i)


def _one(problem: Problem, book: Ledger, i: int) -> WeightPlan:
    layer = problem.layers[i]
    t, ck, pk = problem.chunks(i), problem.chunk_kib(i), problem.packed_kib(i)
    preload = _preloaded(problem, i)
    loads = list(problem.load_layers(i))
    if not loads:
        return preload

    def headroom(ell: int) -> int:  # KiB that can stay resident from layer ell until layer i
        return min(book.mem_room(k) for k in range(ell, i + 1))

    # a build that costs nothing goes where the solver fixes it (``opg``): the last layer whose headroom holds it,
    # even one already over its build shadow, so this placement stays a feasible hint
    free = not problem.build_us(i)
    build = next((ell for ell in reversed(loads)
                  if (free or book.build_room(ell) >= problem.build_us(i)) and headroom(ell) >= pk + t * ck),
                 loads[-1])
    if headroom(build) < pk + t * ck:
        return preload
    taken: dict[int, int] = {}
    left = t
    for ell in reversed([k for k in loads if k <= build]):
        if not left:
            break
        # chunks taken at later layers stay resident through this layer's range too: count them against it
        room = min(book.read_room(ell), headroom(ell) - pk - (t - left) * ck) // ck
        n = max(0, min(left, room))
        if n:
            taken[ell] = n
            left -= n
    if left:  # beyond every layer's capacity: preloaded where memory allows (C3 kept), else read over capacity
        if _preload_fits(problem, book, i):
            return preload
        taken[build] = taken.get(build, 0) + left
    return WeightPlan(i, layer.name, layer.weight_bytes, t, False,
                      tuple(Load(ell, taken[ell]) for ell in sorted(taken)), build)


def cost(problem: Problem, w: WeightPlan) -> float:
    """w's term of the objective (``opg``'s, in its units: per-mille x KiB)."""
    lam = round(problem.lam * 1000)
    ck = problem.chunk_kib(w.layer)
    if w.preload:
        return lam * w.chunks * ck
    if problem.objective == "paper":
        return (1000 - lam) * w.chunks * ck * (w.layer - w.z)
    return (1000 - lam) * (sum(load.chunks * ck * (w.layer - load.layer) for load in w.loads)
                           + problem.packed_kib(w.layer) * (w.layer - w.build_layer))
