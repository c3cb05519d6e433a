"""The emulated Edge TPU (device class ``coral-usb-emulated``): a performance model driven by the compile
report, with physical constants from published specifications and two parameters fitted on published
measurements (``data/coral_usb_benchmarks.csv``).

Published constants (each can be overridden by the device class in the fleet registry):
- peak int8 throughput 4 TOPS (Coral USB Accelerator datasheet) = 2e12 MAC/s;
- on-chip parameter memory 8 MiB (Coral documentation, "about 8 MB of SRAM");
- USB 3.0 SuperSpeed link: 5 Gbit/s with 8b/10b line coding = 500 MB/s of payload.

The model, for one prefix (W: workload of the ops mapped to the Edge TPU):
    tpu_compute_ms = 1e3 * (W.macs / (peak * efficiency) + W.offchip_param_bytes / link) + overhead_ms
    io_ms          = 1e3 * (W.input_bytes + W.output_bytes) / link                  (SwapLess d/B)
    load_ms        = 1e3 * W.onchip_param_bytes / link                              (SwapLess T^Load)
    tpu_ms         = tpu_compute_ms + io_ms
Free parameters: ``efficiency`` (the fraction of peak MAC throughput the systolic array sustains) and
``overhead_ms`` (fixed cost per inference: driver, USB transaction set-up, instruction fetch). They are
fitted by least squares on relative error over the rows of one host of the calibration table, with
0 < efficiency <= 1 and overhead_ms >= 0.

numpy and the standard library only: the device runtime's emulated accelerator uses this module.
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

PEAK_MACS_PER_S = 2.0e12
ONCHIP_PARAM_BYTES = 8 * 1024 * 1024
LINK_BYTES_PER_S = 5.0e8
MODEL_VERSION = "edgeplan-tpu-model-1"

DATA = Path(__file__).parent / "data"
BENCHMARKS_CSV = DATA / "coral_usb_benchmarks.csv"
WORKLOADS_JSON = DATA / "coral_usb_workloads.json"


@dataclass(frozen=True)
class TpuWorkload:
    """What the Edge TPU does for one inference of a compiled model (from its compile report and graph)."""

    macs: int
    onchip_param_bytes: int
    offchip_param_bytes: int
    input_bytes: int
    output_bytes: int
    ops: int


@dataclass(frozen=True)
class TpuTimes:
    tpu_compute_ms: float
    io_ms: float
    load_ms: float

    @property
    def tpu_ms(self) -> float:
        return self.tpu_compute_ms + self.io_ms


@dataclass(frozen=True)
class CalibrationRow:
    model: str
    input: int
    host: str
    measured_ms: float
    workload: TpuWorkload


@dataclass(frozen=True)
class EmulatedEdgeTpu:
    efficiency: float
    overhead_ms: float
    peak_macs_per_s: float = PEAK_MACS_PER_S
    link_bytes_per_s: float = LINK_BYTES_PER_S
    onchip_param_bytes: int = ONCHIP_PARAM_BYTES
    calibration: dict = field(default_factory=dict)  # host, rows used, leave-one-out errors

    def times(self, w: TpuWorkload) -> TpuTimes:
        compute = 1e3 * (w.macs / (self.peak_macs_per_s * self.efficiency) + w.offchip_param_bytes / self.link_bytes_per_s)
        return TpuTimes(
            tpu_compute_ms=compute + self.overhead_ms,
            io_ms=1e3 * (w.input_bytes + w.output_bytes) / self.link_bytes_per_s,
            load_ms=1e3 * w.onchip_param_bytes / self.link_bytes_per_s,
        )

    def describe(self) -> dict:
        """What a profile records about the model that produced its ``emulated`` figures."""
        return {"model": MODEL_VERSION, **asdict(self)}


def fit(rows: list[CalibrationRow], peak_macs_per_s: float = PEAK_MACS_PER_S,
        link_bytes_per_s: float = LINK_BYTES_PER_S) -> tuple[float, float]:
    """(efficiency, overhead_ms) minimising the squared relative error over ``rows``.

    With the link terms known, measured - io - streaming = a * macs + overhead is linear in
    (a, overhead), a = 1e3 / (peak * efficiency): weighted least squares, then the bounds."""
    if len(rows) < 2:
        raise ValueError("fitting two parameters needs at least two calibration rows")
    macs = np.array([r.workload.macs for r in rows], dtype=float)
    y = np.array([r.measured_ms - 1e3 * (r.workload.input_bytes + r.workload.output_bytes + r.workload.offchip_param_bytes)
                  / link_bytes_per_s for r in rows])
    w = 1.0 / np.array([r.measured_ms for r in rows])
    a_min = 1e3 / peak_macs_per_s

    def solve_overhead(a: float) -> float:  # best overhead for a fixed slope, >= 0
        return max(0.0, float(np.sum(w**2 * (y - a * macs)) / np.sum(w**2)))

    design = np.stack([macs, np.ones_like(macs)], axis=1) * w[:, None]
    (a, overhead), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if overhead < 0:  # fit the slope alone through the origin
        overhead = 0.0
        a = float(np.sum(w**2 * macs * y) / np.sum(w**2 * macs**2))
    if a < a_min:  # faster than peak: clamp to peak and refit the overhead
        a = a_min
        overhead = solve_overhead(a)
    return float(a_min / a), float(overhead)


def fitted(rows: list[CalibrationRow], **constants) -> EmulatedEdgeTpu:
    peak = constants.get("peak_macs_per_s", PEAK_MACS_PER_S)
    link = constants.get("link_bytes_per_s", LINK_BYTES_PER_S)
    efficiency, overhead = fit(rows, peak, link)
    tpu = EmulatedEdgeTpu(efficiency, overhead, peak, link, constants.get("onchip_param_bytes", ONCHIP_PARAM_BYTES))
    errors = leave_one_out(rows, peak, link) if len(rows) > 2 else []
    return EmulatedEdgeTpu(**{**asdict(tpu), "calibration": {
        "hosts": sorted({r.host for r in rows}),
        "rows": [f"{r.model}@{r.input}/{r.host}" for r in rows],
        "fit_errors": [round(tpu.times(r.workload).tpu_ms / r.measured_ms - 1, 4) for r in rows],
        "loo_errors": errors,
    }})


def leave_one_out(rows: list[CalibrationRow], peak: float = PEAK_MACS_PER_S, link: float = LINK_BYTES_PER_S) -> list[dict]:
    """Each row predicted by the model fitted on the other rows: relative error (predicted/measured - 1)."""
    out = []
    for i, r in enumerate(rows):
        eff, ovh = fit(rows[:i] + rows[i + 1:], peak, link)
        pred = EmulatedEdgeTpu(eff, ovh, peak, link).times(r.workload).tpu_ms
        out.append({"model": r.model, "input": r.input, "host": r.host, "measured_ms": r.measured_ms,
                    "predicted_ms": round(pred, 4), "error": round(pred / r.measured_ms - 1, 4),
                    "efficiency": round(eff, 4), "overhead_ms": round(ovh, 4)})
    return out


def calibration_rows(host: str | None = None, csv_path: Path = BENCHMARKS_CSV,
                     workloads_path: Path = WORKLOADS_JSON) -> list[CalibrationRow]:
    """The published rows (of ``host``, or all) joined with the workloads of the same architectures."""
    workloads = json.loads(Path(workloads_path).read_text())["workloads"]
    lines = [x for x in Path(csv_path).read_text().splitlines() if x.strip() and not x.startswith("#")]
    rows = []
    for rec in csv.DictReader(lines):
        if host is not None and rec["host"] != host:
            continue
        key = f"{rec['model']}@{rec['input']}"
        if key not in workloads:
            raise KeyError(f"{workloads_path}: no workload for {key} (rebuild with "
                           f"`python -m edgeplan.profile.calibration`)")
        rows.append(CalibrationRow(rec["model"], int(rec["input"]), rec["host"], float(rec["edgetpu_usb3_ms"]),
                                   TpuWorkload(**workloads[key]["workload"])))
    return rows


@cache
def for_host(host: str, peak_macs_per_s: float = PEAK_MACS_PER_S, link_bytes_per_s: float = LINK_BYTES_PER_S,
             onchip_param_bytes: int = ONCHIP_PARAM_BYTES) -> EmulatedEdgeTpu:
    """The emulated Edge TPU calibrated on the rows of ``host`` (``desktop``, ``rpi4b``)."""
    rows = calibration_rows(host)
    if not rows:
        raise ValueError(f"no calibration rows for host {host!r} in {BENCHMARKS_CSV}")
    return fitted(rows, peak_macs_per_s=peak_macs_per_s, link_bytes_per_s=link_bytes_per_s,
                  onchip_param_bytes=onchip_param_bytes)
