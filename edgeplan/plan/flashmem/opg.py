"""OPG / LC-OPG as a CP-SAT model for the weights of one rolling window (FlashMem §3.1–3.2).

Variables per weight w (consumed at layer i_w, L(w) the window's layers before it):
  p_w in {0,1} — w in W (preloaded); x_{w,l} in 0..T(w) — chunks read at layer l; y_{w,l} in {0,1} — its
  segment built at l; e_{w,l} = [z_w <= l] — z_w order-encoded (``paper`` objective only).
Constraints, numbered as the paper:
  (C0) T(w)·p_w + sum_l x_{w,l} = T(w), and p_w + sum_l y_{w,l} = 1, every chunk read by the build layer;
  (C1) x_{w,l} >= 1 => z_w <= l, i.e. x_{w,l} <= T(w)·e_{w,l}, e monotone in l;
  (C2) resident KiB at every layer l (weights read, built or preloaded, not yet used; plus what earlier
       windows committed) <= M_peak;
  (C3) sum_w x_{w,l}·chunk <= C_l and sum_w y_{w,l}·build <= the build shadow of l (hard, or with a
       penalised slack in the soft tier of C4).
Only layers that can hold an optimum get a weight's variables (``build_layers``, ``read_layers``: those with
capacity left, and the last one without), an exact reduction checked against brute force in both tiers:
DenseNet201's two soft windows (Table 4's row, 10 s each) went from gap 0.999 and a fall to greedy latest-fit
with every layer's variables to gaps 0.28 / 0.12 with these.
Objectives (λ in per-mille, memory in KiB):
  ``paper``    λ·sum_{w in W} |w| + (1-λ)·sum_w |w|·(i_w - z_w)             (§3.1.1, bytes-weighted)
  ``resident`` λ·sum_{w in W} |w| + (1-λ)·sum_{w,l} (x_{w,l}·chunk + y_{w,l}·packed)·(i_w - l)   (linear)
"""
from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from edgeplan.errors import PlanError
from edgeplan.plan.flashmem.plan import Ledger, Load, WeightPlan
from edgeplan.plan.flashmem.problem import Problem


@dataclass(frozen=True)
class WindowSolve:
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN | MODEL_INVALID
    weights: tuple[WeightPlan, ...]  # empty unless OPTIMAL or FEASIBLE
    objective: float | None
    bound: float | None
    seconds: float

    @property
    def solved(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE")

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        return 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.bound) / self.objective)


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:  # the runtime never plans; the pipeline extra installs OR-Tools
        raise PlanError("FlashMem planning needs OR-Tools (CP-SAT), which is not installed: "
                        "pip install -e '.[pipeline]'") from e
    return cp_model


def must_isolate() -> bool:
    """TensorFlow and OR-Tools each carry their own abseil and protobuf: with TensorFlow imported first,
    CP-SAT segfaults in ``Solve`` (measured here, ortools 9.15 / tensorflow 2.21). Such a process solves in a
    child that imports neither."""
    return "tensorflow" in sys.modules


_CHILD: subprocess.Popen | None = None
_CHILD_LOCK = threading.Lock()  # task threads plan deployments at once; one call on the pipe at a time


def isolated(fn, *args):
    """``fn(*args)`` in the solver process (``python -m edgeplan.plan.flashmem.opg``: it imports only
    edgeplan's planner and OR-Tools), started once and reused, ended with this process; pickles over pipes.
    Not ``multiprocessing``'s spawn, which re-imports the caller's main script."""
    with _CHILD_LOCK:
        return _call(fn, args)


