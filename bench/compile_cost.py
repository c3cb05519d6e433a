"""Compile-stage benchmark (issue: foundation). Writes bench/results/compile_cost.json and compile_cost.png.

Keys:
- conversion_cost_ratio: wall time to produce the int8 segments (prefix_int8 + suffix_int8) of every
  point of ResNet50V2 with max_points 8 — one whole-model conversion, matching, cutting — divided by
  the wall time of one whole-model int8 conversion measured separately in the same run. Goal <= 1.5.
- int8_identical_fraction_min: over the five Keras models and the re-weighted light_resnet50, at every
  point, the fraction of output elements of prefix_int8 -> suffix_int8 identical to the whole int8 model
  (from `edgeplan verify`). Goal 1.0.
- table2_size_error_max: |size - paper| / paper of the int8 .tflite (MB = 1e6 bytes) against SwapLess
  Table II for ResNet50V2 (25.3), DenseNet201 (19.7), MobileNetV2 (4.1); Xception (26.1) and MACs reported.

Every figure here comes from real execution on this machine's CPU; none involves the emulated Edge TPU
(the compile reports are written but not measured). `--quick` uses smaller inputs (sizes do not depend
on the input resolution) and small models for the identity check, with the same definitions.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from _common import machine, publish, pyplot  # noqa: E402
from edgeplan.pipeline import params as params_mod  # noqa: E402
from edgeplan.pipeline import stages  # noqa: E402
from edgeplan.zoo import keras_apps  # noqa: E402

PAPER_MB = {"ResNet50V2": 25.3, "DenseNet201": 19.7, "MobileNetV2": 4.1, "Xception": 26.1}
PAPER_GFLOPS = {"ResNet50V2": 4.49, "DenseNet201": 4.32, "MobileNetV2": 0.30, "Xception": 8.38}
FULL_SIZES = {"MobileNetV2": 224, "ResNet50V2": 224, "InceptionV3": 299, "DenseNet201": 224, "Xception": 299}
QUICK_SIZES = {"MobileNetV2": 96, "ResNet50V2": 96, "InceptionV3": 96, "DenseNet201": 96, "Xception": 96}


def conversion_times(root: Path, params: dict, repeats: int) -> dict:
    """Whole conversion alone vs everything that produces the int8 segments of all points, alternated
    ``repeats`` times in this run; the ratio is the median of the per-pair ratios."""
    from edgeplan.graph.cuts import choose_evenly
    from edgeplan.quantize import convert
    from edgeplan.quantize.calibration import CalibrationSpec, calibration_data, sample_inputs
    from edgeplan.quantize.cut import cut
    from edgeplan.quantize.match import match_candidates
    from edgeplan.quantize.tflite_graph import TfliteGraph

    model = onnx.load(str(root / "model.onnx"))
    view, cands = stages.candidates(model)
    spec = CalibrationSpec.from_params(params["quantize"]["calibration"])
    shape = view.shape(view.input.name)
    data = calibration_data(spec, shape)
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            convert.to_int8_tflite(root / "model.onnx", data, Path(tmp) / "alone")
            whole = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            blob = convert.to_int8_tflite(root / "model.onnx", data, Path(tmp) / "segments")
            t_conv = time.perf_counter() - t0
            g = TfliteGraph(blob)
            t1 = time.perf_counter()
            matches = match_candidates(model, cands, g, sample_inputs(spec, shape, 2, spec.seed + 1),
                                       min_cosine=params["quantize"]["match_min_cosine"])
            kept = [m for m in matches if m.tflite_index is not None]
            chosen = {c.tensor for c in choose_evenly([m.candidate for m in kept], 8, sum(view.node_param_bytes))}
            t2 = time.perf_counter()
            for m in kept:
                if m.candidate.tensor in chosen:
                    cut(g, m.tflite_index)
            t3 = time.perf_counter()
        runs.append({"whole_conversion_s": whole, "segments_total_s": t3 - t0, "segments_conversion_s": t_conv,
                     "matching_s": t2 - t1, "cutting_s": t3 - t2, "ratio": (t3 - t0) / whole})
        print(f"[bench] conversion cost run: {runs[-1]}", flush=True)
    ratios = [r["ratio"] for r in runs]
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    return {**med, "points": len(chosen) + 2, "conversion_cost_ratio": float(np.median(ratios)),
            "ratio_range": [min(ratios), max(ratios)], "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small inputs and models; same definitions")
    ap.add_argument("--repeats", type=int, default=None, help="alternated conversion-cost repetitions (default 3, quick 2)")
    args = ap.parse_args()
    params = params_mod.load(Path(__file__).resolve().parents[1] / "params.yaml")
    params["analysis"]["max_points"] = 8
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    work = Path(tempfile.mkdtemp(prefix="edgeplan-bench-"))
    models: dict[str, dict] = {}
    identity_models = list(sizes) + ([] if args.quick else ["light_resnet50"])
    if args.quick:
        identity_models = ["MobileNetV2", "tiny_cnn", "light_squeezenet"]
    for arch in sorted(set(list(sizes) + identity_models), key=lambda a: (a not in sizes, a)):
        t0 = time.perf_counter()
        if arch in sizes:
            src = keras_apps.build(arch, sizes[arch], work / "zoo" / f"{arch}_{sizes[arch]}",
                                   alpha=None)
        else:
            src = f"zoo:{arch}"
        print(f"[bench] compiling {arch} ...", flush=True)
        root = stages.ingest(src, arch, "1", work / "artifacts")
        result = stages.build(root, params)
        report = stages.verify(root, params) if arch in identity_models else None
        info = onnx.load(str(root / "model.onnx"))
        macs = sum(stages.GraphView(info).node_macs)
        models[arch] = {
            "input": sizes.get(arch),
            "int8_tflite_bytes": (root / "model_int8.tflite").stat().st_size,
            "int8_tflite_MB": (root / "model_int8.tflite").stat().st_size / 1e6,
            "macs": macs,
            "gmacs": macs / 1e9,
            "points": len(result.analysis.points),
            "onnx_candidates": result.analysis.onnx_candidates,
            "dropped": len([d for d in result.analysis.dropped if not d.reason.startswith("not chosen")]),
            "build_errors": len(result.errors),
            "int8_identical_fraction_min": min(c.int8_identical_fraction for c in report.points) if report else None,
            "int8_float_cosine_min": min(c.int8_float_cosine for c in report.points) if report else None,
            "verify_ok": report.ok if report else None,
            "compile_s": time.perf_counter() - t0,
            "source": "real execution (CPU)",
        }
        print(f"[bench] {arch}: {models[arch]}", flush=True)
    ratio_model = "ResNet50V2"
    print("[bench] conversion cost ...", flush=True)
    cost = conversion_times(work / "artifacts" / ratio_model / "1", params, args.repeats or (2 if args.quick else 3))
    size_errors = {a: abs(models[a]["int8_tflite_MB"] - PAPER_MB[a]) / PAPER_MB[a]
                   for a in ("ResNet50V2", "DenseNet201", "MobileNetV2")}
    ident = [models[a]["int8_identical_fraction_min"] for a in identity_models]
    result = {
        "quick": args.quick,
        "machine": machine(),
        "conversion_cost_ratio": cost["conversion_cost_ratio"],
        "int8_identical_fraction_min": min(ident),
        "table2_size_error_max": max(size_errors.values()),
        "source": {"conversion_cost_ratio": "real execution", "int8_identical_fraction_min": "real execution",
                   "table2_size_error_max": "real execution (file sizes)"},
        "conversion_cost": {"model": ratio_model, "max_points": 8, **cost},
        "int8_identical_models": identity_models,
        "table2": {a: {"paper_MB": PAPER_MB.get(a), "int8_tflite_MB": models[a]["int8_tflite_MB"],
                       "size_error": size_errors.get(a), "paper_GFLOPs": PAPER_GFLOPS.get(a),
                       "gmacs": models[a]["gmacs"]} for a in sizes},
        "models": models,
    }
    publish("compile_cost", result, plot, ("conversion_cost_ratio", "int8_identical_fraction_min", "table2_size_error_max"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    t2 = {k: v for k, v in result["table2"].items() if v["paper_MB"]}
    names = list(t2)
    x = np.arange(len(names))
    a1.bar(x - 0.2, [t2[n]["paper_MB"] for n in names], 0.4, label="SwapLess Table II")
    a1.bar(x + 0.2, [t2[n]["int8_tflite_MB"] for n in names], 0.4, label="edgeplan int8 .tflite")
    a1.set_xticks(x, names)
    a1.set_ylabel("MB (1e6 bytes)")
    a1.set_title("int8 model size")
    a1.legend()
    c = result["conversion_cost"]
    parts = [("conversion", c["segments_conversion_s"]), ("matching", c["matching_s"]), ("cutting", c["cutting_s"])]
    left = 0.0
    for label, v in parts:
        a2.barh(["all segments"], [v], left=left, label=label)
        left += v
    a2.barh(["one whole conversion"], [c["whole_conversion_s"]], color="grey")
    a2.set_xlabel("seconds (real execution, this machine)")
    a2.set_title(f"{c['model']}: ratio {result['conversion_cost_ratio']:.2f} ({c['points']} points)")
    a2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
