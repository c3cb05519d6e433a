"""AutoDiCE on emulated hosts (issue: one model over several devices): VGG-19, ResNet-101 and DenseNet-121 (Keras,
seeded weights, int8), 8 emulated devices built here (root: namespaces, cgroups, tbf) and removed at the end.

    .venv/bin/python bench/autodice.py            # full run (about 40 minutes from nothing; VGG-19's compile 8;
                                                  # 7 minutes with the three models compiled)

The compiled models stay in --work for the next run; the splits, runs and deployments made on the way (12 GB)
are removed once the results are written.

Per model: units (the int8 model's fused layers) and a 24-key split (8 devices x 3 cores) timed as the front end
(units + cuts + tables) and the back end (in-process verification: float chain and int8 chain); every unit
timed alone on 1 thread; what a rank costs beyond its invokes (per frame, per byte, a polling share of the
wall time) fitted over four calibration jobs on two of the hosts (the whole model on one, three 2-way cuts:
plan/multidevice/overhead.py; not the Pareto points measured below); NSGA-II (pymoo, population 100 x 400
generations) over the 8-device platform; then
Pareto points spread over the front (and the min-memory one) split, run as MPI ranks over the emulated hosts
and measured. Every link is measured first and must be within 10 % of the platform's.

Platform (EMULATED hosts, real processes): 8 devices of 1 core each with cpu_quota 0.2 (8 x 0.2 = 1.6 of this
machine's 2 cores, so the devices do not contend; the rest runs mpirun and the hosts' daemons), 1 Gbit/s links
(tbf both ways). Energy is modelled
(busy x 6 W + idle x 2 W), never measured.

Keys (ratios and errors are fractions):
- int8_identical: the smallest fraction of frames whose MPI output equals the whole int8 model's.
- throughput_mape: over every measured point of every model, |measured - predicted| / measured; throughput
  measured at steady state: frames after the first (one per rank, the pipeline filling) over the times the rank
  sending the output finished its part of each (the head's own completion times bunch: it sees outputs only
  between its stages).
- throughput_speedup: 2 devices x 1 core (quota 1.0 each) vs the whole model on 1 of them, the smaller of
  VGG-19 and ResNet-101; each rank's CPU share (CPU s / wall s of its busy time) recorded.
- memory_ratio: max peak RSS over the ranks of the min-memory point / the single device's peak RSS (VmHWM of
  each rank process, measured), per model; headline the largest. Beside it, the same above each rank's resident
  set before it loads a model (Python, numpy, LiteRT, Open MPI: ~46 MB a process); the same for the private
  memory alone (RssAnon: weights, arenas, buffers; sampled after the build, after frames 1, 2, 4, 8, ... and at
  the end); and rank_floor_share, what the single device holds whatever the split — that footprint plus the
  library code (file-backed, LiteRT's) its first interpreter pages in — as a share of its peak: no split can
  bring memory_ratio below it.
- front_end_s / back_end_s: per model, VGG-19's as headline value; of SPLIT_RUNS runs, the run of the median
  total (every run, the first one's cold or warm page cache included, in models.<name>.split24.runs).
- nsga_s: the longest exploration; failure_detect_s: a link cut mid-run to the error; orphans: processes of
  the job left after the failure tests.
- max_abs_diff: the float sub-models of each model's first Pareto point as MPI ranks on the same hosts
  (bench/float_rank.py, onnxruntime) vs onnxruntime on the whole float model, both at ORT_ENABLE_BASIC; beside
  it the split's verification: the in-process float chain, at the same level.
- deploy_s: publish plus the 8 devices' pulls at once (bench/split_deploy.py: the pipeline's deployment of
  the model over the 8 EMULATED hosts, its memory-objective split so every device holds a rank, published to
  moto's S3 server on the emulated subnet; each host pulls its own ranks over its shaped link in its cpu
  cgroup, health check included), per model against half of Table I's package deployment; the value is
  VGG-19's. The head then runs the self-tests through the ranks from what each host pulled (not timed).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import split_deploy  # noqa: E402
from _common import compiled, int8_frames, machine, publish, pyplot  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = {"VGG-19": "vgg19_224", "ResNet-101": "resnet101_224", "DenseNet-121": "densenet121_224"}
DEVICES, QUOTA, NET = 8, 0.2, 1.25e8  # 8 x 0.2 = 1.6 of the 2 cores: the rest for mpirun and the daemons
SPLIT_RUNS = 3  # front and back end runs per model (the median total reported)
NAME = "bench-autodice"
TABLE_I_DEPLOY_S = {"DenseNet-121": 21.3, "ResNet-101": 23.3, "VGG-19": 26.9}  # package deployment, 8 devices


def log(msg: str) -> None:
    print(f"[autodice {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def platform_text(n: int, quota: float, slots: str = "0") -> str:
    return "".join(f"dev{i}, cpu, slots={slots}, net={NET:g}, power=2/6, quota={quota:g}\n" for i in range(n))


def run_point(prep: dict, mapping: dict, plat, out: Path, frames: int, xs: np.ndarray, want: np.ndarray,
              emulated: str) -> dict:
    from edgeplan.distributed import emulate, launch
    from edgeplan.plan.multidevice import spec
    from edgeplan.surgery import multidevice

    us = prep["units"]
    multidevice.split(prep["dir"], us, spec.parse_mapping(mapping, plat, us), plat, out, xs=prep["float_inputs"])
    np.save(out / "x.npy", xs[:frames])
    r = launch.run(out, frames=frames, timeout_s=900, deadline_s=120, mpi_args=emulate.mpi_args(emulated),
                   extra=["--inputs", str(out / "x.npy"), "--out", str(out / "y.npy")])
    got = np.load(out / "y.npy")
    ranks = r.summary["ranks"]
    return {"ranks": len(ranks), "fps": r.summary["steady_fps"],
            "identical": float(np.mean([np.array_equal(a, b) for a, b in zip(got, want[:frames])])),
            "peak_rss_bytes": [k["peak_rss_bytes"] for k in ranks],
            "base_rss_bytes": [k["base_rss_bytes"] for k in ranks],
            **{key: [k[key] for k in ranks] for key in ("peak_anon_bytes", "base_anon_bytes", "file_bytes",
                                                        "base_file_bytes")},
            "cpu_share": [k["cpu_s"] / k["wall_s"] for k in ranks],
            "busy_s": [k["busy_s"] for k in ranks], "mpirun_s": r.seconds}


def float_ranks(prep: dict, split: Path, emulated: str) -> dict:
    """The split's float sub-models as MPI ranks (bench/float_rank.py, onnxruntime) on the emulated hosts, against
    onnxruntime on the whole float model at the same optimization level."""
    from float_rank import level, whole_model

    from edgeplan.distributed import emulate, launch

    xs = prep["float_inputs"][:, None]  # frames of one image each
    np.save(split / "xf.npy", xs)
    r = launch.run(split, frames=len(xs), timeout_s=900, deadline_s=300, mpi_args=emulate.mpi_args(emulated),
                   program=(str(Path(__file__).resolve().parent / "float_rank.py"),),
                   extra=["--inputs", str(split / "xf.npy"), "--out", str(split / "yf.npy")])
    want = whole_model(prep["dir"] / "model.onnx", xs)
    got = np.load(split / "yf.npy")
    return {"max_abs_diff": float(np.max(np.abs(got.reshape(want.shape) - want))), "frames": len(xs),
            "ranks": len(r.summary["ranks"]), "ort_level": str(level()).rsplit(".", 1)[-1], "mpirun_s": r.seconds}


def _float_inputs(model) -> np.ndarray:
    from edgeplan.graph.model import GraphView

    view = GraphView(model)
    return np.random.default_rng(0).normal(size=(2, *view.shape(view.input.name)[1:])).astype(np.float32)


def check_links(state: dict) -> dict:
    from edgeplan.distributed import emulate

    rates = {}
    hosts = [h["device"] for h in state["hosts"]]
    for i, a in enumerate(hosts):
        b = hosts[(i + 1) % len(hosts)]
        rate = emulate.measure_link(state, a, b, 50_000_000)
        rates[f"{a}->{b}"] = rate
        if not 0.9 * NET <= rate <= 1.1 * NET:
            raise RuntimeError(f"link {a}->{b} measured {rate * 8 / 1e6:.0f} Mbit/s, not within 10% of "
                               f"{NET * 8 / 1e6:.0f}: figures would be invalid")
    return rates


def bench_model(name: str, zoo: str, work: Path, params: dict, plat8, frames: int, generations: int
                ) -> tuple[dict, dict]:
    """The model's figures, and what was prepared for it (directory, graph, units, costs, float inputs), which the
    2-device speedup reuses."""
    from edgeplan.distributed import emulate, launch
    from edgeplan.graph.model import weights_folder
    from edgeplan.pipeline.multidevice import load
    from edgeplan.plan.multidevice import costs, explore, overhead, spec, units
    from edgeplan.surgery import multidevice

    d = compiled(work, zoo, log, also=(REPO / ".edgeplan" / "bench" / "flashmem",
                                      REPO / ".edgeplan" / "bench" / "parallax"))
    res: dict = {"zoo": zoo}
    # front end and back end, as `edgeplan split` runs them: the two models read once, the units, then a 24-key
    # split (8 devices x 3 cores) and its verification; SPLIT_RUNS times, the run of the median total reported (the
    # machine is shared: one run of VGG-19 took 5.3-7.1 s as the page cache held its file or not), all kept
    p24 = spec.parse_text("".join(f"dev{i}, cpu, slots=0-2, host=10.0.0.{i + 2}\n" for i in range(DEVICES)), "p24")
    keys = [f"dev{i}_cpu{c}" for i in range(DEVICES) for c in range(3)]
    runs = []
    for _ in range(SPLIT_RUNS):
        t0 = time.perf_counter()
        model, graph, _, xs = load(d, params)
        us = units.find(model, graph, xs, min_cosine=params["quantize"]["match_min_cosine"],
                        folder=weights_folder(d / "model.onnx"))
        t_units = time.perf_counter() - t0
        order = multidevice.unit_order(us)
        doc = {k: [] for k in keys}
        for pos, u in enumerate(order):
            doc[keys[min(len(keys) - 1, pos * len(keys) // len(order))]] += list(us.units[u].names)
        doc = {k: v for k, v in doc.items() if v}
        summary = multidevice.split(d, us, spec.parse_mapping(doc, p24, us), p24, work / "runs" / zoo / "split24",
                                    loaded=(model, graph))
        runs.append({"front_end_s": t_units + summary["split_s"], "back_end_s": summary["total_s"] - summary["split_s"],
                     "units_s": t_units, "split_s": summary["split_s"], "total_s": t_units + summary["total_s"]})
    xf = _float_inputs(model)
    del model
    mid = sorted(runs, key=lambda r: r["total_s"])[len(runs) // 2]
    res["units"] = len(us.units)
    res["front_end_s"] = mid["front_end_s"]
    res["back_end_s"] = mid["back_end_s"]
    res["split24"] = {"ranks": summary["ranks"], "stages": summary["stages"], "verify": summary["verify"],
                      "units_s": mid["units_s"], "split_s": mid["split_s"], "runs": runs}
    log(f"{name}: {len(us.units)} units; front end {res['front_end_s']:.1f} s, back end {res['back_end_s']:.1f} s")
    # unit times and exploration
    t0 = time.perf_counter()
    c = costs.measure(graph, us, order, cores=1)
    res["profile_s"] = time.perf_counter() - t0
    # what a rank costs beyond its invokes, measured over MPI on two of the hosts (overhead.measure)
    t0 = time.perf_counter()
    ov, calibration = overhead.measure(d, us, c, plat8, work / "runs" / zoo / "calibrate",
                                       lambda out: launch.run(out, frames=16, timeout_s=900, deadline_s=120,
                                                              mpi_args=emulate.mpi_args(NAME)).summary, xf)
    c = dataclasses.replace(c, rank_overhead=ov)
    res["rank_overhead"] = {**calibration, "seconds": time.perf_counter() - t0}
    log(f"{name}: rank overhead {ov.frame_s * 1e3:.2f} ms/frame + {ov.byte_s * 1e9:.2f} ms/MB + {ov.poll:.3f} "
        f"of the wall time ({res['rank_overhead']['seconds']:.0f} s)")
    prep = {"dir": d, "graph": graph, "units": us, "costs": c, "float_inputs": xf}
    front, stats = explore.explore(c, us, plat8, generations=generations)
    res["nsga"] = stats
    log(f"{name}: NSGA-II {stats['seconds']:.1f} s, {len(front)} Pareto points")
    # points spread over the front, the min-memory one included
    picks = sorted({round(q * (len(front) - 1)) for q in np.linspace(0, 1, 5)}
                   | {int(np.argmin([p.memory_bytes for p in front]))})
    single = explore.single_device(c, us, plat8)
    xs, want = int8_frames(graph, frames, seed=3)
    res["points"] = []
    for k, pick in enumerate([*picks, "single"]):
        p = single if pick == "single" else front[pick]
        m = run_point(prep, p.mapping, plat8, work / "runs" / zoo / f"p{k}", frames, xs, want, NAME)
        row = {"point": pick, "predicted_fps": 1 / p.period_s, "predicted_memory_bytes": p.memory_bytes,
               "energy_j_modelled": p.energy_j, "keys": list(p.mapping), **m}
        row["error"] = abs(m["fps"] - row["predicted_fps"]) / m["fps"]
        res["points"].append(row)
        log(f"{name} point {pick}: {len(p.mapping)} devices, predicted {row['predicted_fps']:.2f} fps, measured "
            f"{m['fps']:.2f}, identical {m['identical']:.2f}")
    res["float_ranks"] = float_ranks(prep, work / "runs" / zoo / "p0", NAME)
    log(f"{name}: float sub-models as {res['float_ranks']['ranks']} MPI ranks, max |diff| "
        f"{res['float_ranks']['max_abs_diff']:.3g} vs the whole model")
    minmem = res["points"][picks.index(int(np.argmin([p.memory_bytes for p in front])))]
    one = res["points"][-1]
    res["memory_ratio"] = max(minmem["peak_rss_bytes"]) / max(one["peak_rss_bytes"])
    above = [p - b for p, b in zip(minmem["peak_rss_bytes"], minmem["base_rss_bytes"])]
    res["memory_ratio_above_base"] = max(above) / (one["peak_rss_bytes"][0] - one["base_rss_bytes"][0])
    private = [p - b for p, b in zip(minmem["peak_anon_bytes"], minmem["base_anon_bytes"])]
    res["memory_ratio_private"] = max(private) / (one["peak_anon_bytes"][0] - one["base_anon_bytes"][0])
    # what every rank holds whatever its share of the model: its footprint before any model, and the library code
    # (LiteRT's) its first interpreter pages in
    res["rank_floor_bytes"] = one["base_rss_bytes"][0] + one["file_bytes"][0] - one["base_file_bytes"][0]
    res["rank_floor_share"] = res["rank_floor_bytes"] / one["peak_rss_bytes"][0]
    res["costs"] = c.to_json()
    res["deploy"] = split_deploy.measure(NAME, d, zoo, work, params, plat8, QUOTA, NET, log)
    res["deploy"]["target_s"] = TABLE_I_DEPLOY_S[name] / 2
    return res, prep


def speedup(prep: dict, work: Path, frames: int) -> dict:
    """2 devices x 1 core (quota 1.0) vs 1 device: the fastest 2-device point of the exploration over the unit
    times already measured for the model."""
    from edgeplan.distributed import emulate
    from edgeplan.plan.multidevice import explore, spec

    us, c, zoo = prep["units"], prep["costs"], prep["dir"].parent.name
    emulate.down(NAME + "-2")
    plat = emulate.up(NAME + "-2", spec.parse_text(platform_text(2, 1.0), "p2"), subnet="10.215.0.0/24")
    try:
        front, _ = explore.explore(c, us, plat, generations=100)
        best = min((p for p in front if len(p.mapping) == 2), key=lambda p: p.period_s)
        single = explore.single_device(c, us, plat)
        xs, want = int8_frames(prep["graph"], frames, seed=4)
        two = run_point(prep, best.mapping, plat, work / "runs" / zoo / "two", frames, xs, want, NAME + "-2")
        one = run_point(prep, single.mapping, plat, work / "runs" / zoo / "one", frames, xs, want, NAME + "-2")
        share = max(two["cpu_share"])  # the bottleneck rank wants a whole core all the time: did it get it?
        return {"value": two["fps"] / one["fps"], "two": two, "one": one, "predicted": single.period_s / best.period_s,
                "bottleneck_cpu_share": share, "valid": share >= 0.9}
    finally:
        emulate.down(NAME + "-2")


def failures(out: Path) -> dict:
    """A rank killed and a link cut mid-run on the emulated hosts: time to the error, processes left."""
    from edgeplan.distributed import emulate, launch

    st = emulate.load(NAME)
    rows = {}
    # the host of rank 1: a host the split uses (a Pareto point need not use every device)
    victim = json.loads((out / "tables.json").read_text())["ranks"][1]["device"]
    port = next(h["bridge_port"] for h in st["hosts"] if h["device"] == victim)

    def left() -> int:
        r = subprocess.run(["pgrep", "-f", "edgeplan.distributed.rank|prted"], capture_output=True, text=True)
        return len(r.stdout.split())

    cut_at: list[float] = []

    def cut():
        time.sleep(8.0)
        cut_at.append(time.perf_counter())
        subprocess.run(["ip", "-n", st["bridge"], "link", "set", port, "down"], check=True)

    th = threading.Thread(target=cut)
    th.start()
    try:
        launch.run(out, frames=100_000, timeout_s=120, deadline_s=3, mpi_args=emulate.mpi_args(NAME))
        rows["link_cut"] = {"error": None}
    except launch.DistributedError as e:
        detect = time.perf_counter() - cut_at[0] if cut_at else None  # None: it failed before the cut
        rows["link_cut"] = {"detect_s": detect, "error": str(e), "orphans": left()}
    finally:
        th.join()
        subprocess.run(["ip", "-n", st["bridge"], "link", "set", port, "up"], check=True)
    t0 = time.perf_counter()
    try:
        launch.run(out, frames=40, timeout_s=120, deadline_s=3, mpi_args=emulate.mpi_args(NAME),
                   extra=["--fault", "1:10:kill"])
        rows["rank_killed"] = {"error": None}
    except launch.DistributedError as e:
        rows["rank_killed"] = {"job_s": time.perf_counter() - t0, "error": str(e), "orphans": left()}
    return rows


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    models = [m for m in result["models"] if "points" in result["models"][m]]
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(5 * max(1, len(models)), 4.2), squeeze=False)
    for ax, name in zip(axes[0], models):
        pts = [p for p in result["models"][name]["points"] if p["point"] != "single"]
        ax.scatter([p["predicted_memory_bytes"] / 1e6 for p in pts], [p["predicted_fps"] for p in pts],
                   label="predicted", marker="o")
        ax.scatter([max(p["peak_rss_bytes"]) / 1e6 for p in pts], [p["fps"] for p in pts], label="measured (RSS)",
                   marker="x")
        ax.set_xlabel("max memory per device, MB")
        ax.set_ylabel("frames/s")
        ax.set_title(f"{name}: Pareto points, 8 EMULATED hosts")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "autodice")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--generations", type=int, default=400)
    args = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("the emulated hosts need root")
    from edgeplan.distributed import emulate
    from edgeplan.pipeline import params as params_mod
    from edgeplan.plan.multidevice import spec

    params = params_mod.load(str(REPO / "params.yaml"))
    wanted = [m for m in args.models.split(",") if m]
    result: dict = {"machine": machine(), "emulated": "hosts (namespaces, cgroups, tbf links); energy modelled",
                    "platform": platform_text(DEVICES, QUOTA), "frames": args.frames, "models": {}}
    emulate.down(NAME)
    plat8 = emulate.up(NAME, spec.parse_text(platform_text(DEVICES, QUOTA), "platform"))
    try:
        result["links_bytes_per_s"] = check_links(emulate.load(NAME))
        prepared = {}
        for name in wanted:
            result["models"][name], prepared[name] = bench_model(name, MODELS[name], args.work, params, plat8,
                                                                 args.frames, args.generations)
        first = next(iter(result["models"].values()))
        result["failures"] = failures(args.work / "runs" / first["zoo"] / "p0")
    finally:
        emulate.down(NAME)
    result["speedup"] = {n: speedup(prepared[n], args.work, args.frames) for n in ("VGG-19", "ResNet-101")
                         if n in wanted}
    ms = result["models"]
    errs = [p["error"] for m in ms.values() for p in m["points"] if p["point"] != "single"]
    result["int8_identical"] = min(p["identical"] for m in ms.values() for p in m["points"])
    result["throughput_mape"] = {"value": float(np.mean(errs)), "points": len(errs)}
    result["throughput_speedup"] = {"value": min(s["value"] for s in result["speedup"].values()) if result["speedup"]
                                    else None, "per_model": {k: s["value"] for k, s in result["speedup"].items()}}
    result["memory_ratio"] = {"value": max(m["memory_ratio"] for m in ms.values()),
                              "per_model": {k: m["memory_ratio"] for k, m in ms.items()},
                              # beside, not instead: each rank's peak above its footprint before any model
                              "above_base_per_model": {k: m["memory_ratio_above_base"] for k, m in ms.items()},
                              # the private (anonymous) memory alone: weights, arenas, buffers; and the floor
                              "private_per_model": {k: m["memory_ratio_private"] for k, m in ms.items()},
                              "rank_floor_share_per_model": {k: m["rank_floor_share"] for k, m in ms.items()}}
    head = ms.get("VGG-19") or first
    result["front_end_s"] = {"value": head["front_end_s"], "per_model": {k: m["front_end_s"] for k, m in ms.items()},
                             "first_run_per_model": {k: m["split24"]["runs"][0]["front_end_s"] for k, m in ms.items()}}
    result["back_end_s"] = {"value": head["back_end_s"], "per_model": {k: m["back_end_s"] for k, m in ms.items()},
                            "first_run_per_model": {k: m["split24"]["runs"][0]["back_end_s"] for k, m in ms.items()}}
    result["nsga_s"] = {"value": max(m["nsga"]["seconds"] for m in ms.values())}
    f = result["failures"]
    result["failure_detect_s"] = {"value": f["link_cut"].get("detect_s"), "rank_killed_job_s": f["rank_killed"].get("job_s")}
    result["orphans"] = sum(x.get("orphans", 0) for x in f.values())
    result["max_abs_diff"] = {"value": max(m["float_ranks"]["max_abs_diff"] for m in ms.values()),
                              "ort_level": next(iter(ms.values()))["float_ranks"]["ort_level"],
                              # beside: the in-process float chain (split verify) against the whole model, both at
                              # graph.evaluate's level (ORT_ENABLE_BASIC)
                              "in_process": max(m["split24"]["verify"]["float_max_abs_diff"]
                                                        for m in ms.values())}
    result["deploy_s"] = {"value": head["deploy"]["value"], "per_model": {k: m["deploy"]["value"] for k, m in ms.items()},
                          "target_per_model": {k: m["deploy"]["target_s"] for k, m in ms.items()},
                          "met": {k: m["deploy"]["value"] <= m["deploy"]["target_s"] for k, m in ms.items()},
                          "selftest_over_ranks": all(m["deploy"]["selftest_over_ranks"] for m in ms.values())}
    publish("autodice", result, plot, ("max_abs_diff", "int8_identical", "throughput_mape", "throughput_speedup", "memory_ratio",
                                       "front_end_s", "back_end_s", "deploy_s", "nsga_s", "failure_detect_s",
                                       "orphans"))
    # the splits, MPI runs and deployments written on the way (12 GB for the three models: every point's float
    # stages hold the model's weights); the compiled models stay for the next run
    for scratch in (args.work / "runs", args.work / "deploy"):
        shutil.rmtree(scratch, ignore_errors=True)
    log(f"removed {args.work / 'runs'} and {args.work / 'deploy'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
