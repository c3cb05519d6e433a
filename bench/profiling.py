"""Profiling benchmark (issue: device profiling). Writes bench/results/profiling.json and profiling.png.

Keys:
- emulator_loao_median / emulator_loao_max: every row of the Coral calibration table (three hosts: desktop and
  Raspberry Pi 4B with the USB Accelerator, the Dev Board over PCIe) predicted by the emulated Edge TPU fitted
  jointly on every host without any row of that architecture (leave-one-architecture-out); the median and the
  largest |predicted/measured - 1|; per row in emulator_loao_errors (with the term that dominates it), per
  host in emulator_loao_by_host. emulator_params: the fitted values and their bounds. EMULATED model against
  published measurements.
- emulator_whole_model_ms: for each Keras architecture, tpu_ms of point P (the whole model on the EMULATED
  Edge TPU) beside the whole model's CPU latency MEASURED here (1 and 2 threads).
- cpu_repeatability_max_rel_diff: two profiling passes of the same segments in one run (ResNet50V2 and
  EfficientNetB0); the largest |B/A - 1| of the per-segment medians, as the profiles report them (at the
  device class's reference speed, through the speed probe timed in the same rounds), over segments of
  1 ms or more; the median over those segments, and the same figures on the raw (unscaled) times, beside
  it. Real execution.
- predictor_mape_heldout: the XGBoost predictor trained on the measured segments (prefixes and suffixes,
  1 and 2 threads; its base also on the blocks between their cut points) of the TRAIN architectures (16:
  MobileNet v1/v2/v3, EfficientNetB1, ResNet 50/101/50V2/152V2, DenseNet 121/169/201, Xception, NASNetMobile,
  InceptionResNetV2, ConvNeXtTiny; the big ones at reduced inputs, FULL_SIZES), evaluated on those of
  InceptionV3 and EfficientNetB0 (never in training) against real measurements;
  predictor_mape_heldout_by_threads per thread count; beside them the suffix-only figure (what the pipeline
  predicts) and per model. predictor_loao_median: each training architecture predicted by the predictor trained
  on the others (MAPE), the median over them.
- predicted_plan_regret: the held-out pair deployed together (InceptionV3 + EfficientNetB0, the class's cores,
  rates scaled so that the measured-profile plan's busiest resource is at 0.3, 0.5 and 0.7): SwapLess planned
  (exact search) from the profiles with every suffix's one-thread time predicted, and from the measured
  profiles; both plans' objectives evaluated on the measured profiles; the largest relative excess of the
  predicted plan's.
- profile_resnet50v2_seconds: wall time of `edgeplan profile run` on ResNet50V2 (max_points 8, k = 1, 2).

`--artifacts DIR` reuses compiled models (DIR/<Arch>/1); otherwise they are compiled here (about 30 minutes
at full size). `--quick` uses 96x96 inputs and shorter timing spans, with the same definitions.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import machine, publish, pyplot

from edgeplan.pipeline import params as params_mod
from edgeplan.profile import tpu_model
from edgeplan.profile.predictor import Predictor, examples, mape
from edgeplan.profile.schema import Profile

TRAIN = ["MobileNetV2", "ResNet50V2", "DenseNet201", "Xception", "MobileNet", "MobileNetV3Large", "MobileNetV3Small",
         "EfficientNetB1", "ResNet50", "ResNet101", "DenseNet121", "NASNetMobile", "InceptionResNetV2", "ConvNeXtTiny",
         "ResNet152V2", "DenseNet169"]
HELD_OUT = ["InceptionV3", "EfficientNetB0"]
REPEAT = ["ResNet50V2", "EfficientNetB0"]
# the architectures' default inputs, reduced for the largest (their profiling time)
FULL_SIZES = {"MobileNetV2": 224, "ResNet50V2": 224, "InceptionV3": 299, "DenseNet201": 224, "Xception": 299,
              "EfficientNetB0": 224, "MobileNet": 224, "MobileNetV3Large": 224, "MobileNetV3Small": 224,
              "EfficientNetB1": 240, "ResNet50": 224, "ResNet101": 224, "DenseNet121": 224, "NASNetMobile": 224,
              "InceptionResNetV2": 160, "ConvNeXtTiny": 160, "ResNet152V2": 160, "DenseNet169": 224}
CLASS = "coral-usb-emulated"
EDGEPLAN = [sys.executable, "-m", "edgeplan.cli"]


def compile_models(work: Path, sizes: dict[str, int], max_points: int = 8) -> Path:
    from edgeplan.pipeline import stages
    from edgeplan.zoo import keras_apps

    params = params_mod.load(Path(__file__).resolve().parents[1] / "params.yaml")
    params["analysis"]["max_points"] = max_points
    for arch, size in sizes.items():
        print(f"[bench] compiling {arch} at {size}x{size} ...", flush=True)
        src = keras_apps.build(arch, size, work / "zoo" / f"{arch}_{size}")
        root = stages.ingest(src, arch, "1", work / "artifacts")
        stages.build(root, params)
    return work / "artifacts"


# the SwapLess benches' models and where they are compiled and profiled when no --artifacts is given
SWAPLESS_MODELS = ["MobileNetV2", "EfficientNetB0", "DenseNet201", "ResNet50V2", "Xception", "InceptionV3"]
SWAPLESS_WORK = Path(__file__).resolve().parents[1] / ".edgeplan" / "bench" / "swapless"


def profiled(work: Path, archs: list[str], max_points: int = 10) -> Path:
    """``work/artifacts/<Arch>/1`` compiled (``analysis.max_points``; 10 gives 12 points) and profiled for the
    class at the default span, CPU prefixes included, for each of ``archs`` at its FULL_SIZES input; only what
    is missing is made (about 5 minutes a model). The SwapLess benches' default when no ``--artifacts``."""
    arts = work / "artifacts"
    todo = [a for a in archs if not (arts / a / "1" / "profiles" / f"{CLASS}.json").is_file()]
    fresh = [a for a in todo if not (arts / a / "1" / "analysis.json").is_file()]
    if fresh:
        compile_models(work, {a: FULL_SIZES[a] for a in fresh}, max_points)
    for arch in todo:
        print(f"[bench] profiling {arch} ...", flush=True)
        profile(arts / arch / "1", params_mod.DEFAULTS["profile"]["span_s"])
    return arts


