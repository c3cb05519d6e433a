"""Publish plus every device's pull of a split deployment, timed on emulated hosts (bench/autodice.py's
``deploy_s``, AutoDiCE Table I's "package deployment").

The deployment is the pipeline's own: the model's CPU profile for a CPU-only class of the hosts' quota, its
SwapLess plan (the head serves the whole model at point 0), ``plan_autodice`` (the memory objective, so every
device holds a rank), ``build``; published to moto's S3 server listening on this machine's address on the
emulated subnet (a real S3-protocol server; the hosts reach it over their shaped links). Then every host pulls
at once with ``edgeplan-runtime pull --device-id`` inside its namespaces and cpu cgroup, each fetching only its
own ranks' stages (the head also the rest of the revision) and running its health check before activating; the
head then runs the revision's self-tests through the ranks from what each host pulled (``edgeplan-runtime mpi
run --selftest``), which is not part of the time.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

CLASS = "edge-split"
DEPLOYMENT = "split"


def root_address(state: dict) -> str:
    """This machine's address on the emulated subnet (``emulate.up`` gives it the subnet's first)."""
    return str(ipaddress.ip_network(state["subnet"]).network_address + 1)


def deployment(src: Path, zoo: str, root: Path, params: dict, plat, quota: float, net: float, log) -> dict:
    """Profile, plan and build the split deployment of the compiled model ``src`` over ``plat``'s devices under
    ``root`` (the model's files linked, not copied: VGG-19's segments are 7.9 GB). Returns {params, bundle,
    record: the AutoDiCE plan record, steps: seconds per step}."""
    import copy

    from edgeplan.bundle.build import build
    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.plan.multidevice.deployment import plan_autodice
    from edgeplan.profile import cpu, fleet, run

    shutil.rmtree(root, ignore_errors=True)
    d = root / zoo / "1"
    d.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "profiles":  # this deployment's profile is written here, not into the shared artifacts
            (d / f.name).symlink_to(f.resolve())
    p = copy.deepcopy(params)
    classes = p["fleet"]["device_classes"]
    classes[CLASS] = {**{k: v for k, v in classes["coral-usb-emulated"].items() if k != "cpu_probe_ms"},
                      "cores": 1, "net_bytes_per_s": net, "cpu_quota": quota, "accelerator": {"kind": "none"}}
    p["deployments"] = [{"name": DEPLOYMENT, "device_class": CLASS,
                         "models": [{"name": zoo, "version": "1", "rate": 1.0}]}]
    p["fleet"]["devices"] = [{"id": x.name, "device_class": CLASS, "deployment": DEPLOYMENT, "work_pool": CLASS,
                              "host": x.host} for x in plat.devices]
    p["multidevice"]["generations"] = 100
    steps = {}
    t = time.perf_counter()
    run.profile(d, fleet.load(p).device_class(CLASS), cpu.Settings(repeats=5, min_repeats=2, span_s=0.2, budget_s=0.5))
    steps["profile_s"] = time.perf_counter() - t
    t = time.perf_counter()
    plan_swapless(root, DEPLOYMENT, p)
    record, _ = plan_autodice(root, DEPLOYMENT, p, objective="memory")
    steps["plan_s"] = time.perf_counter() - t
    t = time.perf_counter()
    bundle = build(root, DEPLOYMENT, p)
    steps["build_s"] = time.perf_counter() - t
    log(f"{zoo}: deployment planned ({record['split']['ranks']} ranks) and built ({bundle.size / 1e6:.0f} MB) in "
        f"{sum(steps.values()):.0f} s")
    return {"params": p, "bundle": bundle, "record": record, "steps": steps}


def _pull(h: dict, argv: list[str], env: dict, out: Path, done: dict) -> None:
    from edgeplan.distributed import emulate

    t0 = time.perf_counter()
    with open(out, "w") as f:
        # the shell joins the host's cgroup, then becomes the pull inside its namespaces (no preexec_fn: the
        # pulls start from several threads)
        procs = str(Path(h["cgroup"]) / "cgroup.procs")
        proc = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *emulate.enter(h, argv)],
                                env=env, stdout=f, stderr=subprocess.STDOUT)
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done[h["device"]] = {"code": proc.returncode, "wall_s": time.perf_counter() - t0,
                         "cpu_s": ru.ru_utime + ru.ru_stime, "output": out.read_text().strip().splitlines()[-1:]}


def measure(emulated: str, src: Path, zoo: str, work: Path, params: dict, plat, quota: float, net: float,
            log) -> dict:
    """Publish plus every device's pull, timed (see the module docstring)."""
    from edgeplan.bundle import keys
    from edgeplan.bundle.publish import publish
    from edgeplan.distributed import emulate
    from edgeplan.plan.multidevice.deployment import SPLIT_DIR
    from edgeplan.profile import fleet
    from edgeplan.store import open_store
    from edgeplan.store.moto_server import moto_server

    state = emulate.load(emulated)
    root = work / "deploy" / zoo
    dep = deployment(src, zoo, root, params, plat, quota, net, log)
    bundle, p = dep["bundle"], dep["params"]
    _, key_path, _ = keys.generate(root / "keys")
    key, trusted = keys.load_signing_key(key_path), keys.load_trusted([root / "keys"])
    tables = json.loads((root / "deployments" / DEPLOYMENT / SPLIT_DIR / "tables.json").read_text())
    ranked = {r["device"] for r in tables["ranks"]}  # a device without a rank is refused at pull: not asked
    with moto_server(root_address(state), log=root / "moto.log") as server:
        url = server.url
        store = open_store(f"s3://edgeplan/{zoo}", endpoint_url=url)
        t0 = time.perf_counter()
        publish(store, bundle, key, trusted, fleet.load(p).devices)
        publish_s = time.perf_counter() - t0
        env = {**os.environ, "AWS_ENDPOINT_URL": url, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        done: dict = {}
        threads = []
        t0 = time.perf_counter()
        for h in state["hosts"]:
            if h["device"] not in ranked:
                continue
            argv = [sys.executable, "-m", "edgeplan.runtime.cli", "pull", f"s3://edgeplan/{zoo}", "--dest",
                    str(root / "pulls" / h["device"]), "--device-id", h["device"], "--trusted", str(root / "keys")]
            threads.append(threading.Thread(target=_pull, args=(h, argv, env, root / f"pull-{h['device']}.log",
                                                                done)))
            threads[-1].start()
        for th in threads:
            th.join()
        pulls_s = time.perf_counter() - t0
    failed = {d: r for d, r in done.items() if r["code"] != 0}
    if failed:
        raise RuntimeError(f"{zoo}: pulls failed: {failed}")
    head = dep["record"]["devices"][0]["id"]
    r = subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", "mpi", "run", str(root / "pulls" / head),
                        "--selftest", "--emulated", emulated, "--rank-dest", str(root / "pulls" / "{hostname}"),
                        "--timeout", "600"], capture_output=True, text=True, env=env, timeout=900, check=False)
    selftest = [line for line in (r.stdout + r.stderr).splitlines() if "self-test" in line]
    result = {"value": publish_s + pulls_s, "publish_s": publish_s, "pulls_s": pulls_s, "pulls": len(done),
              "bundle_bytes": bundle.size, "blobs": len(bundle.blobs), "per_device": done,
              "head_cpu_s": done[head]["cpu_s"], "selftest_over_ranks": r.returncode == 0, "selftest": selftest,
              **dep["steps"]}
    log(f"{zoo}: publish {publish_s:.1f} s + {len(done)} pulls at once {pulls_s:.1f} s (head {done[head]['wall_s']:.1f} s "
        f"wall, {done[head]['cpu_s']:.2f} s CPU); self-test over the ranks "
        f"{'passed' if r.returncode == 0 else 'FAILED'}")
    return result
