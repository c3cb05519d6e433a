"""Runtime validation (issue: thin device runtime). Writes bench/results/runtime_validation.json and .png.

Two models are compiled, profiled on this machine (raw CPU times: the class's reference-probe scaling is
removed), planned for SUFFIX_CORES suffix cores (this machine's less one, left to the runtime's own threads
and the load generator), published to a local store and pulled with the runtime; then, with the EMULATED
Edge TPU (prefix outputs computed ahead, the profile's modelled service time held on the device's own FCFS
clock) and real CPU suffixes on LiteRT/XNNPACK:

- mape_single / mape_multi: the measured mean latency of an open-loop Poisson load through the runtime
  (in-process API, int8 inputs, latency from each request's send to its completion; the first 10% of each run
  discarded) against the `refined` analytic prediction, over configurations (the plan's; each model wholly
  on the CPU and at a middle point on one core, the others on the accelerator; all on the accelerator) at
  utilisations 0.3 and 0.6 of the busiest resource; one model, and the two-model deployment. The model is
  fed the suffix times the runtime's pools timed during the run (their mean and spread at the point) and the
  emulated TPU's modelled times, and the runtime's own cost per request (dispatch and the completion's
  wake-up: spaced-out requests at the all-TPU point, measured apart before the runs) is added to it.
  Beside it: the model alone (mape_*_model_only), the simulator (sim_mape_*), and the model fed the bundle's
  profile scaled by the speed probe timed just before (mape_*_from_profile: what the planner predicts; on
  some hosts a suffix runs up to 1.7x slower after an idle gap than in the profiler's back-to-back rounds).
- throughput_ratio_vs_bare: closed loop, the model wholly on the CPU (point 0) on k = SUFFIX_CORES threads:
  2k clients through the runtime against k threads each invoking their own LiteRT interpreter of the same
  model back to back; medians of alternating rounds.
- failed_requests_during_switches: 100 switches of points and cores under a Poisson load.
- repull_bytes_over_changed_bytes: bytes the runtime fetched for a new revision (the plan changed) over the
  bytes of the blobs that revision does not share with the previous one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, publish, pyplot

# The CPU cores the plans and the validation give to suffixes: this machine's, less one for the runtime's own
# threads (dispatch, the emulated accelerator's clock, HTTP) and the load generator — the queueing model
# treats a suffix core as dedicated, and on 2 vCPUs two suffix threads plus the runtime do not leave it so.
SUFFIX_CORES = max(1, (os.cpu_count() or 2) - 1)
PILOT_S = 3.0
MIN_REQUESTS, MAX_RUN_S = 1000, 120.0  # per configuration, over its repeats
REPEATS = 3
MEDIANS = ("measured_ms", "predicted_ms", "model_ms", "simulated_ms", "predicted_from_profile_ms", "dispatch_ms",
           "suffix_served_ms", "suffix_profile_ms", "suffix_served_autocorrelation", "cpu_speed_factor")

# The runtime as the bench drives it: no request turned away, neither for the number in flight nor by latency-aware
# admission (a 503 when the queue ahead would take over 1.4x the plan's latency while the model is overloaded):
# the figures are the queue's latencies and the switches' failures, not the shedding (bench/_overload.py's).
UNLIMITED = {"max_inflight": 100_000, "latency_budget": None}
# service times well above the Python runtime's own ~0.3-0.5 ms per request (thread hand-offs on these VMs)
MODELS = {"full": ("mobilenetv2_224", "resnet50v2_224"), "quick": ("tiny_cnn", "tiny_cnn")}


def prepare(work: Path, zoo: tuple[str, str], quick: bool) -> tuple[dict, Path, dict]:
    """Compile, verify and profile (once per work directory), then plan for SUFFIX_CORES and publish;
    returns (params, store, trusted keys)."""
    from edgeplan.bundle import keys
    from edgeplan.cli_store import publish_deployment
    from edgeplan.pipeline import params as params_mod
    from edgeplan.pipeline import stages
    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.profile import cpu, fleet, run

    root, saved = work / "artifacts", work / "params.json"
    if saved.is_file():
        print(f"[bench] reusing the models and profiles in {work}", flush=True)
        p = json.loads(saved.read_text())
    else:
        p = params_mod.load(None)
        p["fleet"]["device_classes"]["coral-usb-emulated"].pop("cpu_probe_ms", None)  # raw CPU times
        for name, z in zip(("a", "b"), zoo):
            d = stages.ingest(f"zoo:{z}", name, "1", root)
            stages.build(d, p)
            if not stages.verify(d, p).ok:
                raise SystemExit(f"{z}: verify failed")
            settings = cpu.Settings(repeats=60 if quick else 200, span_s=3 if quick else 15,
                                    budget_s=5 if quick else 20)
            run.profile(d, fleet.load(p).device_class("coral-usb-emulated"), settings)
            print(f"[bench] built and profiled {z} as {name}", flush=True)
        p["deployments"] = [
            {"name": "single", "device_class": "coral-usb-emulated",
             "models": [{"name": "a", "version": "1", "rate": 20.0}]},
            {"name": "multi", "device_class": "coral-usb-emulated",
             "models": [{"name": "a", "version": "1", "rate": 15.0}, {"name": "b", "version": "1", "rate": 10.0}]}]
        p["fleet"]["devices"] = []
        keys.generate(work / "keys")
        p["publish"] = {"store": str(work / "store"), "trusted_keys": [str(work / "keys")]}
        saved.write_text(json.dumps(p))
    p["fleet"]["device_classes"]["coral-usb-emulated"]["cores"] = SUFFIX_CORES
    key_path = next((work / "keys").glob("*.key"))
    for dep in ("single", "multi"):
        plan_swapless(root, dep, p)
        publish_deployment(root, dep, p, None, str(key_path))
    return p, work / "store", keys.load_trusted([work / "keys"])


def rate_for(rt, points, cores, rho: float, served=None) -> dict[str, float]:
    """Rates in the deployment's planned proportions at which the busiest resource has utilisation ``rho``
    (suffix times: ``served``'s where given, else the profile's)."""
    from edgeplan.plan.swapless.instance import Config
    from edgeplan.plan.swapless.queueing import evaluate

    base = {m.name: m.rate for m in rt.plan.models}
    ev = evaluate(instance(rt, base, served=served), Config(tuple(points[n] for n in rt.order),
                                                             tuple(cores[n] for n in rt.order)), "refined")
    top = max(ev.utilisation.values())
    return {n: r * rho / top for n, r in base.items()}


def speed(rt) -> dict[str, float]:
    """Per model, the machine's speed now over its speed while the model was profiled (> 1: slower now): the
    profiler's speed probe timed now (median of 40 runs) over its median in the profile's rounds — the
    pipeline's reference-probe scaling, so a prediction is made at the speed the run sees (this shared
    machine's speed moves by tens of percent over minutes)."""
    from edgeplan.profile.cpu import PROBE
    from edgeplan.quantize import litert

    run = litert.Runner(litert.interpreter(PROBE.read_bytes(), deterministic=False))
    x = np.zeros(run.shape, run.dtype)
    times = []
    for k in range(43):
        t = time.perf_counter()
        run(x)
        if k >= 3:
            times.append(1e3 * (time.perf_counter() - t))
    now = statistics.median(times)
    return {n: now / (rt.models[n].profile.probe_ms(1) or now) for n in rt.order}


