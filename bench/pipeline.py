"""Pipeline benchmarks (issue: orchestration). Writes bench/results/pipeline.json and pipeline.png.

Part `caching`: `edgeplan run` three times in one fresh work directory (its own Prefect home, so the
ephemeral server starts each time; the repository's params.yaml): cold, warm (the same model version
again), then with one planner parameter changed (plan.rate_factors).
- warm_over_cold: the warm run's flow time over the cold run's, both from the flow's start (the flow body:
  task runs, cache lookups, artifacts) to its end;
- conversions_redone_warm: build tasks (the int8 conversion) that ran in the warm run;
- server_startup_seconds: median over the runs of the time from the command's start to the flow's start
  (Python imports + Prefect's ephemeral server start-up), reported apart;
- stages_rerun_after_plan_param_change: the tasks that ran (were not cache hits) after the change.

Part `blobs` (in the same work directory, after `caching`):
- blobs_uploaded_unchanged: blobs uploaded by publishing the unchanged deployment again;
- blobs_uploaded_classifier_changed: blobs uploaded when version 2 of the model, equal to version 1 but for
  its final classifier weights, is run and published;
- blobs_expected_classifier_changed: the blobs of that revision that contain the classifier layer (every
  point's CPU suffix, the all-TPU point's prefix files) or derive from the whole model's output (the
  self-tests' expected outputs, the re-measured profile, the plan); blobs_unexpected_classifier_changed lists
  any uploaded blob outside that set (empty when conversion is byte-deterministic).

Part `dask`: `edgeplan run` of 4 models (the compile-models flow) on a Dask LocalCluster of 2 workers
against 1 worker (one thread each; TensorFlow held to one thread per worker by TF_NUM_INTRAOP_THREADS /
TF_NUM_INTEROP_THREADS / OMP_NUM_THREADS; 2 conversion slots), every run cold in a fresh work directory,
one real `prefect server start` for all; runs alternate 1, 2, 2, 1 (the machine's speed drifts).
- dask_speedup_2_vs_1: median 1-worker over median 2-worker wall time of the compile fan-out (the ingest ->
  build -> verify chains of the 4 models); dask_speedup_2_vs_1_flow: the same over the whole flow
  (profiles run one at a time per machine, so they do not speed up).

Part `main`: the README's main command, as a new user runs it: `edgeplan run zoo:mobilenetv2_0.35_96 --name
mobilenetv2 --version 1` in a fresh clone of the repository (the default configuration: the local Prefect
server, a 3-s device check), timed from outside the process (wall clock, interpreter start to exit).
- main_command_cold_seconds: the first run (starts the local Prefect server, converts, profiles, publishes);
- main_command_warm_seconds: the median of 5 reruns wholly from the cache (value; runs and the split into
  start-up / flow / device check beside); main_command_warm_seconds_ephemeral: the same command with Prefect's
  ephemeral server (orchestration.prefect_server: ephemeral), its runs interleaved with the local server's.

`--part` runs one part and keeps the other parts' keys of an existing pipeline.json.
Edge TPU figures inside (the plans' predicted latency) come from the EMULATED Edge TPU.
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


RESULTS = REPO / "bench" / "results" / "pipeline.json"
DASK_MODELS = [("mobilenetv2_0.35_96", "mnv2small"), ("mobilenetv2_224", "mnv2"), ("mobilenetv1_224", "mnv1"),
               ("efficientnetb0_224", "effb0")]
FAST_PROFILE = {"repeats": 10, "min_repeats": 5, "span_s": 0.5, "budget_s": 1.0}


def run(workdir: Path, label: str, *args: str, env: dict | None = None) -> dict:
    """``edgeplan run ARGS`` in ``workdir``: the ephemeral server unless ``env`` names one; its summary."""
    if env is None:
        env = {**os.environ, "PREFECT_HOME": str(workdir / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "EDGEPLAN_PREFECT_SERVER": "ephemeral"}
        env.pop("PREFECT_API_URL", None)
    out = workdir / f"{label}.json"
    proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "run", *args, "--summary-json", str(out)],
                          cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    summary = json.loads(out.read_text())
    print(f"[bench] {label}: flow {summary['flow_seconds']:.1f} s", flush=True)
    return summary


def part_caching(workdir: Path, model: str, name: str, params: dict) -> dict:
    cold = run(workdir, "cold", model, "--name", name, "--version", "1")
    warm = run(workdir, "warm", model, "--name", name, "--version", "1")
    params["plan"]["rate_factors"] = [0.5, 1.0, 2.0, 4.0]
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    changed = run(workdir, "plan_changed", model, "--name", name, "--version", "1")
    runs = {"cold": cold, "warm": warm, "plan_changed": changed}
    return {
        "model": model,
        "warm_over_cold": warm["flow_seconds"] / cold["flow_seconds"],
        "conversions_redone_warm": sum(1 for t in warm["tasks"] if t["task"] == "build" and not t["cached"]),
        "server_startup_seconds": statistics.median(r["before_flow_seconds"] for r in runs.values()),
        "stages_rerun_after_plan_param_change": [t["task"] for t in changed["tasks"] if not t["cached"]],
        "cache_hits": {k: r["cache_hits"] for k, r in runs.items()},
        "flow_seconds": {k: r["flow_seconds"] for k, r in runs.items()},
        "tasks": {k: r["tasks"] for k, r in runs.items()},
        "revisions": {k: r["published"] for k, r in runs.items()},
    }


def classifier_changed(src: Path, dst: Path) -> str:
    """``src`` with the weights of its last weighted node (the classifier) scaled and perturbed; its name."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    inits = {i.name: i for i in m.graph.initializer}
    node = next(n for n in reversed(m.graph.node) if any(x in inits and len(inits[x].dims) >= 2 for x in n.input))
    w = next(inits[x] for x in node.input if x in inits and len(inits[x].dims) >= 2)
    a = numpy_helper.to_array(w)
    a = (a * 1.5 + np.random.default_rng(5).normal(0, float(a.std()) or 0.1, a.shape)).astype(a.dtype)
    w.CopyFrom(numpy_helper.from_array(a, w.name))
    onnx.save(m, str(dst))
    return f"{node.op_type} {node.name}"


