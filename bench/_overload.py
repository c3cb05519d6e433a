"""Campaign 5 of bench/reliability.py, its overload half: a real ``edgeplan-runtime serve`` process held at twice
its capacity, open loop, on loopback.

The deployment: ResNet50V2 at 224x224 (int8: 11-110 ms an inference on one core, by host, heavy enough that the model,
not the HTTP layer, is what saturates) compiled, profiled and planned by the CLI for a CPU-only device class of
one core (no Edge TPU: no EMULATED figure enters; the profile keeps this machine's raw CPU times, so the plan
predicts this machine), published to a local store and pulled by ``edgeplan-runtime pull``. Requests carry the
int8 model's input tensor (``.npy``, 147 KB: a client that quantized it, as a camera pipeline would).

1. Capacity: a serve without latency admission (``--latency-budget 0``), three closed-loop clients for
   ``CAPACITY_S``: the 200s a second it sustains.
2. Overload: a fresh serve with its defaults, Poisson arrivals (seeded) at twice that capacity for the run's
   length, every request sent at its time whatever the answers (asyncio, one connection per request). Each
   answer's status, Retry-After, Server-Timing and the client's own latency (from the request's scheduled time,
   so a client falling behind counts against the server) are kept; the server's VmRSS is read from /proc every
   ``RSS_EVERY_S``.

Promise (judged from the client's own clocks and plain reads of the bundle's plan and /proc): accepted requests'
p99 within twice the plan's predicted latency; every other answer a 503 with a Retry-After of whole seconds
>= 1 (none unanswered, no other status); RSS growth under 50 MB from the overload's start to its end; the
server alive and answering /healthz after it.
"""
from __future__ import annotations

import asyncio
import io
import json
import math
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _bad_requests import rss_mb, start_serve
from _faults import EDGEPLAN, _run

from edgeplan.pipeline.local_server import _terminate as stop

MODEL = "resnet50v2_224"
CLASS = "cpu-1core"
DEPLOYMENT = "overload"
DEVICE = "edge-9"
LOAD = 0.44  # the deployment's planned rate as a fraction of the profile's one-core capacity (1000 / median ms):
# the plan's prediction is its latency at that rate. A fraction, not a fixed rate: the same int8 ResNet50V2 took
# 11 ms on the host of 2026-11-25 and 89-110 ms on the AVX2-only host of 2026-11-26, where a fixed 40/s could not
# be planned at all
CAPACITY_S = 20.0
RSS_EVERY_S = 5.0
WINDOW_S = 10.0  # the plot's windows
RSS_LIMIT_MB = 50.0
P99_LIMIT = 2.0  # x the plan's predicted latency
SERVE = ("--no-adapt", "--inputs", "1")  # the plan's configuration as it is; no load-test set to compute ahead


# ---------------------------------------------------------------------------------------------- the deployment
def prepare(work: Path, scratch: Path, env: dict) -> Path:
    """The device directory (revision 1 of deployment ``overload`` pulled and active); the compiled model is
    kept under ``work`` between runs, the store and the device directory are made anew in ``scratch``."""
    import yaml

    from edgeplan.pipeline import params as params_mod

    arts = work / "artifacts"
    arts.mkdir(parents=True, exist_ok=True)
    p = params_mod.load(None)
    p["fleet"]["device_classes"][CLASS] = {"cpu": "measured", "cores": 1, "ram_bytes": 2 << 30,
                                           "accelerator": {"kind": "none"}}  # no cpu_probe_ms: raw times
    p["fleet"]["devices"] = [{"id": DEVICE, "device_class": CLASS, "deployment": DEPLOYMENT, "work_pool": CLASS}]
    p["deployments"] = [{"name": DEPLOYMENT, "device_class": CLASS,
                         "models": [{"name": MODEL, "version": "1", "rate": 1.0}]}]  # its rate: once profiled
    params = work / "params_overload.yaml"
    params.write_text(yaml.safe_dump(p))
    d = arts / MODEL / "1"
    if not (d / "verify.json").is_file():
        _run([*EDGEPLAN, "compile", f"zoo:{MODEL}", "--name", MODEL, "--version", "1", "--out", str(arts)], env)
    prof = d / "profiles" / f"{CLASS}.json"
    prof.unlink(missing_ok=True)  # measured anew: the machine's speed today is what the serve will show
    _run([*EDGEPLAN, "--params", str(params), "profile", "run", str(d), "--device-class", CLASS], env)
    p["deployments"][0]["models"][0]["rate"] = planned_rate(prof)
    params.write_text(yaml.safe_dump(p))
    _run([*EDGEPLAN, "--params", str(params), "plan", "swapless", "--deployment", DEPLOYMENT, "--out", str(arts)], env)
    keys, store, dest = scratch / "overload-keys", scratch / "overload-store", scratch / "overload-device"
    _run([*EDGEPLAN, "keys", "generate", "--out", str(keys)], env)
    _run([*EDGEPLAN, "--params", str(params), "publish", "--deployment", DEPLOYMENT, "--store", str(store), "--key",
          str(next(keys.glob("*.key"))), "--artifacts", str(arts)], env)
    _run([sys.executable, "-m", "edgeplan.runtime.cli", "pull", str(store), "--device-id", DEVICE, "--dest",
          str(dest), "--trusted", str(next(keys.glob("*.pub")))], env)
    return dest