def instance(rt, rates: dict[str, float], factor: dict[str, float] | None = None,
             served: dict[str, dict[int, list[float]]] | None = None):
    """The deployment at ``rates`` for the queueing model: the bundle's profile with every CPU time scaled by
    ``factor``, or with the suffix times the runtime's pools timed in the run (``served``, per point) in place
    of the profile's. The TPU side is EMULATED: held as modelled, taken as it is."""
    from edgeplan.plan.swapless.instance import Instance, ModelSpec

    out = []
    for n in rt.order:
        m, f = rt.models[n].spec.with_rate(rates[n]), (factor or {}).get(n, 1.0)
        s_cpu = [v * f for v in m.s_cpu]
        samples = [tuple(v * f for v in xs) for xs in (m.cpu_samples or [()] * len(m.s_cpu))]
        for p, xs in ((served or {}).get(n) or {}).items():
            s_cpu[p], samples[p] = statistics.median(xs), tuple(xs)
        out.append(ModelSpec(m.name, m.rate, m.s_tpu, m.io, m.t_load, m.footprint, tuple(s_cpu), m.tpu_samples,
                             tuple(samples)))
    return Instance(tuple(out), rt.plan.cores, rt.plan.capacity_bytes)


def served_during(rt, points, load) -> dict[str, dict[int, list[float]]]:
    """Run ``load()``; the suffix times (s) each model's pool timed meanwhile at its point."""
    for pool in rt.pools.values():
        pool.service.clear()
    load()
    return {n: {p: v for p, v in rt.service_times(n).items() if p == points[n]} for n in rt.order}