def part_blobs(workdir: Path, name: str) -> dict:
    """Republish unchanged, then a version 2 that differs in its classifier weights."""
    from edgeplan.bundle.manifest import Manifest, latest_key, manifest_key
    from edgeplan.cli_store import publish_deployment
    from edgeplan.store import open_store
    from edgeplan.pipeline.planning import deployments_serving
    from flows.common import load_params

    cwd = os.getcwd()
    os.chdir(workdir)  # params.yaml's relative paths (store, keys) are the work directory's
    try:
        params, (dep,) = deployments_serving(load_params(None), name, "1", str(workdir / "artifacts"))
        again, store = publish_deployment(workdir / "artifacts", dep, params, None, None)
    finally:
        os.chdir(cwd)
    node = classifier_changed(workdir / "artifacts" / name / "1" / "model.onnx", workdir / "v2.onnx")
    v2 = run(workdir, "classifier_changed", "v2.onnx", "--name", name, "--version", "2")
    (pub,) = v2["published"]
    latest = json.loads(store.get(latest_key(dep)))
    new = Manifest.from_json(json.loads(store.get(manifest_key(dep, latest["revision"]))))
    old = Manifest.from_json(json.loads(store.get(manifest_key(dep, latest["revision"] - 1))))
    (entry,) = new.models
    prefix = f"models/{entry.name}/{entry.version}"
    contains = {f"{prefix}/segments/p{p}/suffix_int8.tflite" for p in range(entry.points)}
    contains |= {f"{prefix}/segments/p{entry.points}/{f}" for f in ("prefix_edgetpu.tflite", "prefix_int8.tflite",
                                                                    "compile.json")}
    derived = {t.expected for t in entry.selftests} | {entry.profile, new.plan}
    expected = {b.sha256 for b in new.blobs if b.name in contains | derived}
    held = {b.sha256 for b in old.blobs}
    uploaded = {b.sha256: b.name for b in new.blobs if b.sha256 not in held}
    return {
        "blobs_uploaded_unchanged": again.uploaded_blobs,
        "republish_unchanged_new_revision": again.new_revision,
        "blobs_uploaded_classifier_changed": pub["uploaded_blobs"],
        "blobs_expected_classifier_changed": len(expected),
        "blobs_unexpected_classifier_changed": sorted(n for h, n in uploaded.items() if h not in expected),
        "blobs_in_revision": len({b.sha256 for b in new.blobs}),
        "classifier_node": node,
        "classifier_changed_uploaded_bytes": pub["uploaded_bytes"],
        "classifier_changed_revision_bytes": sum(b.size for b in new.blobs),
    }


MAIN_COMMAND = ("run", "zoo:mobilenetv2_0.35_96", "--name", "mobilenetv2", "--version", "1")