def planned_rate(profile: Path) -> float:
    """``LOAD`` of the one-core capacity the profile measured for the whole model (point 0's CPU segment), 1/s,
    rounded to 0.1 (read as plain JSON)."""
    prof = json.loads(profile.read_text())
    whole = next(s for s in prof["segments"] if s["point"] == 0 and s["status"] == "ok")
    ms = next(float(c["median_ms"]) for c in whole["cpu"] if c["threads"] == 1)
    return max(0.1, round(LOAD * 1000.0 / ms, 1))


def predicted_ms(dest: Path) -> float:
    """The plan's predicted latency of the model, read as plain JSON from the active revision."""
    rev = (dest / "current").resolve()
    manifest = json.loads((rev / "manifest.json").read_text())
    plan = json.loads((rev / manifest["plan"]).read_text())
    return next(float(m["predicted_latency_ms"]) for m in plan["models"] if m["name"] == MODEL)


def body(dest: Path, seed: int) -> bytes:
    """A request: a seeded int8 tensor of the int8 model's input, as ``.npy``."""
    manifest = json.loads(((dest / "current").resolve() / "manifest.json").read_text())
    q = next(m for m in manifest["models"] if m["name"] == MODEL)["input"]
    x = np.random.default_rng(seed).integers(-128, 128, size=q["shape"], dtype=np.int8)
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- the client
async def _exchange(port: int, payload: bytes) -> dict:
    """One POST on its own connection: the answer's status and headers (names lower-cased)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /infer/" + MODEL.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/x-npy\r\nContent-Length: " + str(len(payload)).encode()
                     + b"\r\nConnection: close\r\n\r\n" + payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        await reader.readexactly(int(headers.get("content-length", 0)))
        return {"status": int(lines[0].split()[1]), "headers": headers}
    finally:
        writer.close()


async def _open_loop(port: int, payload: bytes, rate: float, seconds: float, seed: int, timeout_s: float) -> list:
    """Poisson arrivals at ``rate`` for ``seconds``, each sent at its time (one task a request)."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    t0, at, rows, tasks = loop.time(), 0.0, [], []

    async def one(due: float) -> None:
        row = {"t": due, "lag_s": loop.time() - t0 - due}
        try:
            got = await asyncio.wait_for(_exchange(port, payload), timeout_s)
            row.update(status=got["status"], retry_after=got["headers"].get("retry-after"),
                       server_ms=_server_ms(got["headers"].get("server-timing")))
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            row.update(status=None, error=f"{type(e).__name__}: {e}"[:200])
        row["latency_s"] = loop.time() - t0 - due
        rows.append(row)

    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at)))
    await asyncio.gather(*tasks)
    return sorted(rows, key=lambda r: r["t"])


def _server_ms(timing: str | None) -> float | None:
    """``infer;dur=12.3`` -> 12.3."""
    for part in (timing or "").split(";"):
        if part.strip().startswith("dur="):
            return float(part.strip()[4:])
    return None


def _closed_loop(port: int, payload: bytes, clients: int, seconds: float) -> dict:
    """``clients`` threads sending back to back for ``seconds``: the statuses they got."""
    counts: dict = {}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < end:
            try:
                status = asyncio.run(_exchange(port, payload))["status"]
            except OSError:
                status = None
            with lock:
                counts[status] = counts.get(status, 0) + 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) if xs else math.nan