def autocorrelation(xs: list[float]) -> float | None:
    """Lag-1 autocorrelation of the suffix times in serving order: the queueing model takes them as
    independent; near 0 they are, well above 0 the machine went through slow and fast spells."""
    if len(xs) < 10:
        return None
    x = np.asarray(xs) - np.mean(xs)
    den = float(np.dot(x, x))
    return float(np.dot(x[:-1], x[1:]) / den) if den > 0 else None


def pilot_rates(rt, points, cores, rho: float, inputs) -> dict[str, float]:
    """Rates for utilisation ``rho``: a pilot of PILOT_S at the rates the profile gives, then the rates the
    suffix times it served give (on this machine they differ from the profile's by up to 1.7x)."""
    from edgeplan.runtime import loadgen

    rt.configure(points, cores, "bench")
    rates = rate_for(rt, points, cores, rho)
    return rate_for(rt, points, cores, rho, served_during(
        rt, points, lambda: loadgen.run(rt, rates, PILOT_S, inputs, seed=7)))


def measure(rt, points, cores, rates, duration: float, inputs, dispatch: dict[str, float]) -> dict:
    """One run of a configuration at ``rates``: at least ``duration``, longer (up to MAX_RUN_S / REPEATS)
    until the slowest model has had MIN_REQUESTS / REPEATS (a mean over a few hundred requests of a queue
    behind a 50-ms service moves by tens of percent). Predictions are the model's mean plus the runtime's
    cost per request (``dispatch``, measured apart); the model's alone are kept beside them."""
    from edgeplan.plan.simulate.des import simulate
    from edgeplan.plan.swapless.instance import Config
    from edgeplan.plan.swapless.queueing import evaluate
    from edgeplan.runtime import loadgen

    rt.configure(points, cores, "bench")
    factor = speed(rt)
    duration = max(duration, min(MAX_RUN_S, MIN_REQUESTS / min(r for r in rates.values() if r > 0)) / REPEATS)
    records = []
    served = served_during(rt, points, lambda: records.extend(
        loadgen.run(rt, rates, duration, inputs, seed=int(1000 * sum(rates.values())))))
    config = Config(tuple(points[n] for n in rt.order), tuple(cores[n] for n in rt.order))
    inst, by_profile = instance(rt, rates, served=served), instance(rt, rates, factor=factor)
    ev, ev_profile = evaluate(inst, config, "refined"), evaluate(by_profile, config, "refined")
    sim = simulate(inst, config, requests=20000, stochastic=True, seed=1)
    rows = []
    for i, n in enumerate(rt.order):
        lat = [r.latency_ms for r in records if r.model == n and r.scheduled > 0.1 * duration and r.status == 200]
        p, fixed = points[n], dispatch[n]
        rows.append({"model": n, "point": p, "cores": cores[n], "rate": rates[n], "duration_s": duration,
                     "measured_ms": float(np.mean(lat)) if lat else None, "requests": len(lat),
                     "failed": sum(1 for r in records if r.model == n and r.status != 200),
                     "model_ms": 1e3 * ev.latency[i], "dispatch_ms": fixed,
                     "predicted_ms": 1e3 * ev.latency[i] + fixed, "simulated_ms": 1e3 * sim.models[i].mean + fixed,
                     "predicted_from_profile_ms": 1e3 * ev_profile.latency[i] + fixed,
                     "suffix_served_ms": 1e3 * inst.models[i].cpu_mean[p] if p < rt.models[n].last else None,
                     "suffix_profile_ms": 1e3 * by_profile.models[i].cpu_mean[p] if p < rt.models[n].last else None,
                     "suffix_served_autocorrelation": autocorrelation(served[n].get(p, [])),
                     "cpu_speed_factor": factor[n]})
    return {"utilisation": {k: round(v, 3) for k, v in ev.utilisation.items()}, "rows": rows}


