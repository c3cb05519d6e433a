"""SwapLess validation (issue: SwapLess planner). Writes bench/results/swapless_validation.json and .png.

Every TPU time comes from the EMULATED Edge TPU (profiles of `coral-usb-emulated`); CPU times are real
measurements on this machine (their raw samples drive the simulator).

Generated instances (one generator, `generate`): 1-4 models drawn from the profiled models below; for each,
3-12 of its partition points (0 and P always, interior points drawn at random); 1-4 cores; relative rates
drawn at random, then scaled so that the best configuration's bottleneck utilisation is a target drawn in
[0.1, 0.8].

Keys:
- mape_single / mape_multi: refined analytic mean latency per model against the simulated one (raw CPU
  samples, 30000 requests), for the exact-optimal configuration of every generated instance, single-tenant
  and multi-tenant instances apart; mape_single_paper / mape_multi_paper: the paper variant on the same.
- refined_within_2pct_fraction / refined_infeasible_count: the refined search against the exact optimum
  (refined model) on the generated instances; paper_*: Algorithm 1 on the paper model, judged against the
  exact optimum of the paper model.
- decision_time_ms_median / _p99: the refined search (cold: its six starts, then trades) on 4 models x 4 cores,
  each model with as many of its points as its profile has up to 12 (decision_points_per_model; profiles
  made with analysis.max_points 10 have 12), over 100 instances, each timed as the median of 5 runs;
  decision_time_ms_median_warm / _p99_warm: the online case, the rates drifted by a factor e^u, u uniform in
  [-0.3, 0.3], since the configuration in use was chosen (the refined optimum at the rates before), the search
  started from that configuration (and, as every warm search, from every model at its first point);
  decision_within_2pct_fraction(_warm): how often each is within 2% of
  the exact optimum on these instances, decision_infeasible_count(_warm) how often each found no configuration
  where the exact search found one. Algorithm 1's time beside them, timed alternately in the same loop,
  and the median per-instance ratio (decision_time_ratio_vs_algorithm1) — the machine's speed drifts, the
  ratio does not.
- reduction_vs_compiler: 1 - simulated mean latency of the SwapLess plan / that of the compiler default,
  at TPU utilisation 0.2 and 0.5 of the compiler default, single-tenant (each model) and multi-tenant
  (50:50 pairs); the paper reports 63.8% and 77.4% (up to).

`--artifacts DIR` holds DIR/<Arch>/1/profiles/coral-usb-emulated.json; without it the six models are compiled
(analysis.max_points 10) and profiled in .edgeplan/bench/swapless, once (``profiling.profiled``, ~30 minutes).
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import machine, publish, pyplot
from profiling import SWAPLESS_MODELS, SWAPLESS_WORK, profiled

from edgeplan.plan.simulate.des import simulate
from edgeplan.plan.swapless import allocate, baselines, queueing
from edgeplan.plan.swapless.from_profiles import model_spec
from edgeplan.plan.swapless.instance import Instance, ModelSpec
from edgeplan.profile.schema import Profile

MODELS = SWAPLESS_MODELS
CLASS = "coral-usb-emulated"
CAPACITY = 8 * 1024 * 1024
DECISIONS = 100  # decision-time instances (4 models x 12 points x 4 cores)


def subset(spec: ModelSpec, points: list[int]) -> ModelSpec:
    def pick(xs):
        return tuple(xs[p] for p in points) if xs else ()

    return ModelSpec(spec.name, spec.rate, pick(spec.s_tpu), pick(spec.io), pick(spec.t_load), pick(spec.footprint),
                     pick(spec.s_cpu), pick(spec.tpu_samples), pick(spec.cpu_samples))


def scale_to(inst: Instance, target: float) -> Instance | None:
    """Scale every rate by one factor so that the exact-optimal configuration's worst utilisation is ``target``."""
    def worst(factor):
        scaled = inst.with_rates([r * factor for r in inst.rates])
        opt = allocate.exact(scaled)
        if opt.config is None:
            return math.inf
        return max(queueing.evaluate(scaled, opt.config).utilisation.values())

    lo, hi = 1e-3, 1e4
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if worst(mid) < target:
            lo = mid
        else:
            hi = mid
    return inst.with_rates([r * lo for r in inst.rates])


