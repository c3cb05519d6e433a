"""Pipeline caching (issue: orchestration). Writes bench/results/pipeline.json and pipeline.png.

`edgeplan run` three times in one fresh work directory (its own Prefect home, so the ephemeral server
starts each time; the repository's params.yaml): cold, warm (the same model version again), then with
one planner parameter changed (plan.rate_factors).

Keys:
- warm_over_cold: the warm run's flow time over the cold run's, both from the flow's start (the flow body:
  task runs, cache lookups, artifacts) to its end;
- conversions_redone_warm: build tasks (the int8 conversion) that ran in the warm run;
- server_startup_seconds: median over the runs of the time from the command's start to the flow's start
  (Python imports + Prefect's ephemeral server start-up), reported apart;
- stages_rerun_after_plan_param_change: the tasks that ran (were not cache hits) after the change.
Edge TPU figures inside (the plan's predicted latency) come from the EMULATED Edge TPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, publish, pyplot

REPO = Path(__file__).resolve().parents[1]


def run(workdir: Path, model: str, name: str, label: str) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(workdir / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    out = workdir / f"{label}.json"
    proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "run", model, "--name", name, "--version", "1",
                           "--summary-json", str(out)], cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    print(f"[bench] {label}: flow {json.loads(out.read_text())['flow_seconds']:.1f} s", flush=True)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a tiny CNN instead of MobileNetV2 0.35/96")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    model, name = ("zoo:tiny_cnn", "tinycnn") if args.quick else ("zoo:mobilenetv2_0.35_96", "mobilenetv2")
    workdir = Path(tempfile.mkdtemp(prefix="edgeplan-bench-pipeline-"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    try:
        cold = run(workdir, model, name, "cold")
        warm = run(workdir, model, name, "warm")
        params["plan"]["rate_factors"] = [0.5, 1.0, 2.0, 4.0]
        (workdir / "params.yaml").write_text(yaml.safe_dump(params))
        changed = run(workdir, model, name, "plan_changed")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "quick": args.quick,
        "machine": machine(),
        "model": model,
        "warm_over_cold": warm["flow_seconds"] / cold["flow_seconds"],
        "conversions_redone_warm": sum(1 for t in warm["tasks"] if t["task"] == "build" and not t["cached"]),
        "server_startup_seconds": statistics.median(r["before_flow_seconds"] for r in (cold, warm, changed)),
        "stages_rerun_after_plan_param_change": [t["task"] for t in changed["tasks"] if not t["cached"]],
        "cache_hits": {"cold": cold["cache_hits"], "warm": warm["cache_hits"], "plan_changed": changed["cache_hits"]},
        "flow_seconds": {"cold": cold["flow_seconds"], "warm": warm["flow_seconds"],
                         "plan_changed": changed["flow_seconds"]},
        "tasks": {"cold": cold["tasks"], "warm": warm["tasks"], "plan_changed": changed["tasks"]},
        "revisions": {"cold": cold["published"], "warm": warm["published"], "plan_changed": changed["published"]},
        "source": "wall-clock on this machine; the plans inside use the EMULATED Edge TPU",
    }
    publish("pipeline", result, plot, ("warm_over_cold", "conversions_redone_warm", "server_startup_seconds",
                                       "stages_rerun_after_plan_param_change"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    runs = ("cold", "warm", "plan_changed")
    names = [t["task"] for t in result["tasks"]["cold"]]
    width = 0.27
    for j, run_name in enumerate(runs):
        rows = {t["task"]: t for t in result["tasks"][run_name]}
        xs = [i + (j - 1) * width for i in range(len(names))]
        bars = ax.bar(xs, [rows[n]["seconds"] for n in names], width, label=f"{run_name} "
                      f"(flow {result['flow_seconds'][run_name]:.1f} s)")
        for x, n, b in zip(xs, names, bars):
            if rows[n]["cached"]:
                ax.text(x, b.get_height(), "c", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("task wall time, s (log; c = cache hit)")
    ax.set_title(f"edgeplan run {result['model']}: warm/cold {result['warm_over_cold']:.1%}, "
                 f"start-up {result['server_startup_seconds']:.1f} s apart")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
