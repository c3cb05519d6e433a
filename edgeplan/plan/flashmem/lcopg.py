"""LC-OPG: the overlap plan of one model, window by rolling window, with C4's tiers (FlashMem §3.2).

Windows of ``problem.window`` layers are placed in execution order; each sees what earlier windows
committed (their reads, builds and resident bytes) and may read into the layers before it. Per window:
  strict               — C0–C3 hard (one CP-SAT solve);
  soft-capacity        — C_l and the build shadows become penalised slacks ("soft thresholding"), when
                         the strict model is infeasible or finds nothing in its time limit;
  incremental-preload  — the window's largest weights that fit the memory headroom are fixed in W and the
                         soft model solved again, smaller, when the soft one found nothing in time;
  greedy-latest-fit    — ``greedy.place``, when no solve produced a plan.
Every solve starts from greedy latest-fit's placement of the window as a hint (CP-SAT repairs or improves it).
Each window records the tier, why, and the solver's status, objective, bound, gap and seconds.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from edgeplan.plan.flashmem import greedy, opg
from edgeplan.plan.flashmem.plan import Ledger, OverlapPlan, WeightPlan, WindowStats, finish
from edgeplan.plan.flashmem.problem import Problem, check_budget

log = logging.getLogger(__name__)


def plan(problem: Problem, progress: Callable[[int, int], None] | None = None) -> OverlapPlan:
    """The overlap plan; ``progress(done_layers, layers)`` after each window. Raises ``MemoryBudgetError``
    when no plan can meet M_peak, ``PlanError`` when OR-Tools is missing. In a process that has imported
    TensorFlow the whole plan is made in ``opg``'s solver process (see ``opg.isolated``)."""
    check_budget(problem)
    if opg.must_isolate():
        return opg.isolated(_plan, problem)
    return _plan(problem, progress)


def _plan(problem: Problem, progress: Callable[[int, int], None] | None = None) -> OverlapPlan:
    ledger = Ledger(problem)
    weights: list[WeightPlan] = []
    windows: list[WindowStats] = []
    all_w = problem.weights()
    for first in range(0, problem.n, problem.window):
        last = min(problem.n, first + problem.window) - 1
        ws = [i for i in all_w if first <= i <= last]
        if ws:
            placed, stats = _window(problem, ledger, ws, first, last)
            for w in placed:
                ledger.commit(w)
            weights += placed
            windows.append(stats)
        if progress:
            progress(last + 1, problem.n)
    return finish(problem, ledger, weights, windows)


def _window(problem: Problem, ledger: Ledger, ws: list[int], first: int, last: int
            ) -> tuple[list[WeightPlan], WindowStats]:
    def stats(tier: str, why: str, s: opg.WindowSolve | None, seconds: float) -> WindowStats:
        return WindowStats(first, last, len(ws), tier, why, s.status if s else "GREEDY",
                           s.objective if s else None, s.bound if s else None, s.gap if s else None, seconds)

    spent = 0.0
    guess = greedy.place(problem, ledger, ws)
    strict = opg.solve(problem, ledger, ws, hint=guess)
    spent += strict.seconds
    if strict.solved:
        why = "C0-C3 hold" if strict.status == "OPTIMAL" else f"time limit: feasible, gap {strict.gap:.3f}"
        return list(strict.weights), stats("strict", why, strict, spent)
    why = (f"strict {strict.status}: the layers' load capacity cannot stream these weights within M_peak"
           if strict.status == "INFEASIBLE" else f"strict {strict.status} after {strict.seconds:.1f} s")
    soft = opg.solve(problem, ledger, ws, soft=True, hint=guess)
    spent += soft.seconds
    if soft.solved:
        return list(soft.weights), stats("soft-capacity", why, soft, spent)
    why += f"; soft {soft.status}"
    fixed = _preloadable(problem, ledger, ws)
    if fixed:
        smaller = opg.solve(problem, ledger, ws, soft=True, preload=fixed, hint=guess)
        spent += smaller.seconds
        if smaller.solved:
            return list(smaller.weights), stats("incremental-preload", why + f"; {len(fixed)} weights fixed in W",
                                                smaller, spent)
        why += f"; with {len(fixed)} preloaded {smaller.status}"
    log.warning("flashmem window %d-%d: %s; greedy latest-fit", first, last, why)
    return guess, stats("greedy-latest-fit", why, None, spent)


def _preloadable(problem: Problem, ledger: Ledger, ws: list[int]) -> frozenset[int]:
    """The window's largest weights whose preloading fits the memory headroom (at most half of them)."""
    room = min(ledger.mem_room(ell) for ell in range(max(ws) + 1))
    fixed = set()
    for i in sorted(ws, key=lambda i: -problem.layers[i].weight_bytes)[: max(1, len(ws) // 2)]:
        if problem.full_kib(i) <= room:
            fixed.add(i)
            room -= problem.full_kib(i)
    return frozenset(fixed)
