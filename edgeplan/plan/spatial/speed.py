"""speed_d (ADaPS §4.3.1): a device class's seconds per MAC and per layer, fitted to its measured conv times.

Each convolution of the int8 model is cut out as a one-op model and timed on one thread at a quarter, half,
three quarters and all of its input rows — the sizes a partition gives it — each the mean over half a second of
back-to-back invokes after a warm-up; the fit is a least-squares slope of seconds on MACs within each conv
(each its own intercept; the per-layer seconds the median intercept: ``cost.fit_speed``). (Five AlexNet convs at
full size alone gave a fit whose slope came out negative under a 0.22 quota.) Run it on the device — or, for an
emulated one, inside its CPU cgroup: the quota is a cap, and what a rank gets under it is measured, never read
off it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from edgeplan.errors import ProfileError
from edgeplan.plan.spatial.cost import fit_speed
from edgeplan.quantize import litert
from edgeplan.quantize.stream import cut_ops
from edgeplan.quantize.tflite_graph import TfliteGraph

CONV_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D")


FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def mean_s(data: bytes, window_s: float = 0.5, rows: int | None = None) -> tuple[float, int]:
    """Mean seconds per invoke over back-to-back invokes for at least ``window_s`` (many CFS periods: under a
    quota a median of short invokes would miss the throttling that a mean over time includes), and the output
    rows each invoke made."""
    it = litert.primed(data, rows=rows)
    n, t0 = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - t0 < window_s:
        it.invoke()
        n += 1
    return (time.perf_counter() - t0) / n, int(it.get_output_details()[0]["shape"][1])


def conv_times(tflite: bytes, window_s: float = 0.5) -> list[tuple[int, int, float]]:
    """(conv op index, MACs, seconds) of every convolution of the int8 model at each fraction of its input rows,
    run alone on one thread."""
    graph = TfliteGraph(tflite)
    out = []
    for op in graph.ops:
        if op.name not in CONV_OPS or graph.op_macs[op.index] <= 0:
            continue
        data = cut_ops(graph, [op.index], f"conv{op.index}")
        height = graph.tensors[op.inputs[0]].shape[1]
        full_rows = graph.tensors[op.outputs[0]].shape[1]
        for rows in sorted({max(round(height * f), 1) for f in FRACTIONS}):
            seconds, out_rows = mean_s(data, window_s, rows)
            out.append((op.index, graph.op_macs[op.index] * out_rows // full_rows, seconds))
    return out


def fitted(tflite: bytes, window_s: float = 0.5) -> dict:
    """The fit and the points it was made from (JSON-ready)."""
    timed = conv_times(tflite, window_s)
    points = [(m, s) for _, m, s in timed]
    s_per_mac, s_per_layer = fit_speed([m for m, _ in points], [s for _, s in points], [k for k, _, _ in timed])
    return {"s_per_mac": s_per_mac, "s_per_layer": s_per_layer, "points": points}


def measure(tflite: Path, quota: float | None = None, window_s: float = 0.5) -> dict:
    """The fit for a device class: in this process, or — for a class emulated as a share of a core (its
    ``cpu_quota``) — in a child held to that share by a cpu cgroup (v1, 10 ms period: needs root), since what a
    rank gets under a quota is measured, never read off it."""
    if quota is None:
        return {"quota": None, **fitted(Path(tflite).read_bytes(), window_s)}
    from edgeplan.distributed.emulate import CPU_CGROUP, cpu_cgroup, remove_cgroup

    if not CPU_CGROUP.is_dir() or not os.access(CPU_CGROUP, os.W_OK):
        raise ProfileError(f"the class's conv speed is measured under its cpu_quota {quota:g}: needs a writable cpu "
                           f"cgroup (v1) at {CPU_CGROUP} (run as root)")
    cg = CPU_CGROUP / f"edgeplan-speed-{os.getpid()}"
    try:
        cpu_cgroup(cg, quota)
        res = subprocess.run([sys.executable, "-m", "edgeplan.plan.spatial.speed", str(tflite), str(window_s)],
                             capture_output=True, text=True, check=False,
                             preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
        if res.returncode != 0:
            raise ProfileError(f"conv speed under quota {quota:g}: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
        return {"quota": quota, **json.loads(res.stdout)}
    finally:
        remove_cgroup(cg)  # the child has exited


if __name__ == "__main__":  # python -m edgeplan.plan.spatial.speed MODEL.tflite [WINDOW_S]: the fit as JSON
    print(json.dumps(fitted(Path(sys.argv[1]).read_bytes(), *(float(a) for a in sys.argv[2:3]))))