def generate(rng: random.Random, specs: dict[str, ModelSpec], max_partitionings: int = 5000) -> tuple[Instance, float]:
    while True:
        n = rng.randint(1, 4)
        names = rng.sample(list(specs), n)
        models = []
        for i, name in enumerate(names):
            s = specs[name]
            k = rng.randint(3, min(12, s.last + 1))
            interior = sorted(rng.sample(range(1, s.last), k - 2)) if k > 2 else []
            m = subset(s, [0, *interior, s.last])
            models.append(ModelSpec(f"{name}#{i}", rng.uniform(0.2, 1.0), m.s_tpu, m.io, m.t_load, m.footprint,
                                    m.s_cpu, m.tpu_samples, m.cpu_samples))
        if math.prod(m.last + 1 for m in models) > max_partitionings:
            continue
        inst = Instance(tuple(models), rng.randint(1, 4), CAPACITY)
        target = rng.uniform(0.1, 0.8)
        scaled = scale_to(inst, target)
        if scaled is not None and allocate.exact(scaled).config is not None:
            return scaled, target


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[98]


def mape(pairs):
    return float(np.mean([abs(a - s) / s for a, s in pairs])) if pairs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", type=Path, help="DIR/<Arch>/1/profiles/coral-usb-emulated.json (default: the models "
                    f"compiled and profiled in {SWAPLESS_WORK}, made there when missing)")
    ap.add_argument("--quick", action="store_true", help="fewer instances and shorter simulations")
    ap.add_argument("--instances", type=int, default=None)
    args = ap.parse_args()
    n_inst = args.instances or (12 if args.quick else 60)
    requests = 8000 if args.quick else 30000
    args.artifacts = args.artifacts or profiled(SWAPLESS_WORK, MODELS)
    specs = {}
    for name in MODELS:
        path = args.artifacts / name / "1" / "profiles" / f"{CLASS}.json"
        if not path.is_file():
            raise SystemExit(f"{path}: missing; run bench/profiling.py (or edgeplan profile run) first")
        specs[name] = model_spec(name, 1.0, Profile.load(path), str(path))

    rng = random.Random(2026)
    rows, search = [], []
    for k in range(n_inst):
        inst, target = generate(rng, specs)
        opt = allocate.exact(inst)
        t0 = time.perf_counter()
        ref = allocate.refined(inst)
        ref_ms = (time.perf_counter() - t0) * 1e3
        opt_paper = allocate.exact(inst, "paper")
        alg1 = allocate.greedy(inst, "paper")
        search.append({"models": len(inst.models), "cores": inst.cores, "target_utilisation": target,
                       "exact": opt.objective, "refined": ref.objective, "refined_ms": ref_ms,
                       "exact_paper": opt_paper.objective, "algorithm1": alg1.objective})
        sim = simulate(inst, opt.config, requests=requests, seed=k, stochastic=True)
        ev_ref = queueing.evaluate(inst, opt.config, "refined")
        ev_pap = queueing.evaluate(inst, opt.config, "paper")
        for i, m in enumerate(inst.models):
            rows.append({"instance": k, "model": m.name, "tenants": len(inst.models), "point": opt.config.points[i],
                         "cores": opt.config.cores[i], "simulated_ms": sim.models[i].mean * 1e3,
                         "simulated_ci_ms": sim.models[i].mean_ci * 1e3, "refined_ms": ev_ref.latency[i] * 1e3,
                         "paper_ms": ev_pap.latency[i] * 1e3})
        print(f"[bench] instance {k + 1}/{n_inst}: {len(inst.models)} models, {inst.cores} cores", flush=True)

    def split(variant, single):
        return mape([(r[f"{variant}_ms"], r["simulated_ms"]) for r in rows
                     if (r["tenants"] == 1) == single and math.isfinite(r[f"{variant}_ms"])])

    feasible = [s for s in search if math.isfinite(s["exact"])]
    within = [s["refined"] <= s["exact"] * 1.02 for s in feasible]
    within_p = [s["algorithm1"] <= s["exact_paper"] * 1.02 for s in search if math.isfinite(s["exact_paper"])]

    # decision time (the refined search, 4 models x 4 cores, up to 12 points each): cold (the usual starts)
    # and warm (the online case: rates drifted by up to e^+-0.3 since the configuration in use was chosen,
    # the search started from it alone), Algorithm 1 beside them; timed interleaved, 5 runs each
    times, times_warm, times_alg1, decision_points, close, close_warm = [], [], [], [], [], []
    missed = missed_warm = 0  # no configuration found where the exact search has one
    big = [s for s in specs.values() if s.last + 1 >= 12] or list(specs.values())
    for k in range(DECISIONS):
        ms = []
        for i in range(4):
            s = rng.choice(big)
            pts = [0, *sorted(rng.sample(range(1, s.last), min(10, s.last - 1))), s.last]
            ms.append(ModelSpec(f"m{i}", rng.uniform(2, 20), *[tuple(x[p] for p in pts) for x in
                                                              (s.s_tpu, s.io, s.t_load, s.footprint, s.s_cpu)]))
        before = Instance(tuple(ms), 4, CAPACITY)
        in_use = allocate.refined(before).config
        inst = before.with_rates([r * math.exp(rng.uniform(-0.3, 0.3)) for r in before.rates])
        starts = [in_use.points] if in_use is not None else None
        decision_points.append([m.last + 1 for m in ms])
        runs, runs_warm, runs_alg1 = [], [], []
        for _ in range(5):
            t0 = time.perf_counter()
            cold = allocate.refined(inst)
            runs.append((time.perf_counter() - t0) * 1e3)
            if starts:
                t0 = time.perf_counter()
                warm = allocate.refined(inst, starts=starts)
                runs_warm.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            allocate.greedy(inst, "paper")
            runs_alg1.append((time.perf_counter() - t0) * 1e3)
        times.append(statistics.median(runs))
        times_alg1.append(statistics.median(runs_alg1))
        opt = allocate.exact(inst)
        if math.isfinite(opt.objective):
            close.append(cold.objective <= opt.objective * 1.02)
            missed += not math.isfinite(cold.objective)
            if starts:
                times_warm.append(statistics.median(runs_warm))
                close_warm.append(warm.objective <= opt.objective * 1.02)
                missed_warm += not math.isfinite(warm.objective)
        print(f"[bench] decision time {k + 1}/{DECISIONS}: cold {times[-1]:.2f} ms", flush=True)

    reduction = {}
    for rho in (0.2, 0.5):
        for tenancy in ("single", "multi"):
            groups = [[n] for n in MODELS] if tenancy == "single" else [
                [a, b] for a, b in zip(MODELS, MODELS[1:] + MODELS[:1])]
            values = []
            for group in groups:
                inst = Instance(tuple(specs[n].with_rate(1.0) for n in group), 4, CAPACITY)
                default, _ = baselines.compiler_default(inst)
                # rates (equal) such that the compiler default keeps the TPU busy rho of the time
                busy = queueing.tpu_state(inst, default.points).rho  # at 1 request/s each
                inst = inst.with_rates([rho / busy] * len(group))
                plan = allocate.exact(inst) if math.prod(m.last + 1 for m in inst.models) <= 5000 else allocate.refined(inst)
                a = simulate(inst, default, requests=requests, seed=1, stochastic=True)
                b = simulate(inst, plan.config, requests=requests, seed=1, stochastic=True)
                mean = lambda r: sum(m.mean * x.rate for m, x in zip(r.models, inst.models)) / sum(inst.rates)
                values.append({"models": group, "compiler_ms": mean(a) * 1e3, "swapless_ms": mean(b) * 1e3,
                               "reduction": 1 - mean(b) / mean(a), "plan": list(plan.config.points)})
            reduction[f"rho={rho} {tenancy}"] = {"mean": statistics.fmean(v["reduction"] for v in values),
                                                 "max": max(v["reduction"] for v in values), "cases": values}

    result = {
        "quick": args.quick,
        "machine": machine(),
        "mape_single": split("refined", True),
        "mape_multi": split("refined", False),
        "mape_single_paper": split("paper", True),
        "mape_multi_paper": split("paper", False),
        "refined_within_2pct_fraction": sum(within) / len(within) if within else None,
        "refined_infeasible_count": sum(1 for s in feasible if not math.isfinite(s["refined"])),
        "paper_within_2pct_fraction": sum(within_p) / len(within_p) if within_p else None,
        "paper_infeasible_count": sum(1 for s in search if math.isfinite(s["exact_paper"]) and not math.isfinite(s["algorithm1"])),
        "decision_time_ms_median": statistics.median(times),
        "decision_time_ms_p99": p99(times),
        "decision_time_ms_median_warm": statistics.median(times_warm),
        "decision_time_ms_p99_warm": p99(times_warm),
        "decision_within_2pct_fraction": sum(close) / len(close),
        "decision_within_2pct_fraction_warm": sum(close_warm) / len(close_warm),
        "decision_infeasible_count": missed,
        "decision_infeasible_count_warm": missed_warm,
        "decision_time_ms_median_algorithm1": statistics.median(times_alg1),
        "decision_time_ratio_vs_algorithm1": statistics.median(a / b for a, b in zip(times, times_alg1)),
        "decision_points_per_model": max(max(p) for p in decision_points),
        "reduction_vs_compiler": {k: {"mean": v["mean"], "max": v["max"]} for k, v in reduction.items()},
        "paper_reduction_vs_compiler": {"single (up to)": 0.638, "multi (up to)": 0.774},
        "source": "TPU service times: EMULATED Edge TPU; CPU: real measurements (raw samples); latencies: simulated",
        "instances": len(search),
        "rows": rows,
        "search": [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in s.items()} for s in search],
        "reduction_cases": reduction,
    }
    publish("swapless_validation", result, plot, ("mape_single", "mape_multi", "mape_single_paper", "mape_multi_paper",
                                  "refined_within_2pct_fraction", "refined_infeasible_count",
                                  "paper_within_2pct_fraction", "paper_infeasible_count", "decision_time_ms_median",
                                  "decision_time_ms_p99", "decision_time_ms_median_warm", "decision_time_ms_p99_warm"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    rows = result["rows"]
    for variant, marker in (("refined", "o"), ("paper", "x")):
        a1.scatter([r["simulated_ms"] for r in rows], [r[f"{variant}_ms"] for r in rows], marker=marker, alpha=0.7,
                   label=f"{variant} analytic")
    lo = min(r["simulated_ms"] for r in rows)
    hi = max(r["simulated_ms"] for r in rows)
    a1.plot([lo, hi], [lo, hi], "k--", lw=1)
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("simulated mean latency, ms (EMULATED TPU, measured CPU samples)")
    a1.set_ylabel("analytic mean latency, ms")
    a1.set_title(f"MAPE refined {result['mape_single']:.1%} single / {result['mape_multi']:.1%} multi")
    a1.legend()
    red = result["reduction_vs_compiler"]
    names = list(red)
    a2.bar(range(len(names)), [100 * red[n]["mean"] for n in names], label="mean")
    a2.scatter(range(len(names)), [100 * red[n]["max"] for n in names], color="k", label="max", zorder=3)
    a2.set_xticks(range(len(names)), names)
    a2.set_ylabel("latency reduction vs compiler default, %")
    a2.set_title("SwapLess vs Edge TPU compiler default (simulated, EMULATED TPU)")
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