def part_main(warm_runs: int = 5) -> dict:
    """The README's main command in a fresh clone: cold, then warm reruns on the local server interleaved
    with reruns on the ephemeral one (L E E L L E ...)."""
    import time

    base = Path(tempfile.mkdtemp(prefix="edgeplan-bench-main-"))
    clone = base / "edgeplan"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    exe = Path(sys.executable).with_name("edgeplan")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "EDGEPLAN_PREFECT_SERVER")}
    records: dict[str, list[dict]] = {"local": [], "ephemeral": []}

    def once(server: str, label: str) -> dict:
        out = base / f"{label}.json"
        t0 = time.perf_counter()
        proc = subprocess.run([str(exe), *MAIN_COMMAND, "--summary-json", str(out)], cwd=clone, capture_output=True,
                              text=True, env={**env, "EDGEPLAN_PREFECT_SERVER": server})
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"main command ({label}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        s = json.loads(out.read_text())
        dc = s["command_seconds"] - s["before_flow_seconds"] - s["flow_seconds"]
        print(f"[bench] main command {label}: {wall:.1f} s (start-up {s['before_flow_seconds']:.1f}, flow "
              f"{s['flow_seconds']:.1f}, after the flow {dc:.1f})", flush=True)
        return {"wall_seconds": wall, "before_flow_seconds": s["before_flow_seconds"], "flow_seconds": s["flow_seconds"],
                "after_flow_seconds": dc, "cache_hits": s["cache_hits"], "tasks": len(s["tasks"])}

    try:
        cold = once("local", "cold")
        order = ["local", "ephemeral", "ephemeral", "local"] * ((warm_runs + 1) // 2)
        for k, server in enumerate(order[: 2 * warm_runs]):
            r = once(server, f"warm-{server}-{k}")
            if r["cache_hits"] != r["tasks"]:
                raise SystemExit(f"warm run {k} was not wholly from the cache: {r}")
            records[server].append(r)
    finally:
        subprocess.run([str(exe), "server", "stop"], cwd=clone, env=env, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)

    def summary(rows):
        walls = [r["wall_seconds"] for r in rows]
        return {"value": statistics.median(walls), "min": min(walls), "max": max(walls), "runs": rows}

    return {"main_command": " ".join(("edgeplan", *MAIN_COMMAND)), "main_command_cold_seconds": cold["wall_seconds"],
            "main_command_cold": cold, "main_command_warm_seconds": summary(records["local"]),
            "main_command_warm_seconds_ephemeral": summary(records["ephemeral"])}


def part_dask(order: tuple[int, ...] = (1, 2, 2, 1)) -> dict:
    from distributed import LocalCluster

    from edgeplan.pipeline.prefect_server import prefect_server

    base = Path(tempfile.mkdtemp(prefix="edgeplan-bench-dask-"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["models"] = [{"name": n, "version": "1", "source": f"zoo:{z}"} for z, n in DASK_MODELS]
    params["orchestration"]["conversion_slots"] = 2
    params["profile"].update(FAST_PROFILE)
    threads = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1"}
    runs: dict[int, list[dict]] = {1: [], 2: []}
    saved = dict(os.environ)
    try:
        with prefect_server(base / "prefect") as (_, env):
            env = {**env, **threads, "PREFECT_LOCAL_STORAGE_PATH": str(base / "results"),
                   "EDGEPLAN_SLOTS_DIR": str(base / "slots")}
            os.environ.update(env)  # the Dask workers inherit them
            for k, workers in enumerate(order):
                workdir = base / f"run{k}-{workers}w"
                workdir.mkdir()
                (workdir / "params.yaml").write_text(yaml.safe_dump(params))
                with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
                    s = run(workdir, f"dask-{workers}w-{k}", "--dask", cluster.scheduler_address, env=env)
                fan_out = s["stage_seconds"]["ingest+build+verify"]
                print(f"[bench] {workers} worker(s): fan-out {fan_out:.1f} s", flush=True)
                runs[workers].append({"fan_out_seconds": fan_out, "flow_seconds": s["flow_seconds"],
                                      "stage_seconds": s["stage_seconds"]})
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(base, ignore_errors=True)

    def med(w, key):
        return statistics.median(r[key] for r in runs[w])

    return {
        "dask_speedup_2_vs_1": med(1, "fan_out_seconds") / med(2, "fan_out_seconds"),
        "dask_speedup_2_vs_1_flow": med(1, "flow_seconds") / med(2, "flow_seconds"),
        "dask_models": [f"zoo:{z}" for z, _ in DASK_MODELS],
        "dask_runs": {f"{w}_workers": runs[w] for w in (1, 2)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a tiny CNN instead of MobileNetV2 0.35/96 (caching, blobs)")
    ap.add_argument("--part", choices=("caching", "blobs", "dask", "main"), action="append",
                    help="run only these parts (blobs implies caching); default: all")
    ap.add_argument("--keep", action="store_true", help="keep the caching/blobs work directory")
    args = ap.parse_args()
    parts = set(args.part or ("caching", "blobs", "dask", "main"))
    if "blobs" in parts:
        parts.add("caching")
    model, name = ("zoo:tiny_cnn", "tinycnn") if args.quick else ("zoo:mobilenetv2_0.35_96", "mobilenetv2")
    result = json.loads(RESULTS.read_text()) if args.part and RESULTS.is_file() else {}
    result.update({"quick": args.quick, "machine": machine(),
                   "source": "wall-clock on this machine; the plans inside use the EMULATED Edge TPU"})
    if "caching" in parts:
        workdir = Path(tempfile.mkdtemp(prefix="edgeplan-bench-pipeline-"))
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        (workdir / "params.yaml").write_text(yaml.safe_dump(params))
        try:
            result.update(part_caching(workdir, model, name, params))
            if "blobs" in parts:
                result.update(part_blobs(workdir, name))
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    if "dask" in parts:
        result.update(part_dask())
    if "main" in parts:
        result.update(part_main())
    keys = ("main_command_cold_seconds", "main_command_warm_seconds", "warm_over_cold", "conversions_redone_warm", "server_startup_seconds",
            "stages_rerun_after_plan_param_change", "blobs_uploaded_unchanged", "blobs_uploaded_classifier_changed",
            "blobs_expected_classifier_changed", "dask_speedup_2_vs_1")
    publish("pipeline", result, plot, tuple(k for k in keys if k in result))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(19, 4.8), gridspec_kw={"width_ratios": [3, 2, 2]})
    if "main_command_warm_seconds" in result:
        cold = result["main_command_cold"]
        bars = {"cold (local server)": [cold]}
        bars.update({f"warm, {k}": result[f"main_command_warm_seconds{'' if k == 'local' else '_ephemeral'}"]["runs"]
                     for k in ("local", "ephemeral")})
        for i, (label, runs) in enumerate(bars.items()):
            parts = [statistics.median(r[k] for r in runs) for k in ("before_flow_seconds", "flow_seconds",
                                                                   "after_flow_seconds")]
            bottom = 0.0
            for j, (v, what) in enumerate(zip(parts, ("start-up", "flow", "device check"))):
                cx.bar(i, v, 0.6, bottom=bottom, color=f"C{j}", label=what if i == 0 else None)
                bottom += v
            cx.text(i, bottom, f"{statistics.median(r['wall_seconds'] for r in runs):.1f} s", ha="center",
                    va="bottom", fontsize=8)
        cx.axhline(8.0, color="k", ls=":", lw=1, label="warm target 8 s")
        cx.set_xticks(range(len(bars)), list(bars), fontsize=8)
        cx.set_ylabel("wall seconds (medians)")
        cx.set_title("the README's main command in a fresh clone", fontsize=10)
        cx.legend(fontsize=8)
    if "tasks" in result:
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
                     f"start-up {result['server_startup_seconds']:.1f} s apart", fontsize=10)
        ax.legend(fontsize=8)
        if "blobs_uploaded_classifier_changed" in result:
            ax.text(0.01, 0.02, f"republish unchanged: {result['blobs_uploaded_unchanged']} blobs uploaded; "
                    f"classifier changed: {result['blobs_uploaded_classifier_changed']} uploaded of "
                    f"{result['blobs_expected_classifier_changed']} containing it "
                    f"({result['blobs_in_revision']} in the revision)", transform=ax.transAxes, fontsize=8)
    if "dask_runs" in result:
        for j, w in enumerate((1, 2)):
            rows = result["dask_runs"][f"{w}_workers"]
            xs = [j + k * 0.35 - 0.175 * (len(rows) - 1) for k in range(len(rows))]
            bx.bar(xs, [r["fan_out_seconds"] for r in rows], 0.3, color=f"C{j}", label=f"{w} worker(s): fan-out")
            bx.bar(xs, [r["flow_seconds"] - r["fan_out_seconds"] for r in rows], 0.3,
                   bottom=[r["fan_out_seconds"] for r in rows], color=f"C{j}", alpha=0.35, label=f"{w}: rest of flow")
        bx.set_xticks([0, 1], ["1 worker", "2 workers"])
        bx.set_ylabel("seconds (each bar one cold run)")
        bx.set_title(f"compile-models of {len(result['dask_models'])} models on Dask: fan-out speedup "
                     f"{result['dask_speedup_2_vs_1']:.2f}x", fontsize=10)
        bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