def configs(rt) -> list[tuple[dict, dict]]:
    """The plan's configuration; then each model in turn wholly on the CPU and at a middle point, on one core,
    the others wholly on the (EMULATED) accelerator; then every model on the accelerator."""
    tpu = ({n: rt.models[n].last for n in rt.order}, {n: 0 for n in rt.order})
    out = [(dict(rt.points), dict(rt.cores))]
    for n in rt.order:
        for p in (0, max(1, rt.models[n].last // 2)):
            out.append(({**tpu[0], n: p}, {**tpu[1], n: 1}))
    out.append(tpu)
    return [c for i, c in enumerate(out) if c not in out[:i]]


def dispatch_ms(rt, inputs) -> dict[str, float]:
    """The runtime's own cost per request (dispatch, the completion's wake-up), per model: the mean latency of
    200 spaced-out requests at the all-TPU point (no queue; timed as loadgen times, from the send to the
    completion callback) minus the mean EMULATED service time held."""
    saved = (dict(rt.points), dict(rt.cores))
    out = {}
    for n in rt.order:
        m = rt.models[n]
        rt.configure({**saved[0], n: m.last}, {**saved[1], n: 0}, "bench: dispatch")
        lat = []
        for k in range(200):
            t = time.perf_counter()
            fut = rt.submit(n, inputs[n][k % len(inputs[n])])
            fut.add_done_callback(lambda f, t=t, lat=lat: lat.append(time.perf_counter() - t))
            fut.result()
            time.sleep(0.005)
        out[n] = 1e3 * (statistics.fmean(lat) - m.spec.tpu_mean[m.last] - m.spec.io[m.last])
    rt.configure(*saved, "bench")
    return out


def quantized_inputs(rt, n: int) -> dict[str, list[np.ndarray]]:
    """Each model's finite input set, quantized once: the load is sent as the int8 model's tensors, so what
    is timed is serving (a client's float-to-int8 conversion, ~0.3 ms for a 224x224x3 image, is its own)."""
    from edgeplan.runtime.model import load_inputs, quantize_input

    return {m: [quantize_input(x, e.input) for x in load_inputs(rt.rev_dir, e, n)]
            for m, e in zip(rt.order, rt.manifest.models)}


def validation(dest: Path, duration: float) -> list[dict]:
    """Every configuration at utilisations 0.3 and 0.6, REPEATS times, the repeats interleaved (a slow spell
    of this shared machine then hits one repeat of a configuration, not all); per configuration and model the
    medians over the repeats of the measured and the predicted means."""
    from edgeplan.runtime import Runtime

    with Runtime(dest, adapt=False, **UNLIMITED) as rt:
        dep = rt.manifest.deployment
        inputs = quantized_inputs(rt, 8)
        for n in rt.order:
            rt.precompute(n, inputs[n], points="all")
        cases = [(points, cores, rho) for points, cores in configs(rt) for rho in (0.3, 0.6)]
        rates = [pilot_rates(rt, points, cores, rho, inputs) for points, cores, rho in cases]
        runs: list[list[dict]] = [[] for _ in cases]
        for k in range(REPEATS):
            fixed = dispatch_ms(rt, inputs)
            print(f"[bench] {dep} repeat {k + 1}/{REPEATS}: runtime cost per request {fixed}", flush=True)
            for (points, cores, rho), r, done in zip(cases, rates, runs):
                done.append(measure(rt, points, cores, r, duration / REPEATS, inputs, fixed))
                print(f"[bench] {dep} rho={rho} " + "; ".join(
                    f"{x['model']} p{x['point']} k{x['cores']} {x['rate']:.1f}/s {x['duration_s']:.0f} s: measured "
                    f"{x['measured_ms'] or float('nan'):.2f} ms, predicted {x['predicted_ms']:.2f} (model alone "
                    f"{x['model_ms']:.2f}, from the profile {x['predicted_from_profile_ms']:.2f}); suffix served "
                    f"{x['suffix_served_ms'] or 0:.2f} ms, profiled {x['suffix_profile_ms'] or 0:.2f}"
                    for x in done[-1]["rows"]), flush=True)
    out = []
    for (points, cores, rho), done in zip(cases, runs):
        rows = []
        for i, row in enumerate(done[0]["rows"]):
            reps = [d["rows"][i] for d in done]
            merged = dict(row)
            for key in MEDIANS:
                vals = [x[key] for x in reps if x[key] is not None]
                merged[key] = statistics.median(vals) if vals else None
            merged["requests"] = sum(x["requests"] for x in reps)
            merged["failed"] = sum(x["failed"] for x in reps)
            merged["duration_s"] = sum(x["duration_s"] for x in reps)
            merged["repeats"] = reps
            rows.append(merged)
        out.append({"deployment": dep, "rho": rho, "utilisation": done[0]["utilisation"], "rows": rows})
    return out


def throughput(dest: Path, seconds: float, pairs: int) -> dict:
    """Closed loop, the model wholly on the CPU (point 0) on k = the plan's cores: 2k client threads sending
    its int8 input through the runtime (so the pool always has a request waiting) against k threads each
    invoking their own LiteRT interpreter of the same model back to back. ``pairs`` pairs of rounds, in
    alternating order (ABBA); the figure is the median of the pairs' ratios (this machine's speed drifts by
    tens of percent over a minute: rounds seconds apart compare, rounds a minute apart do not)."""
    from edgeplan.quantize import litert
    from edgeplan.runtime import Runtime

    with Runtime(dest, adapt=False, **UNLIMITED) as rt:
        n = rt.order[0]
        k = rt.plan.cores
        rt.configure({n: 0}, {n: k}, "bench")
        q = quantized_inputs(rt, 1)[n][0]
        runs = [litert.Runner(litert.interpreter(rt.models[n].segment(0, "suffix", count=False),
                                                 deterministic=False)) for _ in range(k)]

        def closed(fn, threads: int) -> float:
            done = [0] * threads
            stop = time.perf_counter() + seconds

            def loop(j):
                while time.perf_counter() < stop:
                    fn(j)
                    done[j] += 1

            ts = [threading.Thread(target=loop, args=(j,)) for j in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return sum(done) / seconds

        def via():
            return closed(lambda j: rt.infer(n, q), 2 * k)

        def bare():
            return closed(lambda j: runs[j](q), k)

        out = []
        for i in range(pairs):
            order = (via, bare) if i % 2 == 0 else (bare, via)
            got = {f.__name__: f() for f in order}
            out.append((got["via"], got["bare"]))
    return {"threads": k, "clients": 2 * k, "round_s": seconds, "runtime_rps": [v for v, _ in out],
            "bare_rps": [b for _, b in out], "pair_ratios": [v / b for v, b in out],
            "throughput_ratio_vs_bare": statistics.median(v / b for v, b in out)}


def switches(dest: Path, count: int = 100) -> dict:
    """``count`` switches of points and cores (within the plan's cores: the CPU's cores go to one model at a
    time, the others wholly on the accelerator) every 50 ms under a Poisson load."""
    from edgeplan.runtime import Runtime, loadgen

    with Runtime(dest, adapt=False, **UNLIMITED) as rt:
        inputs = quantized_inputs(rt, 4)
        for n in rt.order:
            rt.precompute(n, inputs[n], points="all")
        rates = rate_for(rt, dict(rt.points), dict(rt.cores), 0.5)
        stop, k0, errors = threading.Event(), rt.switches, []
        tpu = {n: rt.models[n].last for n in rt.order}

        def switcher():
            try:
                for k in range(count):
                    if stop.is_set():
                        break
                    n = rt.order[k % len(rt.order)]
                    point = (k * 3 + 1) % (rt.models[n].last + 1)  # every point in turn, all-TPU included
                    cores = {m: 0 for m in rt.order}
                    if point < rt.models[n].last:
                        cores[n] = 1 + k % rt.plan.cores
                    rt.configure({**tpu, n: point}, cores, "bench")
                    time.sleep(0.05)
            except Exception as e:  # noqa: BLE001 - reported, and the run fails below
                errors.append(repr(e))

        t = threading.Thread(target=switcher)
        t.start()
        records = loadgen.run(rt, rates, 0.06 * count + 1.0, inputs, seed=9)
        stop.set()
        t.join()
    if errors or rt.switches - k0 < count:
        raise SystemExit(f"switches: {rt.switches - k0} of {count} made ({'; '.join(errors) or 'too slow'})")
    statuses = Counter(r.status for r in records)
    return {"switches": rt.switches - k0, "requests": len(records),
            "failed_requests_during_switches": sum(n for c, n in statuses.items() if c != 200),
            "statuses": {str(c): n for c, n in sorted(statuses.items())}}


def repull(work: Path, params: dict, store: Path, trusted: dict, dest: Path) -> dict:
    """A new revision of the one-model deployment whose plan differs (a rate the store has not seen: x(2 +
    revision/1000)); bytes the runtime fetched for it over the bytes of its blobs the device did not hold."""
    from edgeplan.bundle.publish import read_latest
    from edgeplan.cli_store import publish_deployment
    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.runtime import pull
    from edgeplan.store import open_store

    s = open_store(store)
    _, before = read_latest(s, "single", trusted)
    params["deployments"][0]["models"][0]["rate"] *= 2 + before.revision / 1000
    plan_swapless(work / "artifacts", "single", params)
    key = next((work / "keys").glob("*.key"))
    publish_deployment(work / "artifacts", "single", params, None, str(key))
    _, after = read_latest(s, "single", trusted)
    held = {p.name for p in (dest / "blobs" / "sha256").iterdir()}
    missing = {b.sha256: b.size for b in after.blobs if b.sha256 not in held}
    res = pull(s, dest, trusted, deployment="single")
    return {"repull_bytes": res.fetched_bytes, "missing_bytes": sum(missing.values()), "missing_blobs": len(missing),
            "blobs": len(after.blobs), "revision": res.revision, "repull_bytes_over_changed_bytes":
            res.fetched_bytes / sum(missing.values()) if missing else None}


def mape(rows, key: str) -> float | None:
    """Mean absolute relative error, as a fraction (0.05 = 5%)."""
    pairs = [(r["measured_ms"], r[key]) for r in rows if r["measured_ms"]]
    return statistics.fmean(abs(p - m) / m for m, p in pairs) if pairs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny CNNs, shorter runs")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    ap.add_argument("--work", type=Path, help="work directory; one already prepared by a --keep run (models "
                    "compiled, profiled and published) is reused as it is, profiles included")
    args = ap.parse_args()
    from edgeplan.runtime import pull

    work = args.work or Path(tempfile.mkdtemp(prefix="edgeplan-bench-runtime-"))
    keep = args.keep or args.work is not None
    try:
        zoo = MODELS["quick" if args.quick else "full"]
        params, store, trusted = prepare(work, zoo, args.quick)
        from edgeplan.store import open_store

        dests = {d: work / f"device-{d}" for d in ("single", "multi")}
        for d, dest in dests.items():
            pull(open_store(store), dest, trusted, deployment=d)
        duration = 6.0 if args.quick else 30.0  # per configuration, over its repeats
        runs = validation(dests["single"], duration) + validation(dests["multi"], duration)
        single = [r for run in runs if run["deployment"] == "single" for r in run["rows"]]
        multi = [r for run in runs if run["deployment"] == "multi" for r in run["rows"]]
        tp = throughput(dests["single"], 2.0 if args.quick else 3.0, 4 if args.quick else 12)
        sw = switches(dests["multi"])
        rp = repull(work, params, store, trusted, dests["single"])
    finally:
        if keep:
            print(f"[bench] work directory kept: {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "quick": args.quick, "machine": machine(), "models": {"a": f"zoo:{zoo[0]}", "b": f"zoo:{zoo[1]}"},
        "mape_single": mape(single, "predicted_ms"), "mape_multi": mape(multi, "predicted_ms"),
        "sim_mape_single": mape(single, "simulated_ms"), "sim_mape_multi": mape(multi, "simulated_ms"),
        "mape_single_model_only": mape(single, "model_ms"), "mape_multi_model_only": mape(multi, "model_ms"),
        "mape_single_from_profile": mape(single, "predicted_from_profile_ms"),
        "mape_multi_from_profile": mape(multi, "predicted_from_profile_ms"),
        "suffix_cores": SUFFIX_CORES,
        "throughput_ratio_vs_bare": tp["throughput_ratio_vs_bare"],
        "failed_requests_during_switches": sw["failed_requests_during_switches"],
        "repull_bytes_over_changed_bytes": rp["repull_bytes_over_changed_bytes"],
        "runs": runs, "throughput": tp, "switches": sw, "repull": rp, "duration_s": duration,
        "source": "latency measured through the runtime on this 2-vCPU machine: Edge TPU EMULATED (modelled "
                  "service time held by the accelerator worker on its own FCFS clock), CPU suffixes real (LiteRT, "
                  "XNNPACK) on SUFFIX_CORES cores; predictions from the refined analytic model and the simulator "
                  "with the suffix times the runtime timed in the same run (mape_*), and from the bundle's profile "
                  "scaled by the speed probe (mape_*_from_profile)",
    }
    publish("runtime_validation", result, plot, ("mape_single", "mape_multi", "mape_single_from_profile",
                                                 "mape_multi_from_profile", "throughput_ratio_vs_bare",
                                                 "failed_requests_during_switches", "repull_bytes_over_changed_bytes"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6))
    for dep, marker in (("single", "o"), ("multi", "s")):
        rows = [r for run in result["runs"] if run["deployment"] == dep for r in run["rows"] if r["measured_ms"]]
        ax.scatter([r["measured_ms"] for r in rows], [r["predicted_ms"] for r in rows], marker=marker,
                   label=f"{dep}: analytic (refined)")
        ax.scatter([r["measured_ms"] for r in rows], [r["simulated_ms"] for r in rows], marker=marker,
                   facecolors="none", edgecolors="gray", label=f"{dep}: simulator")
        ax.scatter([r["measured_ms"] for r in rows], [r["predicted_from_profile_ms"] for r in rows], marker="x",
                   label=f"{dep}: analytic, the bundle's profile (probe-scaled)")
    lim = max([1.0] + [r["measured_ms"] for run in result["runs"] for r in run["rows"] if r["measured_ms"]]) * 1.1
    ax.plot([0.5, lim], [0.5, lim], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured mean latency through the runtime, ms")
    ax.set_ylabel("predicted mean latency, ms")
    ax.set_title(f"runtime vs refined model (EMULATED Edge TPU, real CPU suffixes on {result['suffix_cores']} core)\n"
                 f"MAPE with the suffix times served: single {result['mape_single']:.1%}, multi "
                 f"{result['mape_multi']:.1%}; from the profile: {result['mape_single_from_profile']:.1%} / "
                 f"{result['mape_multi_from_profile']:.1%}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
