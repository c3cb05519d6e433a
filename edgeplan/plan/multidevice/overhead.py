"""What an MPI rank costs beyond its invokes, measured on hosts of the platform (AutoDiCE's throughput model).

A rank of ``edgeplan.distributed.rank`` spends CPU outside its invokes: per frame (setting and reading tensors,
posting receives and sends), per byte it sends or receives (copies, the TCP stack) and per second of wall time
(Open MPI's progress and this rank's polling while it waits). On a host whose CPU is capped (a cgroup quota, a
small board), that time is taken from the invokes': unit times alone predict a chain faster than it runs (the
full AutoDiCE bench: 0.42 mean error before this model).

Measured, not assumed: the model's own splits run as real MPI jobs on two hosts of the platform (the whole model
on one rank, then 2-way cuts where the crossing tensors are largest, smallest and where the compute is balanced),
and each rank's CPU outside its invokes per frame (``cpu_s − invoke_cpu_s``) is fitted to

    frame_s + byte_s × (bytes it sent and received per frame) + poll × (its wall time per frame)

by non-negative least squares; and each rank's invoke CPU is compared with its units' times measured alone
(``invoke_scale``: on a capped host sharing its cores the same invokes run ~10 % slower than timed alone, caches
taken by the other processes). ``explore.evaluate`` then takes a device's period as (its units' times ×
invoke_scale + frame_s + byte_s × its bytes) / (its cpu quota − poll).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgeplan.plan.multidevice.costs import Costs, RankOverhead


def rank_rows(summary: dict, tables: dict, units_s: dict[str, float]) -> list[dict]:
    """Per rank of a finished job: CPU outside invokes, bytes moved, wall time and invoke CPU, each per frame,
    beside ``units_s``: the rank's device's units' times measured alone (device name -> s)."""
    frames = summary["frames"]
    rows = []
    for k in summary["ranks"]:
        r = k["rank"]
        rx = sum(b["nbytes"] for b in tables["buffers"].values() if r in b["receivers"])
        tx = sum(b["nbytes"] * len(b["receivers"]) for b in tables["buffers"].values() if b["sender"] == r)
        rows.append({"rank": r, "over_s": (k["cpu_s"] - k["invoke_cpu_s"]) / frames, "bytes": rx + tx,
                     "wall_s": k["wall_s"] / frames, "invoke_s": k["invoke_cpu_s"] / frames,
                     "units_s": units_s[tables["ranks"][r]["device"]]})
    return rows


def fit(rows: list[dict]) -> RankOverhead:
    """Non-negative least squares of ``over_s`` on (1, bytes, wall_s); the invoke scale is the ranks' invoke CPU
    over their units' times alone (when the rows have both)."""
    from scipy.optimize import nnls

    if len(rows) < 3:
        raise ValueError(f"{len(rows)} ranks measured: at least 3 are needed to fit 3 coefficients")
    a = np.array([[1.0, r["bytes"], r["wall_s"]] for r in rows])
    scale = np.maximum(a.max(axis=0), 1e-12)  # bytes are ~1e6, the rest ~1e-2: solve in comparable units
    x, _ = nnls(a / scale, np.array([r["over_s"] for r in rows]))
    x = x / scale
    units = sum(r.get("units_s", 0.0) for r in rows)
    invoke = sum(r.get("invoke_s", 0.0) for r in rows)
    return RankOverhead(frame_s=float(x[0]), byte_s=float(x[1]), poll=float(x[2]),
                        invoke_scale=invoke / units if units > 0 and invoke > 0 else 1.0)


def crossing_bytes(costs: Costs, cut: int) -> int:
    """Bytes of the int8 tensors made before position ``cut`` and read at or after it (each once)."""
    return int(sum(b for p, readers, b in costs.tensors if p < cut and max(readers) >= cut))


def calibration_cuts(costs: Costs) -> list[int]:
    """2-way cuts spanning what a rank moves and how long it waits: where the crossing tensors are largest and
    smallest, and where the two halves' compute is closest (interior cuts only, distinct)."""
    u = len(costs.order)
    inner = range(1, u)
    sizes = {k: crossing_bytes(costs, k) for k in inner}
    before = np.cumsum(costs.ms[:, 0])
    balanced = min(inner, key=lambda k: abs(2 * before[k - 1] - before[-1]))
    picks = [max(inner, key=sizes.get), min(inner, key=sizes.get), balanced]
    return list(dict.fromkeys(picks))


def measure(root: Path, units, costs: Costs, platform, work: Path, run, xs: np.ndarray) -> tuple[RankOverhead, dict]:
    """Run the calibration jobs (the whole model on the platform's first device, then each of
    ``calibration_cuts`` over its first two) and fit. ``run(split_dir)`` runs one job and returns the head's
    summary (``launch.run(...).summary`` with the hosts' MPI arguments); ``xs``: float samples for the split's
    verification. Returns the fit and what it was fitted on."""
    from edgeplan.plan.multidevice import explore, spec
    from edgeplan.surgery import multidevice

    if len(platform.devices) < 2:
        raise ValueError("the rank overhead is measured between two devices; the platform has one")
    u, d = len(costs.order), len(platform.devices)
    jobs = [("whole", [u] * (d - 1))] + [(f"cut{k}", [k] + [u] * (d - 2)) for k in calibration_cuts(costs)]
    rows, runs = [], {}
    for name, cuts in jobs:
        _, _, _, seg = explore.evaluate(costs, platform, cuts, [0] * d)
        doc = explore.mapping_of(costs, units, platform, seg, [0] * d)
        out = work / name
        multidevice.split(root, units, spec.parse_mapping(doc, platform, units), platform, out, xs=xs)
        summary = run(out)
        alone = {dev.name: float(costs.ms[np.asarray(seg) == k, 0].sum() / 1e3)
                 for k, dev in enumerate(platform.devices)}
        got = rank_rows(summary, json.loads((out / "tables.json").read_text()), alone)
        rows += got
        runs[name] = {"cut": cuts[0], "ranks": got}
    fitted = fit(rows)
    return fitted, {"jobs": runs, "fit": fitted.to_json()}
