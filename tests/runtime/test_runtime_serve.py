"""Serving a pulled revision (tiny_cnn; EMULATED Edge TPU with real CPU suffixes): correct outputs at every
point in every accelerator mode, switching points and cores under load without a failed request, the
allocator re-planning as rates move, the HTTP API (npy, JSON, 400/404/503, metrics), loadgen, and the thin
import boundary."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from edgeplan.runtime import Overloaded, Runtime, pull
from edgeplan.runtime import loadgen
from edgeplan.runtime.model import dequantize_output, load_inputs, quantize_input
from edgeplan.runtime.server import serve
from edgeplan.store import open_store


@pytest.fixture
def device(published, tmp_path):
    dest = tmp_path / "dev"
    pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    return dest


def expected(rt: Runtime, k: int = 0):
    entry = rt.manifest.models[0]
    t = entry.selftests[k]
    x = np.load(rt.rev_dir / t.input)
    return x, dequantize_output(np.load(rt.rev_dir / t.expected), entry.output)


@pytest.mark.parametrize("mode", ["emulated", "cpu"])
def test_outputs_match_the_bundle_at_every_point(device, mode):
    with Runtime(device, mode=mode, adapt=False) as rt:
        name = rt.order[0]
        m = rt.models[name]
        x, want = expected(rt)
        scale = rt.manifest.models[0].output.scale
        rt.precompute(name, [x], points="all")
        for p in range(m.last + 1):
            rt.configure({name: p}, {name: 1})
            y = rt.infer(name, x)
            # XNNPACK's int8 kernels (what the device serves with) may round one step off the reference kernels
            assert y.shape == want.shape and np.max(np.abs(y - want)) <= 2 * scale + 1e-6, (mode, p)
            # a client that quantized the input itself (the int8 model's dtype and layout): taken as it is
            q = quantize_input(x, rt.manifest.models[0].input)
            assert q.dtype == np.int8 and np.array_equal(rt.infer(name, q), y), (mode, p)
        assert rt.accelerator.cpu_fallbacks == 0
        # every point with a suffix ran it twice on the pool, timed
        served = rt.status()["models"][name]["suffix_service_ms"]
        assert sorted(served) == list(range(m.last)) and all(v > 0 for v in served.values())
        assert all(len(v) == 2 for v in rt.service_times(name).values())


def test_switches_under_load_lose_no_request(device):
    """100 switches of point and cores while an open-loop load runs: every request answered."""
    with Runtime(device, adapt=False, max_inflight=10_000) as rt:
        name = rt.order[0]
        last = rt.models[name].last
        xs = load_inputs(rt.rev_dir, rt.manifest.models[0], 4)
        rt.precompute(name, xs, points="all")
        stop = threading.Event()

        def switcher():
            k = 0
            while not stop.is_set() and k < 100:
                rt.configure({name: k % (last + 1)}, {name: 1 + k % rt.plan.cores}, "test")
                k += 1
                time.sleep(0.02)

        t = threading.Thread(target=switcher)
        t.start()
        records = loadgen.run(rt, {name: 150.0}, 3.0, {name: xs}, seed=3)
        stop.set()
        t.join()
        assert rt.switches >= 100
        assert records and all(r.status == 200 for r in records), loadgen.summary(records)


def test_emulated_accelerator_is_fcfs_on_its_own_clock(device):
    """A burst at the all-accelerator point: the EMULATED device serves it one prefix at a time in arrival
    order, each held at least its modelled time (lower bounds only: a slow machine cannot fail this)."""
    with Runtime(device, adapt=False) as rt:
        name = rt.order[0]
        m = rt.models[name]
        xs = load_inputs(rt.rev_dir, rt.manifest.models[0], 3)
        rt.precompute(name, xs, points="all")
        rt.configure({name: m.last}, {name: 0})
        shortest = min(m.spec.tpu_samples[m.last] or [m.spec.s_tpu[m.last]]) + m.spec.io[m.last]
        done, t0 = [], time.perf_counter()
        futs = [rt.submit(name, xs[i % 3]) for i in range(8)]
        for i, f in enumerate(futs):
            f.add_done_callback(lambda f, i=i: done.append((i, time.perf_counter())))
        for f in futs:
            f.result(30)
        assert [i for i, _ in done] == list(range(8))  # FCFS
        assert all(t - t0 >= (i + 1) * shortest for i, t in done)  # one at a time, each held
        assert rt.accelerator.cpu_fallbacks == 0


def test_reallocation_follows_the_rates(device):
    with Runtime(device, adapt=False) as rt:
        name = rt.order[0]
        best = (dict(rt.points), dict(rt.cores))  # tiny_cnn: all on the CPU at any rate (its suffixes are tiny)
        assert not rt.reallocate({name: 40.0})  # the plan's configuration is kept
        rt.configure({name: rt.models[name].last}, {name: 1})  # everything on the (EMULATED) Edge TPU
        assert rt.reallocate({name: 40.0}) and (rt.points, rt.cores) == best  # the allocator moves it back
        assert rt.switch_log[-1]["why"].startswith("rates")
        x, want = expected(rt)
        assert rt.infer(name, x).shape == want.shape


def test_online_search_starts_from_the_point_in_use_and_the_nearest_regime(device):
    """The allocator's warm starts: the partitioning in use, then the plan's rate regime nearest the rates; a
    regime that does not fit the served models (read from the bundle) is passed over."""
    from dataclasses import replace

    from edgeplan.plan.swapless.plan import Regime

    with Runtime(device, adapt=False) as rt:
        name = rt.order[0]
        last = rt.models[name].last
        rt.configure({name: last}, {name: 0})
        rt.plan = replace(rt.plan, regimes=(Regime((1.0,), (0,), (1,), 1.0), Regime((100.0,), (1,), (1,), 1.0),
                                            Regime((90.0,), (last + 5,), (1,), 1.0),
                                            Regime((-80.0,), (0,), (1,), 1.0), Regime((80.0,), ("1",), (1,), 1.0),
                                            Regime((80.0, 80.0), (0, 0), (1, 1), 1.0)))
        assert rt.warm_starts({name: 80.0}) == [(last,), (1,)]
        assert rt.warm_starts({name: 2.0}) == [(last,), (0,)]


def test_adapt_loop_runs_the_allocator(device):
    with Runtime(device, adapt=True, window_s=1.0, interval_s=0.2) as rt:
        name = rt.order[0]
        xs = load_inputs(rt.rev_dir, rt.manifest.models[0], 4)
        rt.precompute(name, xs, points="all")
        records = loadgen.run(rt, {name: 200.0}, 2.0, {name: xs})
        rate = rt.monitor.rates()[name]
        assert 100 < rate < 300, rate  # the window saw the load (Poisson, 1 s window)
        assert rt.allocations >= 5  # the allocator ran every 0.2 s with the measured rates
        assert all(r.status == 200 for r in records)
        assert "edgeplan_request_rate" in rt.metrics_text()


def test_overload_answers_503(device):
    with Runtime(device, adapt=False, max_inflight=1) as rt:
        name = rt.order[0]
        x, _ = expected(rt)
        futs, refused = [], 0
        for _ in range(50):
            try:
                futs.append(rt.submit(name, x))
            except Overloaded:
                refused += 1
        assert refused > 0 and all(f.result(30) is not None for f in futs)
        assert 'code="503"' in rt.metrics_text()


def test_latency_admission_turns_requests_away_only_past_capacity(device):
    """All-accelerator point (the EMULATED device's clock: one prefix at a time, ~600 a second): a burst of 8
    just after start-up is below capacity and all served; 3,000 submitted at once offer more than capacity
    within the 1 s window, and from then on a request that would wait past its budget gets Overloaded with a
    time to retry after."""
    with Runtime(device, adapt=False, max_inflight=100_000) as rt:
        name = rt.order[0]
        last = rt.models[name].last
        xs = load_inputs(rt.rev_dir, rt.manifest.models[0], 3)
        rt.precompute(name, xs, points="all")
        rt.configure({name: last}, {name: 0})
        assert all(f.result(30) is not None for f in [rt.submit(name, xs[i % 3]) for i in range(8)])
        capacity = rt.capacity_rps(name)
        futs, refusals = [], []
        for i in range(3000):
            try:
                futs.append(rt.submit(name, xs[i % 3]))
            except Overloaded as e:
                refusals.append((i, e))
        assert refusals and refusals[0][0] + 9 > capacity  # none before the window held more than capacity (the 8,
        # the ones before it and itself)
        assert all(e.retry_after_s > 0 and "budget" in str(e) for _, e in refusals)
        assert all(f.result(60) is not None for f in futs)
        assert f'edgeplan_latency_budget_seconds{{model="{name}"}}' in rt.metrics_text()


def test_http_api(device):
    rt = Runtime(device, adapt=False, max_inflight=64).start()
    server = serve(rt, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        name = rt.order[0]
        x, want = expected(rt)
        scale = rt.manifest.models[0].output.scale

        def post(path, body, ctype):
            req = urllib.request.Request(url + path, data=body, method="POST", headers={"Content-Type": ctype})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, r.headers, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.headers, e.read()

        buf = io.BytesIO()
        np.save(buf, x)
        code, headers, body = post(f"/infer/{name}", buf.getvalue(), "application/x-npy")
        assert code == 200 and headers["Content-Type"] == "application/x-npy"
        assert np.max(np.abs(np.load(io.BytesIO(body)) - want)) <= 2 * scale + 1e-6
        code, _, body = post(f"/infer/{name}", json.dumps({"input": x.tolist()}).encode(), "application/json")
        out = json.loads(body)
        assert code == 200 and out["revision"] == 1 and np.asarray(out["output"]).shape == want.shape
        code, _, body = post(f"/infer/{name}", b"not json", "application/json")
        assert code == 400 and "neither .npy" in json.loads(body)["error"]
        code, _, body = post(f"/infer/{name}", json.dumps({"input": [[1, 2], [3, 4]]}).encode(), "application/json")
        assert code == 400 and "input shape" in json.loads(body)["error"]
        code, _, body = post("/infer/nope", b"{}", "application/json")
        assert code == 404 and name in json.loads(body)["error"]
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            health = json.loads(r.read())
        assert health["status"] == "ok" and health["revision"] == 1
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert f'edgeplan_request_latency_seconds_count{{model="{name}"}} 2' in metrics
        assert 'edgeplan_active_revision{deployment="solo",mode="emulated"} 1' in metrics
        assert f'edgeplan_partition_point{{model="{name}"}}' in metrics
        # open-loop load over HTTP
        records = loadgen.run(url, {name: 40.0}, 1.0, {name: load_inputs(rt.rev_dir, rt.manifest.models[0], 3)})
        assert records and all(r.status == 200 and r.latency_ms > 0 for r in records)
    finally:
        server.shutdown()
        rt.stop()


def test_malformed_requests_get_4xx_not_5xx_or_silence(device):
    """Regression (reliability campaign 5, bad requests, seed 2030): before, 54 of 150 malformed requests got a
    5xx (complex or object .npy, a .npy header claiming 4 TB, deep JSON, 10**400, other methods), no answer (a
    Content-Length that is not a number, bytes that are not HTTP) or a 200 (NaN and infinities); a slow sender
    held a thread for ever."""
    import socket

    rt = Runtime(device, mode="cpu", adapt=False).start()
    server = serve(rt, "127.0.0.1", 0, request_timeout_s=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, name = server.server_address[1], rt.order[0]
    shape = rt.manifest.models[0].input.float_shape

    def send(raw: bytes, then: bytes = b"") -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(raw)
            if then:
                time.sleep(0.1)
                s.sendall(then)
            data = b""
            while b"\r\n" not in data and (chunk := s.recv(4096)):
                data += chunk
        return int(data.split()[1])

    def post(body: bytes, ctype="application/x-npy", length=None) -> int:
        n = len(body) if length is None else length
        return send(f"POST /infer/{name} HTTP/1.1\r\nContent-Type: {ctype}\r\nContent-Length: {n}\r\n"
                    "Connection: close\r\n\r\n".encode() + body)

    def npy(a) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=True)
        return buf.getvalue()

    try:
        nan = np.zeros(shape, np.float32)
        nan.reshape(-1)[3] = np.nan
        header = repr({"descr": "<f4", "fortran_order": False, "shape": (1, 3, 10**6, 10**6)}).encode()
        header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
        lying = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 64
        assert post(npy(nan)) == 400
        assert post(npy(np.full(shape, np.inf, np.float32))) == 400
        assert post(npy(np.zeros(shape, np.complex64))) == 400
        assert post(npy(np.array([{"a": 1}], object))) == 400
        assert post(lying) == 400
        assert post(b"[" * 100000, "application/json") == 400
        assert post(b'{"input": [' + b"1" * 400 + b"]}", "application/json") == 400
        assert post(b"{}", length="abc") == 400
        assert send(f"DELETE /infer/{name} HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode()) == 405
        assert send(b"HELLO\r\n\r\n") == 400
        assert send(b"POST /infer/x HTTP/9.9\r\n\r\n") == 400
        assert send(f"POST /infer/{name} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()) == 411
        t0 = time.monotonic()
        assert post(b"\x93NUM", length="100") == 408 and time.monotonic() - t0 < 5  # never finished: let go
        assert post(npy(np.zeros(shape, np.float32))) == 200
    finally:
        server.shutdown()
        rt.stop()


THIN = r'''
import importlib.abc, sys
BLOCKED = ("tensorflow", "onnx", "onnx_graphsurgeon", "onnxruntime", "prefect", "ortools", "xgboost", "dvc",
           "keras", "tf_keras", "yaml", "rich")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"heavy import blocked: {name}")
sys.meta_path.insert(0, Block())
from pathlib import Path
from edgeplan.bundle.keys import load_trusted
from edgeplan.runtime import Runtime, pull
from edgeplan.runtime.model import load_inputs
from edgeplan.store import open_store
store, dest, trusted = sys.argv[1], Path(sys.argv[2]), load_trusted([sys.argv[3]])
res = pull(open_store(store), dest, trusted, device_id="edge-7")
with Runtime(dest, adapt=False) as rt:
    name = rt.order[0]
    xs = load_inputs(rt.rev_dir, rt.manifest.models[0], 3)
    rt.precompute(name, xs)
    ys = [rt.infer(name, x) for x in xs]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not heavy, heavy
print("thin", res.revision, len(ys))
'''


def test_runtime_imports_nothing_heavy(published, tmp_path):
    proc = subprocess.run([sys.executable, "-c", THIN, published.store_uri, str(tmp_path / "dev"),
                           str(published.trusted_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "thin 1 3" in proc.stdout, proc.stderr[-3000:]


def test_serve_cli_follows_new_revisions_and_survives_a_store_outage(published, device, tmp_path):
    """`edgeplan-runtime serve --store`: a new revision is pulled and served without a restart; while the
    store is gone the active revision keeps answering."""
    import os
    import re
    import shutil
    import signal
    from pathlib import Path

    env = {**os.environ, "EDGEPLAN_TRUSTED_KEYS": str(published.trusted_dir)}
    proc = subprocess.Popen([sys.executable, "-u", "-m", "edgeplan.runtime.cli", "serve", str(device), "--port", "0",
                             "--no-adapt", "--store", published.store_uri, "--device-id", "edge-7", "--pull-every",
                             "0.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
        url = re.search(r"http://[\d.]+:\d+", line).group(0)

        def revision():
            with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
                return json.loads(r.read())["revision"]

        assert revision() == 1
        store = Path(published.store_uri)
        shutil.move(store, tmp_path / "away")  # the store is gone
        time.sleep(1.5)
        assert revision() == 1 and proc.poll() is None
        shutil.move(tmp_path / "away", store)
        published.second_revision()
        deadline = time.time() + 60
        while revision() != 2 and time.time() < deadline:
            time.sleep(0.3)
        assert revision() == 2
        name = "tiny_cnn"
        x = np.zeros((1, 3, 32, 32), np.float32)
        req = urllib.request.Request(f"{url}/infer/{name}", data=json.dumps({"input": x.tolist()}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["revision"] == 2
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    assert "still serving revision 1" in proc.stderr.read()


def test_loadgen_cli_in_process(device, tmp_path):
    """`edgeplan-runtime loadgen DIR --rate M=R` with no --url serves in its own process and writes every request."""
    out = tmp_path / "requests.csv"
    proc = subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", "loadgen", str(device), "--rate",
                           "tiny_cnn=40", "--duration", "1", "--no-adapt", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout)["tiny_cnn"]
    lines = out.read_text().splitlines()
    assert lines[0] == "model,scheduled_s,latency_ms,status,lag_ms" and len(lines) - 1 == stats["requests"] > 10
    assert stats["failed"] == 0 and stats["mean_ms"] > 0


def test_serve_cli_stops_on_sigterm_after_answering_what_it_accepted(device):
    """`edgeplan-runtime serve` stopped by SIGTERM (what systemd and `docker stop` send) stops as Ctrl-C does: no
    new connections, the requests in flight answered, the runtime stopped, exit 0 with a line saying so."""
    import os
    import re
    import signal

    proc = subprocess.Popen([sys.executable, "-u", "-m", "edgeplan.runtime.cli", "serve", str(device), "--port", "0",
                             "--no-adapt"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, proc.stderr.read()[-3000:]
        url = re.search(r"http://[\d.]+:\d+", line).group(0)
        x = json.dumps({"input": np.zeros((1, 3, 32, 32), np.float32).tolist()}).encode()
        outcomes: list[str] = []

        def ask():
            req = urllib.request.Request(f"{url}/infer/tiny_cnn", data=x, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    json.loads(r.read())["output"]
                    outcomes.append("answered")
            except urllib.error.URLError as e:
                # refused once the listening socket is closed: the request was never accepted
                outcomes.append("refused" if isinstance(e.reason, ConnectionRefusedError) else f"broken: {e!r}")
            except Exception as e:  # a reset or a truncated answer: an accepted request cut
                outcomes.append(f"broken: {e!r}")

        ask()
        assert outcomes == ["answered"]
        threads = [threading.Thread(target=ask) for _ in range(16)]
        for t in threads:
            t.start()
        time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=30)
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = proc.stdout.read()
    assert code == 0, proc.stderr.read()[-3000:]
    assert "stopped serving" in out and "cut" not in out
    assert len(outcomes) == 17 and not [o for o in outcomes if o.startswith("broken")], outcomes
