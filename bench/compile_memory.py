"""Memory and time of `edgeplan compile` on large models (issue: large models). Writes
bench/results/compile_memory.json and compile_memory.png.

Each model (Keras applications with seeded weights, built once into the work directory as .keras files) is compiled
by a real `edgeplan compile MODEL.keras` process into a fresh artifact root, one model at a time, nothing else run
beside it by the bench. Its `memory.json` (sampled every 20 ms: `pipeline/memory.py`) gives, per stage, the peak RSS
of the compile process itself and of the processes it started (ingest, onnx2tf and calibration children). A
process's figure is its peak above its own baseline: the same kind of process with its libraries imported and
nothing done, measured here in fresh processes (`baseline_parent_bytes`: what `edgeplan compile` imports;
`baseline_child_bytes`: what the ingest child imports, and TensorFlow alone for the conversion's children — the
smallest of them, so their figures are on the high side).
A stage's figure is the larger of its processes'; it is divided by the model's float parameter bytes.

Keys:
- completed: how many of the models compiled with verify passing (exit 0).
- peak_rss_over_model_bytes_max: {value, model, stage}: the largest stage figure over parameter bytes among the
  models of at least 200 MB of parameters (target <= 6; VGG16 <= 3.3 GB above baseline).
- by_stage: per model, each stage's figure over parameter bytes (and in GB), and the stage that sets the peak.
- time_slope / memory_slope: slopes of the least-squares lines, in log-log, of wall time against MACs + parameter
  bytes, and of the peak above baseline against parameter bytes, over the compiled models (target: time <= 1.1).
- external_data_peak_ratio: {value, stage, verify_ok}: `zoo:wide_fc_2g` (2.28 GB of weights, an .onnx with external
  data), compiled the same way: its largest stage figure over its parameter bytes (target <= 3; verify passing).

`--models a,b` runs a subset (zoo names; `wide_fc_2g` among them gives the external-data figure); the headline
keys then cover those only (`--results NAME` writes them beside the full run's). The full run is the six models,
then wide_fc_2g.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, publish, pyplot  # noqa: E402

MODELS = ("vgg16_224", "vgg19_224", "resnet152v2_299", "inceptionresnetv2_299", "densenet201_224", "mobilenetv2_224")
EXTERNAL = "wide_fc_2g"  # 2.28 GB of weights: past protobuf's limit, ONNX with external data
LARGE = 200e6  # the target applies to models of at least this many parameter bytes
WORK = Path(".edgeplan/bench/compile_memory")
PARENT_IMPORTS = ("import edgeplan.cli, edgeplan.pipeline.stages, edgeplan.quantize.tflite_graph, "
                  "edgeplan.quantize.match, edgeplan.verify.checks, tensorflow, onnx, onnxruntime, onnx_graphsurgeon; "
                  "from ai_edge_litert import interpreter")
CHILD_IMPORTS = {"ingest": "import tensorflow, keras, tf2onnx, onnx, onnx_graphsurgeon, edgeplan.graph.ingest, "
                            "edgeplan.zoo",
                  "conversion": "import tensorflow"}  # the smallest conversion child (onnx2tf's imports more)
STAGES = ("ingest", "analyze", "int8 conversion", "matching", "cutting", "compile", "verify")


def baseline(imports: str, runs: int = 3) -> int:
    """Median RSS of a fresh Python process after ``imports``."""
    code = f"{imports}\nfrom edgeplan.pipeline.memory import rss\nprint(rss())"
    values = sorted(int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       env=dict(os.environ)).stdout.split()[-1]) for _ in range(runs))
    return values[len(values) // 2]


def compile_one(name: str, work: Path) -> dict:
    from edgeplan.zoo import build

    src = build(name, work / "zoo")
    root = work / "artifacts"
    if (root / name).exists():
        shutil.rmtree(root / name)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "compile", str(src), "--name", name, "--version",
                           "1", "--out", str(root)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    d = root / name / "1"
    out = {"name": name, "exit": proc.returncode, "seconds": round(seconds, 1)}
    if proc.returncode != 0:
        out["error"] = (proc.stderr.strip().splitlines() or [""])[-1][:500]
    try:
        info = json.loads((d / "model.json").read_text())
        out.update(parameter_bytes=info["parameter_bytes"], macs=info["macs"])
        out["stages"] = json.loads((d / "memory.json").read_text())["stages"]
        out["verify_ok"] = json.loads((d / "verify.json").read_text()).get("ok")
        out["pieces"] = json.loads((d / "model_int8.json").read_text()).get("pieces", [])
    except (OSError, ValueError, KeyError) as e:
        out.setdefault("error", f"{type(e).__name__}: {e}")
    return out


def figures(run: dict, parent: int, children: dict[str, int]) -> dict:
    """Per stage: its processes' peaks above their own baselines (bytes) and over the parameter bytes."""
    out = {}
    for stage, rec in run.get("stages", {}).items():
        own = max(0, rec["peak_self_rss_bytes"] - parent)
        child = children["ingest" if stage == "ingest" else "conversion"]
        kids = max(0, rec["peak_children_rss_bytes"] - child) if rec["peak_children_rss_bytes"] else 0
        value = max(own, kids)
        out[stage] = {"above_baseline_gb": round(value / 1e9, 3), "over_model_bytes": round(value /
                      run["parameter_bytes"], 3), "process": "child" if kids > own else "compile",
                      "tree_peak_gb": round(rec["peak_rss_bytes"] / 1e9, 3), "seconds": rec["seconds"]}
    return out


def slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return round(sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / den, 3) if den else None


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    every = [r for r in result["runs"] if r.get("by_stage")]  # the six and, when run, wide_fc_2g
    runs = [r for r in every if r["name"] != EXTERNAL]  # the slopes are over the six
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    ax = axes[0]
    width = 0.8 / max(1, len(every))
    for k, r in enumerate(every):
        vals = [r["by_stage"].get(s, {}).get("over_model_bytes", 0) for s in STAGES]
        ax.bar([i + k * width for i in range(len(STAGES))], vals, width, label=r["name"])
    ax.axhline(6, color="red", ls="--", lw=1, label="target 6 (models >= 200 MB)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(STAGES))], STAGES, rotation=30, ha="right")
    ax.set_ylabel("peak above own baseline / parameter bytes")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("per stage, the larger of the compile process and its children")
    for ax, xkey, ykey, title in ((axes[1], "x_time", "seconds", f"wall time, slope {result['time_slope']}"),
                                  (axes[2], "parameter_bytes", "peak_gb", f"peak above baseline, slope "
                                                                            f"{result['memory_slope']}")):
        xs = [r[xkey] for r in runs]
        ys = [r[ykey] for r in runs]
        ax.loglog(xs, ys, "o")
        for r, x, y in zip(runs, xs, ys):
            ax.annotate(r["name"], (x, y), fontsize=7)
        s = result["time_slope"] if ykey == "seconds" else result["memory_slope"]
        if s is not None and len(xs) > 1:
            lx = [math.log(x) for x in xs]
            ly = [math.log(y) for y in ys]
            b = sum(ly) / len(ly) - s * sum(lx) / len(lx)
            grid = [min(xs), max(xs)]
            ax.loglog(grid, [math.exp(b) * g ** s for g in grid], "-", lw=1)
        ax.set_xlabel("MACs + parameter bytes" if xkey == "x_time" else "parameter bytes")
        ax.set_ylabel("seconds" if ykey == "seconds" else "GB")
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join((*MODELS, EXTERNAL)),
                    help="zoo names, comma-separated (default: the six, then wide_fc_2g)")
    ap.add_argument("--work", default=str(WORK), help="work directory (zoo models are built once here)")
    ap.add_argument("--results", default="compile_memory", help="name of the results (bench/results/NAME.json and "
                    ".png); a subset run beside a full one should take another name")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    parent = baseline(PARENT_IMPORTS)
    child = {kind: baseline(imports) for kind, imports in CHILD_IMPORTS.items()}
    print(f"[bench] baselines: compile process {parent / 1e9:.2f} GB, ingest child {child['ingest'] / 1e9:.2f} GB, "
          f"conversion child {child['conversion'] / 1e9:.2f} GB", flush=True)
    runs = []
    for name in args.models.split(","):
        print(f"[bench] compiling {name} ...", flush=True)
        r = compile_one(name, work)
        if r.get("stages"):
            r["by_stage"] = figures(r, parent, child)
            top = max(r["by_stage"], key=lambda s: r["by_stage"][s]["over_model_bytes"])
            r["peak_stage"] = top
            r["peak_gb"] = r["by_stage"][top]["above_baseline_gb"]
            r["peak_over_model_bytes"] = r["by_stage"][top]["over_model_bytes"]
            r["x_time"] = r["macs"] + r["parameter_bytes"]
        runs.append(r)
        print(f"[bench] {name}: exit {r['exit']}, {r['seconds']} s, peak {r.get('peak_gb')} GB above baseline "
              f"({r.get('peak_over_model_bytes')}x parameters, {r.get('peak_stage')})", flush=True)
    ext = next((r for r in runs if r["name"] == EXTERNAL and r.get("by_stage")), None)
    runs_ext, runs = runs, [r for r in runs if r["name"] != EXTERNAL]
    done = [r for r in runs if r["exit"] == 0 and r.get("verify_ok") and r.get("by_stage")]
    large = [r for r in done if r["parameter_bytes"] >= LARGE]
    worst = max(large, key=lambda r: r["peak_over_model_bytes"], default=None)
    result = {
        "machine": machine(),
        "baseline_parent_bytes": parent,
        "baseline_child_bytes": child,
        "completed": len(done),
        "models": len(runs),
        "peak_rss_over_model_bytes_max": ({"value": worst["peak_over_model_bytes"], "model": worst["name"],
                                           "stage": worst["peak_stage"], "gb": worst["peak_gb"]} if worst else None),
        "by_stage": {r["name"]: {"stages": r["by_stage"], "peak_stage": r["peak_stage"]} for r in done},
        "time_slope": slope([r["x_time"] for r in done], [r["seconds"] for r in done]),
        "memory_slope": slope([r["parameter_bytes"] for r in done], [r["peak_gb"] for r in done]),
        "external_data_peak_ratio": ({"value": ext["peak_over_model_bytes"], "stage": ext["peak_stage"],
                                      "gb": ext["peak_gb"], "parameter_bytes": ext["parameter_bytes"],
                                      "verify_ok": bool(ext.get("verify_ok")), "exit": ext["exit"],
                                      "seconds": ext["seconds"]} if ext else None),
        "runs": runs_ext,
    }
    publish(args.results, result, plot, ("completed", "peak_rss_over_model_bytes_max", "time_slope",
                                             "memory_slope"))
    return 0 if len(done) == len(runs) and (ext is None or ext["exit"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