# ---------------------------------------------------------------------------------------------- the campaign
def run_overload(work: Path, scratch: Path, env: dict, seconds: float, seed: int) -> dict:
    dest = prepare(work, scratch, env)
    predicted = predicted_ms(dest)
    payload = body(dest, seed)
    proc, port = start_serve(dest, env, scratch / "serve-capacity.stderr", *SERVE, "--latency-budget", "0")
    try:
        _closed_loop(port, payload, 2, 3.0)  # warm-up
        counts = _closed_loop(port, payload, 3, CAPACITY_S)
    finally:
        stop(proc)
    capacity = counts.get(200, 0) / CAPACITY_S
    offered = 2 * capacity
    print(f"[reliability] overload: capacity {capacity:.1f} req/s (closed loop, no admission); plan predicts "
          f"{predicted:.2f} ms; {seconds:g} s at {offered:.1f} req/s ...", flush=True)
    proc, port = start_serve(dest, env, scratch / "serve-overload.stderr", *SERVE)
    samples: list = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while proc.poll() is None:
            samples.append((time.monotonic() - t0, rss_mb(proc.pid)))
            if done.wait(RSS_EVERY_S):
                break

    try:
        _closed_loop(port, payload, 1, 3.0)  # warm-up: the pool's interpreter built, its service time measured
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rows = asyncio.run(_open_loop(port, payload, offered, seconds, seed, timeout_s=60.0))
        done.set()
        sampler.join()
        samples.append((samples[-1][0] if samples else 0.0, rss_mb(proc.pid)))
        alive = proc.poll() is None and _healthz(port)
    finally:
        stop(proc)
    return judge(rows, samples, predicted, capacity, offered, seconds, alive, seed)


def _healthz(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def judge(rows: list, samples: list, predicted: float, capacity: float, offered: float, seconds: float,
          alive: bool, seed: int) -> dict:
    ok = [r for r in rows if r["status"] == 200]
    refused = [r for r in rows if r["status"] == 503]
    bad_refusals = [r for r in refused if not (r["retry_after"] or "").isdigit() or int(r["retry_after"]) < 1]
    other = [r for r in rows if r["status"] not in (200, 503)]
    client_p99 = 1e3 * p99([r["latency_s"] for r in ok])
    server_p99 = p99([r["server_ms"] for r in ok if r["server_ms"] is not None])
    growth = samples[-1][1] - samples[0][1]
    violations = []
    if not client_p99 <= P99_LIMIT * predicted:
        violations.append(f"accepted p99 {client_p99:.1f} ms over {P99_LIMIT:g}x the predicted {predicted:.2f} ms")
    if bad_refusals:
        violations.append(f"{len(bad_refusals)} 503s without a Retry-After of whole seconds >= 1")
    if other:
        violations.append(f"{len(other)} answers neither 200 nor 503: "
                          f"{sorted({str(r['status']) for r in other})}, e.g. {other[0].get('error')}")
    if not growth < RSS_LIMIT_MB:
        violations.append(f"RSS grew {growth:.1f} MB")
    if not alive:
        violations.append("the server died or stopped answering /healthz")
    windows = []
    for w in range(math.ceil(seconds / WINDOW_S)):
        inside = [r for r in rows if w * WINDOW_S <= r["t"] < (w + 1) * WINDOW_S]
        lat = [1e3 * r["latency_s"] for r in inside if r["status"] == 200]
        windows.append({"t": w * WINDOW_S, "offered_rps": len(inside) / WINDOW_S, "accepted_rps": len(lat) / WINDOW_S,
                        "p99_ms": p99(lat) if lat else None, "median_ms": statistics.median(lat) if lat else None})
    return {"seed": seed, "seconds": seconds, "capacity_rps": capacity, "offered_rps": offered,
            "sent": len(rows), "accepted": len(ok), "refused_503": len(refused), "bad_refusals": len(bad_refusals),
            "other_answers": len(other), "other_examples": other[:5], "predicted_ms": predicted,
            "p99_ms": client_p99, "p99_server_ms": server_p99,
            "median_ms": 1e3 * statistics.median([r["latency_s"] for r in ok]) if ok else None,
            "client_lag_p99_ms": 1e3 * p99([r["lag_s"] for r in rows]),
            "goodput_rps": len(ok) / seconds, "retry_after_s": sorted({r["retry_after"] for r in refused}),
            "rss_mb": samples, "rss_growth_mb": growth, "crashed": not alive, "violations": violations,
            "windows": windows}