def _call(fn, args):
    global _CHILD
    if _CHILD is None or _CHILD.poll() is not None:
        _CHILD = subprocess.Popen([sys.executable, "-m", "edgeplan.plan.flashmem.opg"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        atexit.register(_CHILD.kill)
    pickle.dump((fn, args), _CHILD.stdin)
    _CHILD.stdin.flush()
    try:
        ok, value = pickle.load(_CHILD.stdout)
    except EOFError:
        raise PlanError(f"the CP-SAT solver process died (exit {_CHILD.wait()})") from None
    if not ok:
        raise value
    return value


def _serve() -> None:
    """The solver process: calls from the pipe until it closes; stdout is the pipe, prints go to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    while True:
        try:
            fn, args = pickle.load(inp)
        except EOFError:
            return
        try:
            result = (True, fn(*args))
        except Exception as e:  # handed back to the caller, which raises it
            result = (False, e)
        pickle.dump(result, out)
        out.flush()


def solve(problem: Problem, ledger: Ledger, ws: list[int], soft: bool = False,
          preload: frozenset[int] = frozenset(), hint: list[WeightPlan] = ()) -> WindowSolve:
    """Place the weights ``ws`` (layer indices) given what ``ledger`` holds already; ``preload`` fixes p_w;
    ``hint`` (a placement of ``ws``, e.g. greedy latest-fit's) is CP-SAT's starting point: with it the soft
    tier has a solution from the start on chains where the search alone finds none in its time limit."""
    if must_isolate():
        return isolated(solve, problem, ledger, ws, soft, preload, hint)
    cp_model = _cp_model()
    t0 = time.perf_counter()
    m = cp_model.CpModel()
    lam = round(problem.lam * 1000)
    var: dict[int, tuple] = {}
    order: dict[int, dict] = {}  # e_{w,l} of the paper objective
    objective = []
    lo = min(problem.load_layers(i).start for i in ws)  # before lo only preloads of this window are resident
    arriving: dict[int, list] = {}  # layer -> KiB that becomes resident at it (reads, builds)
    reads: dict[int, list] = {}
    builds: dict[int, list] = {}
    preloads = []
    for i in ws:
        t, ck, pk, full = problem.chunks(i), problem.chunk_kib(i), problem.packed_kib(i), problem.full_kib(i)
        loads = list(problem.load_layers(i))
        p = m.NewBoolVar(f"p{i}")
        if not loads or i in preload:
            m.Add(p == 1)
        free = bool(loads) and not problem.build_us(i)
        builders = [loads[-1]] if free else build_layers(ledger, loads)
        x = {ell: m.NewIntVar(0, t, f"x{i}_{ell}") for ell in read_layers(ledger, loads, builders)}
        m.Add(t * p + sum(x.values()) == t)  # (C0)
        if free:
            # a build that costs nothing dominates at the last layer before use: an earlier one takes no capacity
            # either and only holds the packed bytes longer. Fixed there (y = 1 - p), CP-SAT need not find that
            # (Table 4's GPT-Neo rows, shapes only, build nothing: 1.3B's one `resident` window FEASIBLE, gap
            # 0.003, after 30 s -> OPTIMAL in 8-10 s; 125M 7.3-9.4 s -> 1.0-2.1 s)
            y, after, bracket = {loads[-1]: 1 - p}, {}, {}
        else:
            y = {ell: m.NewBoolVar(f"y{i}_{ell}") for ell in builders}
            m.Add(p + sum(y.values()) == 1)
            # every chunk read by the layer that builds the segment: x_{w,k} <= T(w)·[build at k or later], the
            # bracket a chain a_k = y_k + a_{k+1} (linear in |L(w)|; the plain sum is quadratic: 815k terms at
            # 600 layers); a layer that cannot build w shares the bracket of the next one that can
            after, bracket, later = {}, {}, None
            for k in reversed(loads):  # the last of L(w) is always a build layer (``build_layers``)
                if k in y:
                    a = m.NewBoolVar(f"a{i}_{k}")
                    m.Add(a == y[k] + later if later is not None else a == y[k])
                    after[k] = later = a
                bracket[k] = later
            for k in x:
                m.Add(x[k] <= t * bracket[k])
        objective.append(lam * t * ck * p)
        if problem.objective == "paper":
            # z_w order-encoded over the layers that may read w (z_w is one of them): e_l = [z_w <= l], and
            # i_w - z_w = the layers from z_w to i_w - 1, each e_l counting those up to the next such layer
            e = {ell: m.NewBoolVar(f"e{i}_{ell}") for ell in x}
            starts = list(e)
            for a, b in zip(starts, starts[1:]):
                m.Add(e[a] <= e[b])
            for ell in x:
                m.Add(x[ell] <= t * e[ell])  # (C1)
            # a cut the LP needs: w is read by its build layer, so e_l >= [built at l or before] = 1 - p - [built
            # after l], the bracket of layer l + 1 (none after the last layer of L(w), and a free build is at that
            # layer). Without it the LP bound stays at the objective's domain floor: DenseNet201's first window
            # (Table 4, paper, 10 s) ends FEASIBLE, gap 0.99; with it and the LP-heavy subsolver below, OPTIMAL in
            # 3.8-5.3 s (three solves)
            for ell in starts:
                if ell + 1 in bracket:
                    m.Add(e[ell] + bracket[ell + 1] >= 1 - p)
                elif ell == loads[-1]:
                    m.Add(e[ell] >= 1 - p)
            order[i] = e
            objective.append((1000 - lam) * t * ck * sum(e[a] * (b - a) for a, b in zip(starts, [*starts[1:], i])))
        else:
            objective.append((1000 - lam) * (sum(v * ck * (i - ell) for ell, v in x.items())
                                             + sum(b * pk * (i - ell) for ell, b in y.items())))
        for ell in x:
            reads.setdefault(ell, []).append(x[ell] * ck)
            arriving.setdefault(ell, []).append(x[ell] * ck)
        for ell, b in y.items():
            arriving.setdefault(ell, []).append(b * pk)
            if problem.build_us(i):
                builds.setdefault(ell, []).append(b * problem.build_us(i))
        preloads.append(p * full)
        var[i] = (p, x, y, after)
    # (C2) as a running total: resident(l) = resident(l-1) + what arrives at l - the weight used at l-1
    # (a weight is complete when used: exactly full_kib of it leaves), so the model stays linear in size
    total = sum(problem.full_kib(i) for i in ws)
    if lo > 0:
        m.Add(sum(preloads) <= max(0, min(ledger.mem_room(ell) for ell in range(lo))))
    prev = None
    resident = {}
    for ell in range(lo, max(ws) + 1):
        r = resident[ell] = m.NewIntVar(0, total, f"r{ell}")
        arrived = sum(arriving.get(ell, []))
        if prev is None:
            m.Add(r == sum(preloads) + arrived)
        else:
            gone = problem.full_kib(ell - 1) if ell - 1 in var else 0
            m.Add(r == prev + arrived - gone)
        m.Add(r <= max(0, ledger.mem_room(ell)))
        prev = r
    penalty = 1000 * (problem.lookback + 2)  # an over-capacity KiB (or build µs) outweighs any placement
    slacks = []
    for kind, rooms, table in (("read", ledger.read_room, reads), ("build", ledger.build_room, builds)):
        for ell, terms in table.items():
            room = max(0, rooms(ell))
            if soft:
                slack = m.NewIntVar(0, max(total, sum(problem.build_us(i) for i in ws)), f"s{kind}{ell}")
                m.Add(sum(terms) <= room + slack)
                objective.append(penalty * slack)
                slacks.append((kind, ell, room, slack))
            else:
                m.Add(sum(terms) <= room)  # (C3)
    m.Minimize(sum(objective))
    if hint:
        _hint(m, ledger, var, order, resident, slacks, hint)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = problem.workers
    solver.parameters.max_time_in_seconds = problem.time_limit_s
    solver.parameters.random_seed = 0
    # measured on Table 4's GPT-Neo-125M row (604 layers, `resident`, one window, 2 workers): OPTIMAL in 3.5 s with
    # the LP-heavy subsolver first and no probing in presolve, 13.5-14.3 s with the defaults (probing alone: 8.2 s,
    # max_lp alone: 6.8 s). The `paper` objective with the cut above: DenseNet201's first window OPTIMAL in 4.6 s
    # (the defaults: FEASIBLE, gap 0.99; its soft window spent 8.9 of its 10 s probing in presolve and found
    # nothing, falling to greedy), GPT-Neo-1.3B's longest of 12 windows 3.0-6.7 s (four solves; 5.9-8.5 s, three, with
    # the defaults)
    solver.parameters.subsolvers.extend(["max_lp", "default_lp", "core"])
    solver.parameters.cp_model_probing_level = 0
    if not soft:
        # the hint is CP-SAT's first solution only, not a phase of search kept near it: from greedy's placement
        # that phase held the proof back (GPT-Neo-1.3B, one window: OPTIMAL in 6.8-6.9 s without it, 15.6-16.6 s
        # with it, 8.2-10.7 s with no hint at all). The soft tier keeps it: on the bench's four models' soft
        # windows it moved the gaps both ways (InceptionV3 0.30 -> 0.03, VGG19 0.00 -> 0.01, ResNet50V2 0.04 ->
        # 0.05) and the plans' cold latency with them (interleaved, 11 rounds: geometric mean 0.841 vs 0.826)
        solver.parameters.hint_conflict_limit = 0
    code = solver.Solve(m)
    status = solver.StatusName(code)
    seconds = time.perf_counter() - t0
    if status not in ("OPTIMAL", "FEASIBLE"):
        return WindowSolve(status, (), None, None, seconds)
    out = []
    for i in ws:
        p, x, y, _ = var[i]
        layer = problem.layers[i]
        if solver.Value(p):
            out.append(WeightPlan(i, layer.name, layer.weight_bytes, problem.chunks(i), True))
            continue
        loads = tuple(Load(ell, int(solver.Value(v))) for ell, v in x.items() if solver.Value(v))
        build = next(ell for ell, v in y.items() if solver.Value(v))
        out.append(WeightPlan(i, layer.name, layer.weight_bytes, problem.chunks(i), False, loads, build))
    return WindowSolve(status, tuple(out), solver.ObjectiveValue() / 1000, solver.BestObjectiveBound() / 1000,
                       seconds)


def read_layers(ledger: Ledger, loads: list[int], builders: list[int]) -> list[int]:
    """The layers of L(w) where w's chunks may be read without losing an optimum: every layer with read capacity
    left, and, for each layer that may build w, the last one at or before it with none. Chunks read beyond C_l
    cost the same slack (soft tier) or are forbidden (strict) at every such layer, and the last of them that
    the build allows holds them resident for the fewest layers and puts z_w latest (both objectives prefer it)."""
    full = [ell for ell in loads if ledger.read_room(ell) <= 0]
    last = {max((ell for ell in full if ell <= b), default=None) for b in builders}
    return [ell for ell in loads if ell in last or ledger.read_room(ell) > 0]


def build_layers(ledger: Ledger, loads: list[int]) -> list[int]:
    """The layers of L(w) where w's build may be placed without losing an optimum: every layer with build shadow
    left, and the last of those with none. A build beyond the shadow costs the same slack (soft tier) or is
    forbidden (strict) at every shadowless layer, and at the last of them the segment's packed copy is resident
    for the fewest layers, its reads may be placed at any layer the others allow, and the ``resident`` objective
    prices it least; the ``paper`` objective does not see the build layer. DenseNet201's 202 layers here: 17
    have a shadow, so a window's build variables shrink from ~100 to ~18 per weight."""
    last = max((ell for ell in loads if ledger.build_room(ell) <= 0), default=None)
    return [ell for ell in loads if ell == last or ledger.build_room(ell) > 0]


def _hint(m, ledger: Ledger, var: dict[int, tuple], order: dict[int, dict], resident: dict, slacks: list,
          hint) -> None:
    """Every variable hinted (an incomplete hint is not taken as a solution): the placement's own, and the
    residency and slacks it implies, from the ledger with the hint committed."""
    book = ledger.copy()
    for w in hint:
        book.commit(w)
    for ell, r in resident.items():
        m.AddHint(r, book.mem[ell] - ledger.mem[ell])
    for kind, ell, room, slack in slacks:
        used = book.read[ell] - ledger.read[ell] if kind == "read" else book.build[ell] - ledger.build[ell]
        m.AddHint(slack, max(0, used - room))
    for w in hint:
        if w.layer not in var:
            continue
        p, x, y, after = var[w.layer]
        m.AddHint(p, int(w.preload))
        got = {load.layer: load.chunks for load in w.loads}
        for ell, v in x.items():
            m.AddHint(v, got.get(ell, 0))
        for ell, v in y.items():
            if after:  # else y is 1 - p, hinted with p
                m.AddHint(v, int(ell == w.build_layer))
        for ell, v in after.items():
            m.AddHint(v, int(w.build_layer is not None and w.build_layer >= ell))
        for ell, v in order.get(w.layer, {}).items():
            m.AddHint(v, int(w.z is not None and ell >= w.z))


if __name__ == "__main__":
    _serve()
