"""Open-loop Poisson load: per model, arrivals at exponential gaps at a given rate for a given time, over a
finite set of inputs (a slow server does not slow the load down); every request's latency recorded from the
moment it was sent, and how late the generator sent it (``lag_ms``: the OS wakes a sleeping thread late;
a lag that grows means the generator, not the server, fell behind). Targets: a Runtime in this process, or
an HTTP URL."""
from __future__ import annotations

import io
import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class Record:
    model: str
    scheduled: float  # s since the load started
    latency_ms: float | None  # from the send; None: failed
    status: int  # 200, 503, 500, ...
    lag_ms: float = 0.0  # sent this late after its scheduled time


def schedule(rates: dict[str, float], duration_s: float, seed: int = 0) -> list[tuple[float, str]]:
    """The merged Poisson arrival times [(t, model)] over ``duration_s``."""
    rng = random.Random(seed)
    out = []
    for model, rate in rates.items():
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= duration_s:
                break
            out.append((t, model))
    return sorted(out)


def _post(url: str, model: str, x: np.ndarray, timeout: float) -> int:
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    req = urllib.request.Request(f"{url.rstrip('/')}/infer/{model}", data=buf.getvalue(), method="POST",
                                 headers={"Content-Type": "application/x-npy"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def run(target, rates: dict[str, float], duration_s: float, inputs: dict[str, list[np.ndarray]], seed: int = 0,
        timeout_s: float = 120.0, max_outstanding: int = 512, progress=None) -> list[Record]:
    """Send the load to ``target`` (a Runtime, or an http:// URL) and wait for every answer."""
    arrivals = schedule(rates, duration_s, seed)
    rng = random.Random(seed + 1)
    records: list[Record] = []
    lock = threading.Lock()
    done = threading.Semaphore(0)
    http = isinstance(target, str)
    pool = ThreadPoolExecutor(max_workers=max_outstanding) if http else None
    t0 = time.perf_counter()

    def record(model, at, sent, status):
        lat = 1e3 * (time.perf_counter() - sent) if status == 200 else None
        with lock:
            records.append(Record(model, at, lat, status, 1e3 * (sent - t0 - at)))
        done.release()

    for at, model in arrivals:
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        x = rng.choice(inputs[model])
        sent = time.perf_counter()
        if http:
            pool.submit(lambda m=model, a=at, x=x, s=sent: record(m, a, s, _post(target, m, x, timeout_s)))
        else:
            try:
                fut = target.submit(model, x)
            except Exception as e:  # noqa: BLE001 - Overloaded / BadRequest: counted, the load goes on
                record(model, at, sent, 503 if type(e).__name__ == "Overloaded" else 400)
                continue
            fut.add_done_callback(lambda f, m=model, a=at, s=sent: record(m, a, s, 200 if f.exception() is None else 500))
        if progress:
            progress(1)
    for _ in arrivals:
        done.acquire(timeout=timeout_s)
    if pool:
        pool.shutdown(wait=True)
    return sorted(records, key=lambda r: r.scheduled)


def summary(records: list[Record]) -> dict:
    out = {}
    for model in sorted({r.model for r in records}):
        lat = np.array([r.latency_ms for r in records if r.model == model and r.latency_ms is not None])
        failed = sum(1 for r in records if r.model == model and r.status != 200)
        out[model] = {"requests": sum(1 for r in records if r.model == model), "failed": failed,
                      "mean_ms": float(lat.mean()) if lat.size else None,
                      "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                      "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
                      "send_lag_ms_median": float(np.median([r.lag_ms for r in records if r.model == model]))}
    return out


def write(records: list[Record], path) -> None:
    """JSON lines, one request each (or CSV when the path ends in .csv)."""
    with open(path, "w") as f:
        if str(path).endswith(".csv"):
            f.write("model,scheduled_s,latency_ms,status,lag_ms\n")
            f.writelines(f"{r.model},{r.scheduled:.6f},{'' if r.latency_ms is None else f'{r.latency_ms:.4f}'},"
                        f"{r.status},{r.lag_ms:.4f}\n" for r in records)
        else:
            f.writelines(json.dumps(asdict(r)) + "\n" for r in records)
