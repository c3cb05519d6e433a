"""Edge TPU regions inside a served suffix (Parallax item 6), end to end through the runtime.

light_inception_v1 (its LRN ops end the Edge TPU prefix; with ``compile.allow_multiple_subgraphs`` the compiler
maps two more runs after them) as a one-model deployment on ``coral-usb-emulated``: the model stage, a profile,
``plan swapless`` then ``plan parallax``, a signed bundle in a file store, ``pull``; then the runtime in
``emulated`` mode at point 0 (the whole model as the CPU suffix, 2 cores), one request at a time, the same inputs
(computed ahead with ``precompute``), two runtimes interleaved:

- ``regions``: the Parallax plan — the suffix's CPU stage, then its kept region held on the EMULATED Edge TPU's
  clock for its offload time (L + F / R_acc + B / B_bw);
- ``uncut``: ``--no-parallax``, the suffix as one interpreter on 2 XNNPACK threads.

Headline ``latency_ratio``: median ``regions`` / median ``uncut``. The region's time is EMULATED; the CPU stage's
is measured. Beside: every candidate region with pruning's terms, the second-core probe, the outputs' equality.

``.venv/bin/python bench/parallax_offload.py`` (no flags: about 2 minutes with the model compiled; it reuses
bench/parallax's) writes ``bench/results/parallax_offload.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import compiled, machine, publish, pyplot, second_core  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ZOO = "light_inception_v1"
DEP = "offload-solo"
CLASS = "coral-usb-emulated"


def log(msg: str) -> None:
    print(f"[parallax_offload {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def deploy(work: Path, src: Path) -> tuple[Path, dict, object]:
    """The model deployed as the flow does it, up to a pulled revision; returns (device dir, params, plan)."""
    from edgeplan.bundle import keys
    from edgeplan.bundle.build import build
    from edgeplan.bundle.publish import publish as publish_bundle
    from edgeplan.pipeline import params as params_mod
    from edgeplan.pipeline import stages
    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.plan.parallax.deployment import plan_parallax
    from edgeplan.profile import cpu, fleet, run
    from edgeplan.runtime import pull
    from edgeplan.store import open_store

    if work.exists():
        shutil.rmtree(work)
    d = work / "inc" / "1"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("parallax", "profiles"))
    p = params_mod.load(None)
    p["compile"]["allow_multiple_subgraphs"] = True
    log("parallax stage (branch-parallel layers, measured here)")
    stages.parallax(d, p)
    log("profile")
    run.profile(d, fleet.load(p).device_class(CLASS), cpu.Settings(repeats=30, min_repeats=10, span_s=2.0,
                                                                    budget_s=5.0))
    p["deployments"] = [{"name": DEP, "device_class": CLASS, "models": [{"name": "inc", "version": "1",
                                                                          "rate": 5.0}]}]
    p["fleet"]["devices"] = [{"id": "edge-off", "device_class": CLASS, "deployment": DEP, "work_pool": CLASS}]
    plan_swapless(work, DEP, p)
    plan, _ = plan_parallax(work, DEP, p)
    _, key_path, _ = keys.generate(work / "keys")
    key, trusted = keys.load_signing_key(key_path), keys.load_trusted([work / "keys"])
    store = open_store(work / "store")
    publish_bundle(store, build(work, DEP, p), key, trusted, fleet.load(p).devices)
    dest = work / "device"
    if not pull(store, dest, trusted, device_id="edge-off").activated:
        raise RuntimeError("the revision was not activated")
    return dest, p, plan


def measure(dest: Path, requests: int) -> dict:
    from edgeplan.runtime import active
    from edgeplan.runtime.engine import Runtime
    from edgeplan.runtime.model import load_inputs

    rev_dir, manifest = active(dest)
    xs = load_inputs(rev_dir, manifest.models[0], 8)
    ms: dict[str, list[float]] = {"regions": [], "uncut": []}
    with Runtime(dest, mode="emulated", adapt=False) as px, Runtime(dest, mode="emulated", adapt=False,
                                                                    parallax=False) as whole:
        runtimes = {"regions": px, "uncut": whole}
        for rt in runtimes.values():
            rt.configure({"inc": 0}, {"inc": 2})
        px.precompute("inc", xs, points=[0])
        same = all(np.array_equal(px.infer("inc", x), whole.infer("inc", x)) for x in xs)  # and warm
        for k in range(requests):  # interleaved, the order alternating
            for name in (("regions", "uncut") if k % 2 else ("uncut", "regions")):
                t0 = time.perf_counter()
                runtimes[name].infer("inc", xs[k % len(xs)])
                ms[name].append(1e3 * (time.perf_counter() - t0))
        status = px.status()
    return {"ms": ms, "identical": same, "regions_held": status["edgetpu_regions"],
            "region_points": status["models"]["inc"]["edgetpu_region_points"]}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ms = result["latency_ms"]["samples"]
    ax.boxplot([ms["uncut"], ms["regions"]], showfliers=False)
    ax.set_xticks([1, 2], ["uncut suffix\n(CPU, 2 threads)", "CPU stage + Edge TPU region\n(region EMULATED)"])
    ax.set_ylabel("request latency, ms")
    ax.set_title(f"{ZOO}, point 0: regions / uncut = {result['latency_ratio']['value']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=80, help="requests per configuration (default 80)")
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "parallax_offload",
                    help="work directory (default .edgeplan/bench/parallax_offload)")
    args = ap.parse_args()
    src = compiled(args.work, ZOO, log, also=(REPO / ".edgeplan" / "bench" / "parallax",))
    dest, _, plan = deploy(args.work / "deployment", src)
    (m,) = plan.models
    log(m.why)
    probe = second_core()
    log(f"serving point 0, {args.requests} requests per configuration")
    got = measure(dest, args.requests)
    med = {k: statistics.median(v) for k, v in got["ms"].items()}
    regions = [r for pp in m.points if pp.point == 0 for r in pp.regions]
    result = {
        "machine": machine(), "model": ZOO, "device_class": CLASS, "point": 0, "requests": args.requests,
        "emulated": "the Edge TPU region's hold (offload time from the emulated Edge TPU's fit); the CPU stage "
                    "and the uncut suffix are measured",
        "latency_ratio": {"value": med["regions"] / med["uncut"], "regions_ms": med["regions"],
                          "uncut_ms": med["uncut"]},
        "latency_ms": {"median": med, "samples": got["ms"]},
        "identical": 1 if got["identical"] else 0,
        "regions": [{"ops": r.ops, "macs": r.macs, "boundary_bytes": r.boundary_bytes,
                     "offload_ms_emulated": r.offload_ms, "cpu_ms_estimated": r.cpu_ms, "keep": r.keep,
                     "why": r.why} for r in regions],
        "regions_held": got["regions_held"], "region_points": got["region_points"], "plan_why": m.why,
        "second_core_free": probe,
    }
    publish("parallax_offload", result, plot, ("latency_ratio", "identical"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
