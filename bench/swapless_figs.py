"""SwapLess evaluation figures (issue: SwapLess planner), on the EMULATED Edge TPU with real CPU profiles.
Writes bench/results/swapless_figs.json and swapless_figs.png.

- fig5: latency of ResNet50V2 and InceptionV3 by partition point (at a fixed rate, best cores) and by rate
  (at the planned point), predicted (refined, paper) and simulated;
- fig6: the weight-miss probability: a two-model mix that fits in the cache (MobileNetV2 + EfficientNetB0)
  and 50:50 and 90:10 mixes that do not (ResNet50V2 + DenseNet201, both wholly on the TPU): alpha of the
  paper (eq. (10)), alpha of the refined model, the simulator's miss rate, and the latency each predicts;
- fig7: SwapLess against the three baselines (compiler default, threshold, alpha = 0) at TPU utilisation
  0.2 and 0.5 of the compiler default, single- and multi-tenant, simulated.

- fig8: rates that change over time (InceptionV3 + MobileNetV2, six phases, InceptionV3's rate rising
  then falling), one continuous simulated run: latency over time (1 s bins) of the compiler default, of
  SwapLess planned once for the first phase, and of SwapLess re-allocating LAG_S after each change;
  requests in flight at a switch finish under the partition they started with, and none is lost
  (arrived == completed).

`--artifacts DIR` as for bench/swapless_validation.py (the same default: .edgeplan/bench/swapless, made once).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, publish, pyplot
from profiling import SWAPLESS_MODELS, SWAPLESS_WORK, profiled

from edgeplan.plan.simulate.des import Phase, simulate, simulate_phases
from edgeplan.plan.swapless import allocate, baselines, queueing
from edgeplan.plan.swapless.from_profiles import model_spec
from edgeplan.plan.swapless.instance import Config, Instance
from edgeplan.profile.schema import Profile

CLASS = "coral-usb-emulated"
CAP = 8 * 1024 * 1024
CORES = 4  # the paper's Raspberry Pi 5; CPU service times are this machine's, per core
LAG_S = 2.0  # fig8: how long after a rate change the runtime re-allocates (its sliding rate window)
BIN_S = 1.0
SATURATED = 0.9  # figure_mape: bottleneck utilisation above which the simulator cannot judge


def load(arts: Path, name: str, rate: float = 1.0):
    return model_spec(name, rate, Profile.load(arts / name / "1" / "profiles" / f"{CLASS}.json"))


def mean_ms(sim, inst) -> float:
    return 1e3 * sum(m.mean * x.rate for m, x in zip(sim.models, inst.models)) / sum(inst.rates)


def fig5(arts: Path, requests: int) -> dict:
    out = {}
    for name, rate in (("ResNet50V2", 40.0), ("InceptionV3", 25.0)):
        spec = load(arts, name, rate)
        by_point = []
        for p in range(spec.last + 1):
            inst = Instance((spec,), CORES, CAP)
            tpu = queueing.tpu_state(inst, (p,))
            cost, ks = allocate.best_cores(inst, (p,), tpu) if tpu.feasible else (None, None)
            if ks is None:
                by_point.append({"point": p, "stable": False})
                continue
            config = Config((p,), ks)
            sim = simulate(inst, config, requests=requests, seed=p, stochastic=True)
            ev = queueing.evaluate(inst, config, "refined")
            by_point.append({"point": p, "cores": ks[0], "stable": True, "utilisation": max(ev.utilisation.values()),
                             "simulated_ci_ms": sim.models[0].mean_ci * 1e3,
                             "refined_ms": ev.latency[0] * 1e3,
                             "paper_ms": queueing.evaluate(inst, config, "paper").latency[0] * 1e3,
                             "simulated_ms": sim.models[0].mean * 1e3})
        plan = allocate.exact(Instance((spec,), CORES, CAP))
        by_rate = []
        for factor in (0.25, 0.5, 1.0, 1.5, 2.0):
            inst = Instance((spec.with_rate(rate * factor),), CORES, CAP)
            ev = queueing.evaluate(inst, plan.config, "refined")
            if not ev.feasible:
                by_rate.append({"rate": rate * factor, "stable": False})
                continue
            sim = simulate(inst, plan.config, requests=requests, seed=7, stochastic=True)
            by_rate.append({"rate": rate * factor, "stable": True, "refined_ms": ev.latency[0] * 1e3,
                            "utilisation": max(ev.utilisation.values()), "simulated_ci_ms": sim.models[0].mean_ci * 1e3,
                            "paper_ms": queueing.evaluate(inst, plan.config, "paper").latency[0] * 1e3,
                            "simulated_ms": sim.models[0].mean * 1e3})
        out[name] = {"rate": rate, "planned": list(plan.config.points) + list(plan.config.cores),
                     "by_point": by_point, "by_rate": by_rate}
    return out


def fig6(arts: Path, requests: int) -> dict:
    out = {}
    mixes = {
        "fits (MobileNetV2 + EfficientNetB0, 50:50)": (("MobileNetV2", 50.0), ("EfficientNetB0", 50.0)),
        "50:50 (ResNet50V2 + DenseNet201)": (("ResNet50V2", 6.0), ("DenseNet201", 6.0)),
        "90:10 (ResNet50V2 + DenseNet201)": (("ResNet50V2", 10.8), ("DenseNet201", 1.2)),
    }
    for label, mix in mixes.items():
        specs = [load(arts, n, r) for n, r in mix]
        inst = Instance(tuple(specs), CORES, CAP)
        points = tuple(s.last for s in specs)
        if "fits" in label:  # the deepest points whose prefixes fit in the cache together
            points = max(((a, b) for a in range(specs[0].last + 1) for b in range(specs[1].last + 1)
                          if specs[0].footprint[a] + specs[1].footprint[b] <= CAP), key=sum)
        cores = allocate.best_cores(inst, points, queueing.tpu_state(inst, points))[1] or (0, 0)
        config = Config(points, cores)
        sim = simulate(inst, config, requests=requests, seed=3, stochastic=True)
        out[label] = {
            "points": list(points),
            "footprint_bytes": [s.footprint[p] for s, p in zip(specs, points)],
            "alpha_paper": queueing.alpha_paper(inst, points),
            "alpha_refined": queueing.alpha_lru(inst, points),
            "miss_rate_simulated": [m.miss_rate for m in sim.models],
            "latency_ms": {
                "paper": [t * 1e3 for t in queueing.evaluate(inst, config, "paper").latency],
                "refined": [t * 1e3 for t in queueing.evaluate(inst, config, "refined").latency],
                "alpha_zero": [t * 1e3 for t in queueing.evaluate(inst, config, "refined", use_alpha=False).latency],
                "simulated": [m.mean * 1e3 for m in sim.models],
            },
        }
    return out


def fig7(arts: Path, requests: int) -> dict:
    names = SWAPLESS_MODELS
    out = {}
    for rho in (0.2, 0.5):
        for tenancy, groups in (("single", [[n] for n in names]),
                                ("multi", [[a, b] for a, b in zip(names, names[1:] + names[:1])])):
            cases = []
            for group in groups:
                inst = Instance(tuple(load(arts, n) for n in group), CORES, CAP)
                default, _ = baselines.compiler_default(inst)
                inst = inst.with_rates([rho / queueing.tpu_state(inst, default.points).rho] * len(group))
                configs = {"compiler_default": baselines.compiler_default(inst)[0],
                           "threshold": baselines.threshold(inst)[0], "alpha_zero": baselines.alpha_zero(inst)[0],
                           "swapless": allocate.refined(inst).config}
                row = {"models": group}
                for key, config in configs.items():
                    row[key] = (mean_ms(simulate(inst, config, requests=requests, seed=1, stochastic=True), inst)
                                if config is not None else None)
                cases.append(row)
            out[f"rho={rho} {tenancy}"] = cases
    return out


def fig8(arts: Path, requests: int) -> dict:
    """A transient run: rates change every PHASE_S seconds; the re-allocating SwapLess switches points and
    cores LAG_S after each change (the runtime's rate window), requests in flight keep their partition."""
    import time

    base = Instance((load(arts, "InceptionV3"), load(arts, "MobileNetV2")), CORES, CAP)
    rates = [(4.0, 60.0), (8.0, 60.0), (14.0, 60.0), (20.0, 40.0), (12.0, 80.0), (4.0, 120.0)]
    phase_s = max(20.0, requests / 100 / len(rates))  # about requests / 100 ... requests / 30 arrivals in all
    end = phase_s * len(rates)
    adaptive, decisions = [], []
    for r in rates:
        t0 = time.perf_counter()
        adaptive.append(allocate.refined(base.with_rates(r)).config)
        decisions.append((time.perf_counter() - t0) * 1e3)
    default = baselines.compiler_default(base)[0]
    schedules = {
        "compiler_default": [Phase(k * phase_s, r, default) for k, r in enumerate(rates)],
        "static": [Phase(k * phase_s, r, adaptive[0]) for k, r in enumerate(rates)],
        "adaptive": [Phase(0.0, rates[0], adaptive[0])] + [
            ph for k in range(1, len(rates)) for ph in (Phase(k * phase_s, rates[k], adaptive[k - 1]),
                                                        Phase(k * phase_s + LAG_S, rates[k], adaptive[k]))],
    }
    out = {"models": [m.name for m in base.models], "rates": [list(r) for r in rates], "phase_s": phase_s,
           "lag_s": LAG_S, "bin_s": BIN_S, "decision_ms": decisions,
           "configs": {"compiler_default": [list(default.points), list(default.cores)],
                       "adaptive": [[list(c.points), list(c.cores)] for c in adaptive]}}
    for key, phases in schedules.items():
        tl = simulate_phases(base, phases, end, bin_s=BIN_S, seed=8, stochastic=True)
        per_bin = [_weighted(row, cnt) for row, cnt in zip(tl.mean, tl.requests)]
        per_phase = []
        for k in range(len(rates)):
            cells = [(tl.mean[j][i], tl.requests[j][i]) for j, t in enumerate(tl.starts)
                     if k * phase_s <= t < (k + 1) * phase_s for i in range(len(rates[k])) if tl.requests[j][i]]
            per_phase.append(1e3 * sum(m * c for m, c in cells) / sum(c for _, c in cells) if cells else None)
        out[key] = {"bin_mean_ms": per_bin, "phase_mean_ms": per_phase, "arrived": tl.arrived,
                    "completed": tl.completed}
    return out


def figure_mape(result: dict) -> dict:
    """The analytic models against the simulator over every configuration of Figs. 5 (single-tenant: each
    point, each rate) and 6 (multi-tenant: each model of each mix); the issue's MAPE over the benchmark
    configurations, beside bench/swapless_validation.py's over generated instances.

    Configurations whose bottleneck utilisation is above SATURATED are counted apart (mape_single_all has
    them): there a finite simulation is not yet at steady state (its mean keeps growing with the run's
    length), so it cannot judge the steady-state model."""
    rows = [r for d in result["fig5"].values() for r in d["by_point"] + d["by_rate"] if r["stable"]]
    single = [r for r in rows if r["utilisation"] <= SATURATED]
    out = {"mape_single_all": sum(abs(r["refined_ms"] - r["simulated_ms"]) / r["simulated_ms"] for r in rows) / len(rows),
           "saturated": [r for r in rows if r["utilisation"] > SATURATED]}
    for v in ("refined", "paper"):
        suffix = "" if v == "refined" else "_paper"
        out["mape_single" + suffix] = sum(abs(r[f"{v}_ms"] - r["simulated_ms"]) / r["simulated_ms"]
                                          for r in single) / len(single)
        pairs = [(a, b) for d in result["fig6"].values()
                 for a, b in zip(d["latency_ms"][v], d["latency_ms"]["simulated"])]
        out["mape_multi" + suffix] = sum(abs(a - b) / b for a, b in pairs) / len(pairs)
    out["mape_configurations"] = {"single": len(single), "multi": len(pairs), "single_saturated": len(rows) - len(single)}
    return out


def _weighted(means, counts) -> float | None:
    """Request-weighted mean latency in ms over models (None without requests)."""
    total = sum(counts)
    return 1e3 * sum(m * c for m, c in zip(means, counts) if c) / total if total else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", type=Path, help="DIR/<Arch>/1/profiles/coral-usb-emulated.json (default: the models "
                    f"compiled and profiled in {SWAPLESS_WORK}, made there when missing)")
    ap.add_argument("--quick", action="store_true", help="shorter simulations")
    args = ap.parse_args()
    requests = 5000 if args.quick else 30000
    args.artifacts = args.artifacts or profiled(SWAPLESS_WORK, SWAPLESS_MODELS)
    result = {"quick": args.quick, "machine": machine(), "cores": CORES,
              "source": "TPU: EMULATED Edge TPU; CPU: real measurements (raw samples); latencies simulated",
              "fig5": fig5(args.artifacts, requests), "fig6": fig6(args.artifacts, requests),
              "fig7": fig7(args.artifacts, requests), "fig8": fig8(args.artifacts, requests)}
    result.update(figure_mape(result))
    publish("swapless_figs", result, plot, ("cores", "mape_single", "mape_multi", "mape_single_paper",
                                            "mape_multi_paper"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(27, 4.8))
    for ax, (name, d) in zip(axes[:2], result["fig5"].items()):
        pts = [r for r in d["by_point"] if r["stable"]]
        for key, style in (("simulated_ms", "k-o"), ("refined_ms", "b--"), ("paper_ms", "r:")):
            ax.plot([r["point"] for r in pts], [r[key] for r in pts], style, label=key.replace("_ms", ""))
        ax.set_yscale("log")  # near saturation (rho -> 1) the latency explodes
        ax.set_xlabel("partition point")
        ax.set_ylabel("mean latency, ms (log)")
        ax.set_title(f"{name} at {d['rate']:g}/s (EMULATED TPU)")
        ax.legend()
    f6 = result["fig6"]
    labels = list(f6)
    x = range(len(labels))
    ax = axes[2]
    for j, (key, marker) in enumerate((("alpha_paper", "r^"), ("alpha_refined", "bs"), ("miss_rate_simulated", "ko"))):
        for i, label in enumerate(labels):
            ax.plot([i - 0.1, i + 0.1], f6[label][key], marker, label=key if i == 0 else None)
    ax.set_xticks(list(x), [lab.split(" (")[0] for lab in labels])
    ax.set_ylabel("weight-miss probability (per model)")
    ax.set_title("alpha: eq. (10), refined (LRU), simulated")
    ax.legend()
    ax = axes[3]
    f7 = result["fig7"]
    keys = ("compiler_default", "threshold", "alpha_zero", "swapless")
    groups = list(f7)
    width = 0.2
    for j, key in enumerate(keys):
        vals = []
        for g in groups:
            rows = [r for r in f7[g] if r[key] is not None and r["compiler_default"]]
            vals.append(sum(r[key] / r["compiler_default"] for r in rows) / len(rows) if rows else 0)
        ax.bar([i + (j - 1.5) * width for i in range(len(groups))], vals, width, label=key)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("mean latency / compiler default (simulated)")
    ax.set_title("SwapLess vs baselines (EMULATED TPU)")
    ax.legend()
    ax = axes[4]
    f8 = result["fig8"]
    for key, style in (("compiler_default", "r-"), ("static", "g-"), ("adaptive", "b-")):
        ys = [v if v is not None else float("nan") for v in f8[key]["bin_mean_ms"]]
        ax.plot([j * f8["bin_s"] for j in range(len(ys))], ys, style, lw=1, label=key)
    for k, r in enumerate(f8["rates"]):
        ax.axvline(k * f8["phase_s"], color="0.8", lw=0.8)
        ax.text(k * f8["phase_s"] + 1, 0.98, f"{r[0]:g}/{r[1]:g}", transform=ax.get_xaxis_transform(),
                va="top", fontsize=8)
    ax.set_xlabel("time, s (phases: InceptionV3 / MobileNetV2 requests per s)")
    ax.set_ylabel("mean latency per 1 s bin, ms (simulated, log)")
    ax.set_yscale("log")
    ax.set_title("rates over time, re-allocation (EMULATED TPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