def profile(root: Path, span_s: float, keep: Path | None = None) -> tuple[Profile, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([*EDGEPLAN, "profile", "run", str(root), "--device-class", CLASS, "--cpu-prefixes",
                           "--span-s", str(span_s)], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"profile run {root} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    path = root / "profiles" / f"{CLASS}.json"
    if keep is not None:
        keep.write_bytes(path.read_bytes())
    return Profile.load(path), seconds


def emulator_figures() -> dict:
    """The emulated Edge TPU's leave-one-architecture-out errors over the calibration table and its fitted values."""
    tpu = tpu_model.for_host("desktop")
    cal = tpu.calibration
    loao = list(tpu_model.shipped_loao())
    errors = [abs(r["error"]) for r in loao]
    by_host = {h: [abs(r["error"]) for r in loao if r["host"] == h] for h in cal["hosts"]}
    p = cal["params"]
    bounds = {**tpu_model.SHARED, **tpu_model.PER_HOST}
    return {
        "emulator_loao_median": float(np.median(errors)),
        "emulator_loao_max": max(errors),
        "emulator_loao_by_host": {h: {"median": float(np.median(v)), "max": max(v), "rows": len(v)}
                                  for h, v in by_host.items()},
        "emulator_loao_errors": loao,
        "emulator_fit_rows": cal["fit_rows"],
        "emulator_params": {
            "model": tpu_model.MODEL_VERSION,
            **{k: {"value": p[k], "bounds": [lo, hi]} for k, (lo, hi, _) in bounds.items()},
            # every fitted value within its physical bounds (efficiencies above 0: their lower bounds are 1e-3)
            "physically_plausible": all(lo <= v <= hi for k, (lo, hi, _) in bounds.items()
                                        for v in (p[k].values() if isinstance(p[k], dict) else [p[k]])),
            "published_constants": {"peak_macs_per_s": tpu.peak_macs_per_s, "onchip_bytes": tpu.onchip_param_bytes,
                                    "link_bytes_per_s": tpu_model.HOST_LINKS},
        },
    }


def plan_regret(measured: dict[str, Profile], predicted_ms: dict[tuple[str, int], float]) -> list[dict]:
    """The held-out models deployed together, planned from predicted suffix times and from measured ones; both
    plans evaluated on the measured profiles (``predicted_plan_regret`` above)."""
    import dataclasses

    from swapless_validation import scale_to

    from edgeplan.plan.swapless import allocate, queueing
    from edgeplan.plan.swapless.from_profiles import model_spec
    from edgeplan.plan.swapless.instance import Instance

    cores = int(params_mod.DEFAULTS["fleet"]["device_classes"][CLASS].get("cores") or os.cpu_count() or 2)
    specs = [model_spec(a, 1.0, p) for a, p in measured.items()]
    guessed = [dataclasses.replace(s, s_cpu=tuple(predicted_ms.get((p.model, i), 0.0) / 1e3 if i < s.last else 0.0
                                                  for i in range(s.last + 1)), cpu_samples=())
               for s, p in zip(specs, measured.values())]
    base = Instance(tuple(specs), cores, 8 * 1024 * 1024)
    out = []
    for target in (0.3, 0.5, 0.7):
        inst = scale_to(base, target)  # one factor on every rate: the measured plan's busiest resource at target
        rates = list(inst.rates)
        best = allocate.exact(inst)
        plan = allocate.exact(Instance(tuple(s.with_rate(r) for s, r in zip(guessed, rates)), cores, base.capacity))
        got = queueing.evaluate(inst, plan.config).objective if plan.config else float("inf")
        out.append({"utilisation": target, "rate_per_s": rates[0], "measured_plan": list(best.config.points),
                    "measured_cores": list(best.config.cores),
                    "predicted_plan": list(plan.config.points) if plan.config else None,
                    "predicted_cores": list(plan.config.cores) if plan.config else None,
                    "regret": got / best.objective - 1})
    return out


def repeatability(a: Profile, b: Profile, floor_ms: float = 1.0) -> list[dict]:
    rows = []
    for s in a.segments:
        for t in s.cpu:
            u = b.segment(s.point, s.role).cpu_timing(t.threads)
            if t.median_ms >= floor_ms and u is not None:
                rows.append({"model": a.model, "point": s.point, "role": s.role, "threads": t.threads,
                             "a_ms": t.median_ms, "b_ms": u.median_ms, "rel_diff": u.median_ms / t.median_ms - 1,
                             "a_raw_ms": t.median_ms / t.scale, "b_raw_ms": u.median_ms / u.scale,
                             "raw_rel_diff": (u.median_ms / u.scale) / (t.median_ms / t.scale) - 1})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="96x96 inputs, shorter timing spans; same definitions")
    ap.add_argument("--artifacts", type=Path, help="reuse compiled models: DIR/<Arch>/1")
    args = ap.parse_args()
    span = 5.0 if args.quick else params_mod.DEFAULTS["profile"]["span_s"]
    sizes = {a: 96 for a in FULL_SIZES} if args.quick else FULL_SIZES
    arts = args.artifacts or compile_models(Path(tempfile.mkdtemp(prefix="edgeplan-bench-")), sizes)

    print("[bench] emulator calibration ...", flush=True)
    emulator = emulator_figures()

    profiles: dict[str, Profile] = {}
    seconds: dict[str, float] = {}
    kept = Path(tempfile.mkdtemp(prefix="edgeplan-bench-profiles-"))
    for arch in TRAIN + HELD_OUT:
        print(f"[bench] profiling {arch} ...", flush=True)
        profiles[arch], seconds[arch] = profile(arts / arch / "1", span, kept / f"{arch}.json")
    second = {}
    for arch in REPEAT:
        print(f"[bench] profiling {arch} again ...", flush=True)
        second[arch], _ = profile(arts / arch / "1", span)
    rep = [r for arch in REPEAT for r in repeatability(profiles[arch], second[arch])]
    rel = [abs(r["rel_diff"]) for r in rep]
    raw = [abs(r["raw_rel_diff"]) for r in rep]
    probes = {f"{arch} pass {i}": {str(t.threads): t.median_ms for t in p.probe}
              for arch in REPEAT for i, p in ((1, profiles[arch]), (2, second[arch]))}
    whole = {}
    for arch, p in profiles.items():
        last = p.segment(p.last_point, "prefix").tpu
        full = p.segment(0, "suffix")
        whole[arch] = {"input": sizes[arch], "tpu_ms_emulated": last.tpu_ms, "tpu_compute_ms_emulated": last.tpu_compute_ms,
                       "io_ms_emulated": last.io_ms, "load_ms_emulated": last.load_ms,
                       "offchip_param_bytes": last.offchip_param_bytes,
                       "cpu_ms_measured": {str(t.threads): t.median_ms for t in full.cpu}}

    print("[bench] predictor ...", flush=True)
    lomo = {}
    for held in TRAIN:  # leave one training architecture out: how the predictor fares on an unseen one
        m = Predictor.train(examples([profiles[a] for a in TRAIN if a != held]))
        rows = examples([profiles[held]])
        lomo[held] = mape(m.predict_many([(e.features, e.threads, e.cores, e.probe_ms) for e in rows]),
                          [e.ms for e in rows])
    model = Predictor.train(examples([profiles[a] for a in TRAIN]))
    test = examples([profiles[a] for a in HELD_OUT])
    pred = model.predict_many([(e.features, e.threads, e.cores, e.probe_ms) for e in test])
    suffix = [(p, e.ms) for p, e in zip(pred, test) if e.role == "suffix"]
    per_model = {a: mape([p for p, e in zip(pred, test) if e.model.startswith(a)],
                         [e.ms for e in test if e.model.startswith(a)]) for a in HELD_OUT}
    by_threads = {str(n): mape([p for p, e in zip(pred, test) if e.threads == n],
                               [e.ms for e in test if e.threads == n]) for n in sorted({e.threads for e in test})}
    regret = plan_regret({a: profiles[a] for a in HELD_OUT},
                         {(e.model, e.point): p for p, e in zip(pred, test) if e.role == "suffix" and e.threads == 1})

    result = {
        "quick": args.quick,
        "machine": machine(),
        **emulator,
        "emulator_whole_model_ms": whole,
        "cpu_repeatability_max_rel_diff": max(rel) if rel else None,
        "predictor_mape_heldout": mape(pred, [e.ms for e in test]),
        "predictor_mape_heldout_by_threads": by_threads,
        "predictor_loao_median": float(np.median(list(lomo.values()))),
        "predicted_plan_regret": {"value": max(r["regret"] for r in regret), "cases": regret},
        "profile_resnet50v2_seconds": seconds["ResNet50V2"],
        "source": {
            "emulator_loao_median": "EMULATED Edge TPU model vs published Coral measurements",
            "emulator_loao_max": "EMULATED Edge TPU model vs published Coral measurements",
            "emulator_whole_model_ms": "tpu_ms: EMULATED Edge TPU; cpu_ms: real execution (this machine's CPU)",
            "cpu_repeatability_max_rel_diff": "real execution",
            "predictor_mape_heldout": "predictions vs real execution",
            "predictor_loao_median": "predictions vs real execution",
            "predicted_plan_regret": "plans evaluated by the refined queueing model on the measured profiles "
                                     "(CPU measured, Edge TPU EMULATED)",
            "profile_resnet50v2_seconds": "real execution (wall time; TPU side EMULATED)",
        },
        "cpu_repeatability": {"median_abs_rel_diff": float(np.median(rel)) if rel else None,
                              "raw_max_abs_rel_diff": max(raw) if raw else None,
                              "raw_median_abs_rel_diff": float(np.median(raw)) if raw else None,
                              "probe_ms_per_pass": probes, "segments": rep},
        "predictor": {"train": TRAIN, "held_out": HELD_OUT, "timings_train": len(examples([profiles[a] for a in TRAIN])),
                      "timings_held_out": len(test), "mape_suffixes_only": mape(*zip(*suffix)) if suffix else None,
                      "mape_per_model": per_model,
                      "mape_per_threads": by_threads,
                      "leave_one_training_model_out_mape": lomo,
                      "points": [{"model": e.model, "point": e.point, "role": e.role, "threads": e.threads,
                                  "measured_ms": e.ms, "predicted_ms": p} for p, e in zip(pred, test)]},
        "profile_seconds": seconds,
        "span_s": span,
    }
    publish("profiling", result, plot, ("emulator_loao_median", "emulator_loao_max", "cpu_repeatability_max_rel_diff",
                                        "predictor_mape_heldout", "predictor_loao_median", "predicted_plan_regret",
                                        "profile_resnet50v2_seconds"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 5.2))
    pts = result["predictor"]["points"]
    for model, marker in zip(sorted({p["model"] for p in pts}), "os^"):
        for threads, colour in ((1, "tab:blue"), (2, "tab:orange")):
            sel = [p for p in pts if p["model"] == model and p["threads"] == threads]
            a1.scatter([p["measured_ms"] for p in sel], [p["predicted_ms"] for p in sel], marker=marker, c=colour,
                       label=f"{model} k={threads}", alpha=0.8)
    lo = min(min(p["measured_ms"], p["predicted_ms"]) for p in pts)
    hi = max(max(p["measured_ms"], p["predicted_ms"]) for p in pts)
    a1.plot([lo, hi], [lo, hi], "k--", lw=1)
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("measured ms (this CPU)")
    a1.set_ylabel("predicted ms")
    a1.set_title(f"held-out segments: MAPE {result['predictor_mape_heldout']:.1%}")
    a1.legend(fontsize=7)

    loo = result["emulator_loao_errors"]
    colours = {"desktop": "tab:green", "rpi4b": "tab:gray", "devboard": "tab:purple"}
    a2.bar(range(len(loo)), [100 * r["error"] for r in loo], color=[colours.get(r["host"], "k") for r in loo])
    a2.set_xticks(range(len(loo)), [f"{r['model']}@{r['input']}\n{r['host']}" for r in loo], rotation=70, fontsize=6)
    for y in (-25, -10, 10, 25):
        a2.axhline(y, color="k", lw=0.5, ls=":" if abs(y) == 10 else "--")
    a2.set_ylabel("leave-one-architecture-out error %")
    a2.set_title(f"EMULATED Edge TPU vs published Coral figures: median |e| {result['emulator_loao_median']:.1%}, "
                 f"max {result['emulator_loao_max']:.1%}", fontsize=9)

    whole = result["emulator_whole_model_ms"]
    names = list(whole)
    x = np.arange(len(names))
    a3.bar(x - 0.27, [whole[n]["tpu_ms_emulated"] for n in names], 0.27, label="Edge TPU (EMULATED)")
    a3.bar(x, [whole[n]["cpu_ms_measured"]["1"] for n in names], 0.27, label="CPU 1 thread (measured)")
    a3.bar(x + 0.27, [whole[n]["cpu_ms_measured"].get("2", 0) for n in names], 0.27, label="CPU 2 threads (measured)")
    a3.set_xticks(x, names, rotation=60, fontsize=7, ha="right")
    a3.set_ylabel("ms per inference (whole model)")
    a3.set_title("whole model")
    a3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
