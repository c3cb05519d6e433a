"""``edgeplan-runtime serve --stream``: serve the active revision's models streamed as their FlashMem plans say
(FlashMem §2.2: models that are not kept resident). One request at a time, in arrival order: each reads its
model's segments from the revision's blobs, builds and runs them in the planned shadows and drops them, so the
process holds one model's planned residency at a time instead of every model. The same HTTP API as
``serve`` (``runtime/server.py``), with streaming's own metrics (stall time, requests). numpy + ai-edge-litert.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from edgeplan.errors import EdgeplanError
from edgeplan.runtime import stream
from edgeplan.runtime.engine import Histogram, Request, admit, request_metrics
from edgeplan.runtime.model import BadRequest, dequantize_output, quantize_input
from edgeplan.runtime.pull import active, read_manifest


class StreamRuntime:
    """Python API as ``engine.Runtime``'s: ``start()``, ``submit(model, x)``/``infer``, ``status()``,
    ``metrics_text()``, ``stop()``; ``mode`` is the stream mode (``plan``, ``always-next``, ...)."""

    def __init__(self, dest: Path, *, mode: str = "plan", max_inflight: int = 256):
        found = active(dest)
        if found is None:
            if not (Path(dest) / "manifest.json").is_file():
                raise EdgeplanError(f"{dest}: no active revision (run `edgeplan-runtime pull` first)")
            found = Path(dest), read_manifest(Path(dest))
        self.rev_dir, self.manifest = found
        plans = stream.load_plans(self.rev_dir, self.manifest)
        self.order = [e.name for e in self.manifest.models]
        missing = [n for n in self.order if n not in plans]
        if missing:
            raise EdgeplanError(f"{self.manifest.deployment} revision {self.manifest.revision}: no FlashMem plan for "
                                f"{', '.join(missing)}; serve without --stream, or plan them "
                                "(`edgeplan plan flashmem`) and publish again")
        self.models = {}
        for e in self.manifest.models:
            m, segs = plans[e.name]
            if len(segs[0].inputs) != 1:
                raise EdgeplanError(f"{e.name}: its first streamed segment takes {len(segs[0].inputs)} inputs")
            self.models[e.name] = (e, segs[0].inputs[0], stream.Streamer(segs, stream.schedule(segs, mode, m.plan),
                                                                         _interpreter, mode))
        self.mode, self.max_inflight = f"stream:{mode}", max_inflight
        self.points = {n: 0 for n in self.order}  # streamed: the whole int8 model on the CPU
        self.cores = {n: 1 for n in self.order}
        self.adapt = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.hist = {n: Histogram() for n in self.order}
        self.stall_s = collections.Counter()
        self.codes = collections.Counter()
        self.q: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="edgeplan-stream-serve", daemon=True)

    def start(self) -> StreamRuntime:
        self._worker.start()
        return self

    def stop(self) -> None:
        self.q.put(None)

    def submit(self, model: str, x) -> Future:
        """Queue one request; the future's result is the float output (raises BadRequest / Overloaded now)."""
        if model not in self.models:
            raise BadRequest(f"no model {model!r} in {self.manifest.deployment} revision {self.manifest.revision} "
                             f"(serving: {', '.join(self.order)})")
        q = quantize_input(x, self.models[model][0].input)
        admit(self, model)
        fut: Future = Future()
        self.q.put(Request(model, 0, q, fut))
        return fut

    def infer(self, model: str, x, timeout: float | None = 60.0) -> np.ndarray:
        return self.submit(model, x).result(timeout)

    def _work(self) -> None:
        while (req := self.q.get()) is not None:
            entry, key, streamer = self.models[req.model]
            try:
                out, log = streamer.run({key: req.x})
                (y,) = out.values()
            except Exception as e:  # noqa: BLE001 - this request fails (a corrupt segment: named); the next goes on
                with self.lock:
                    self.inflight -= 1
                    self.codes[req.model, 500] += 1
                req.future.set_exception(e)
                continue
            with self.lock:
                self.inflight -= 1
                self.hist[req.model].observe(time.perf_counter() - req.arrival)
                self.stall_s[req.model] += log.stall_ms / 1e3
                self.codes[req.model, 200] += 1
            req.future.set_result(dequantize_output(y, entry.output))

    def status(self) -> dict:
        return {"deployment": self.manifest.deployment, "revision": self.manifest.revision, "mode": self.mode,
                "models": {n: {"requests": self.hist[n].n, "segments": len(self.models[n][2].segments),
                               "mean_latency_ms": round(1e3 * self.hist[n].sum / self.hist[n].n, 3)
                               if self.hist[n].n else None,
                               "mean_stall_ms": round(1e3 * self.stall_s[n] / self.hist[n].n, 3)
                               if self.hist[n].n else None} for n in self.order},
                "inflight": self.inflight}

    def metrics_text(self) -> str:
        """Prometheus text format."""
        lines = request_metrics(self.order, self.hist, self.codes, "served requests (streamed)")
        lines += ["# HELP edgeplan_stream_stall_seconds_total Time requests waited for a segment to be read and built.",
                  "# TYPE edgeplan_stream_stall_seconds_total counter"]
        lines += [f'edgeplan_stream_stall_seconds_total{{model="{n}"}} {self.stall_s[n]:.6f}' for n in self.order]
        lines += ["# HELP edgeplan_inflight_requests Requests in flight.", "# TYPE edgeplan_inflight_requests gauge",
                  f"edgeplan_inflight_requests {self.inflight}",
                  "# HELP edgeplan_active_revision The active revision.", "# TYPE edgeplan_active_revision gauge",
                  f'edgeplan_active_revision{{deployment="{self.manifest.deployment}",mode="{self.mode}"}} '
                  f"{self.manifest.revision}"]
        return "\n".join(lines) + "\n"


def _interpreter(blob: bytes):
    from edgeplan.quantize import litert

    return litert.interpreter(blob, deterministic=False)
