"""The emulated Edge TPU (device class ``coral-usb-emulated``): a performance model driven by the compile
report, with physical constants from published specifications and parameters fitted on published measurements
(``data/coral_usb_benchmarks.csv``: desktop and Raspberry Pi 4B hosts with the USB Accelerator, and the Coral
Dev Board, the same Edge TPU over PCIe).

Published constants (each can be overridden by the device class in the fleet registry):
- peak int8 throughput 4 TOPS (Coral USB Accelerator datasheet) = 2e12 MAC/s;
- on-chip memory 8 MiB (Coral documentation, "about 8 MB of SRAM");
- the link: USB 3.0 SuperSpeed, 5 Gbit/s with 8b/10b line coding = 500 MB/s of payload (desktop, Raspberry
  Pi 4B); PCIe gen2 x1 on the Dev Board, 5 GT/s with 8b/10b = 500 MB/s as well.

The model, for one prefix (W: workload of the ops mapped to the Edge TPU, from the compile report and graph):
    compute        = (W.macs - W.dw_macs) / (peak * efficiency)               (the systolic array)
                   + W.dw_macs / (peak * dw_efficiency)                       (depthwise convolutions: one input
                                                                               channel per output, a sliver of it)
                   + W.ops * op_ms                                            (a fixed cost per op)
                   + W.activation_bytes * act_ns_per_byte                     (activation tensors through on-chip
                                                                               memory, each once)
    stream         = W.offchip_param_bytes / link                             (parameters that do not fit on chip)
    tpu_compute_ms = compute + stream - overlap * min(compute, stream)        (streaming hidden under compute)
                     + W.act_offchip_bytes / link + overhead_ms               (activations too large for the chip,
                                                                               not overlapped)
    io_ms          = (W.input_bytes + W.output_bytes) / link                  (SwapLess d/B)
    load_ms        = W.onchip_param_bytes / link                              (SwapLess T^Load)
    tpu_ms         = tpu_compute_ms + io_ms
with link = the host's published link rate * link_efficiency.

Fitted, one parameter per term, jointly on every row of every host (least squares on relative error, within
physical bounds, ``SHARED`` and ``PER_HOST``): ``efficiency`` and ``dw_efficiency`` in (0, 1] (the fraction of
peak the array sustains on dense and on depthwise MACs), ``op_ms`` >= 0, ``act_ns_per_byte`` >= 0,
``overlap`` in [0, 1] (0: streaming and compute in sequence; 1: the shorter wholly hidden); per host
``overhead_ms`` >= 0 (driver, transaction set-up, instruction fetch) and ``link_efficiency`` in (0, 1] (the
share of the published link rate the host's stack reaches). ``python -m edgeplan.profile.calibration``
rebuilds the workloads from edgeplan's own int8 conversions of the same architectures.
Measured on the 17 rows (7 architectures, 3 hosts): leave-one-architecture-out errors in the README
("Profiles") and ``edgeplan profile emulator``.

numpy and the standard library (the fit itself, ``fit``, needs scipy: the pipeline's; a device reads the shipped
fit).
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path

import numpy as np

PEAK_MACS_PER_S = 2.0e12
ONCHIP_PARAM_BYTES = 8 * 1024 * 1024
LINK_BYTES_PER_S = 5.0e8
MODEL_VERSION = "edgeplan-tpu-model-2"
# each host's published link rate, bytes/s of payload (see above)
HOST_LINKS = {"desktop": 5.0e8, "rpi4b": 5.0e8, "devboard": 5.0e8}

DATA = Path(__file__).parent / "data"
BENCHMARKS_CSV = DATA / "coral_usb_benchmarks.csv"
WORKLOADS_JSON = DATA / "coral_usb_workloads.json"
FIT_JSON = DATA / "coral_usb_fit.json"  # the joint fit, shipped: a device emulates without fitting (no scipy)


@dataclass(frozen=True)
class TpuWorkload:
    """What the Edge TPU does for one inference of a compiled model (from its compile report and graph)."""

    macs: int
    onchip_param_bytes: int
    offchip_param_bytes: int
    input_bytes: int
    output_bytes: int
    ops: int
    activation_bytes: int = 0  # the activation tensors the ops read or write, each once
    dw_macs: int = 0  # the MACs of depthwise convolutions (among ``macs``)
    act_offchip_bytes: int = 0  # those of ops whose activations exceed the on-chip memory (they cross the link)


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
    link_bytes_per_s: float = LINK_BYTES_PER_S  # the effective rate (published * the host's link efficiency)
    onchip_param_bytes: int = ONCHIP_PARAM_BYTES
    calibration: dict = field(default_factory=dict)  # hosts, rows used, fitted values, leave-one-out errors
    op_ms: float = 0.0
    overlap: float = 0.0
    act_ns_per_byte: float = 0.0
    dw_efficiency: float | None = None  # None: depthwise MACs run at ``efficiency`` like the others

    def terms(self, w: TpuWorkload) -> dict[str, float]:
        """What one inference's time is made of (ms): the terms of the model above, streaming after overlap."""
        dw_eff = self.efficiency if self.dw_efficiency is None else self.dw_efficiency
        compute = 1e3 * (w.macs - w.dw_macs) / (self.peak_macs_per_s * self.efficiency)
        depthwise = 1e3 * w.dw_macs / (self.peak_macs_per_s * dw_eff)
        per_op = self.op_ms * w.ops
        traffic = 1e-6 * self.act_ns_per_byte * w.activation_bytes
        stream = 1e3 * w.offchip_param_bytes / self.link_bytes_per_s
        hidden = self.overlap * min(compute + depthwise + per_op + traffic, stream)
        return {"compute": compute, "depthwise": depthwise, "per_op": per_op, "traffic": traffic,
                "stream": stream - hidden,
                "activations": 1e3 * w.act_offchip_bytes / self.link_bytes_per_s, "overhead": self.overhead_ms,
                "io": 1e3 * (w.input_bytes + w.output_bytes) / self.link_bytes_per_s}

    def times(self, w: TpuWorkload) -> TpuTimes:
        t = self.terms(w)
        return TpuTimes(
            tpu_compute_ms=sum(v for k, v in t.items() if k != "io"),
            io_ms=t["io"],
            load_ms=1e3 * w.onchip_param_bytes / self.link_bytes_per_s,
        )

    def describe(self) -> dict:
        """What a profile records about the model that produced its ``emulated`` figures (the calibration's
        hosts and fitted values; its per-row errors are ``edgeplan profile emulator``'s)."""
        keep = {k: v for k, v in self.calibration.items() if k in ("hosts", "host", "params")}
        return {"model": MODEL_VERSION, **asdict(self), "calibration": keep}


@dataclass(frozen=True)
class Fit:
    """The jointly fitted parameters: shared (``SHARED``) and per host (``PER_HOST``)."""

    efficiency: float
    op_ms: float
    overlap: float
    overhead_ms: dict[str, float]
    link_efficiency: dict[str, float]
    act_ns_per_byte: float = 0.0
    dw_efficiency: float | None = None

    def device(self, host: str, peak_macs_per_s: float = PEAK_MACS_PER_S, link_bytes_per_s: float | None = None,
               onchip_param_bytes: int = ONCHIP_PARAM_BYTES, calibration: dict | None = None) -> EmulatedEdgeTpu:
        """The emulated Edge TPU on ``host``; ``link_bytes_per_s`` (the published rate) defaults to the host's."""
        if host not in self.overhead_ms:
            raise ValueError(f"no calibration rows for host {host!r} (hosts: {', '.join(sorted(self.overhead_ms))})")
        link = link_bytes_per_s if link_bytes_per_s is not None else HOST_LINKS.get(host, LINK_BYTES_PER_S)
        return EmulatedEdgeTpu(self.efficiency, self.overhead_ms[host], peak_macs_per_s,
                               link * self.link_efficiency[host], onchip_param_bytes, calibration or {},
                               self.op_ms, self.overlap, self.act_ns_per_byte, self.dw_efficiency)


# the shared parameters: bounds and the starts the fit tries (the objective is not convex in overlap)
SHARED = {
    "efficiency": (1e-3, 1.0, (0.5, 0.3, 0.8)),
    "dw_efficiency": (1e-3, 1.0, (0.05, 0.02, 0.2)),
    "op_ms": (0.0, 1.0, (0.01, 0.0, 0.02)),
    "overlap": (0.0, 1.0, (0.5, 0.0, 1.0)),
    "act_ns_per_byte": (0.0, 10.0, (0.05, 0.0, 0.1)),
}
PER_HOST = {"overhead_ms": (0.0, 100.0, 1.0), "link_efficiency": (0.05, 1.0, 0.8)}


def _unpack(theta, shared: list[str], hosts: list[str], fixed: dict) -> Fit:
    n = len(hosts)
    values = {**fixed, **dict(zip(shared, map(float, theta)))}
    at = len(shared)
    return Fit(values["efficiency"], values["op_ms"], values["overlap"],
               dict(zip(hosts, map(float, theta[at:at + n]))), dict(zip(hosts, map(float, theta[at + n:at + 2 * n]))),
               values["act_ns_per_byte"], values["dw_efficiency"])


def fit(rows: list[CalibrationRow], peak_macs_per_s: float = PEAK_MACS_PER_S,
        links: dict[str, float] | None = None, fixed: dict | None = None) -> Fit:
    """The parameters minimising the squared relative error over ``rows`` (all hosts at once), within their
    bounds (``SHARED``, ``PER_HOST``); ``fixed`` holds shared parameters out of the fit at given values."""
    from scipy.optimize import least_squares

    fixed = fixed or {}
    shared = [k for k in SHARED if k not in fixed]
    hosts = sorted({r.host for r in rows})
    n = len(hosts)
    if len(rows) < len(shared) + 2 * n:
        raise ValueError(f"fitting {len(shared) + 2 * n} parameters needs at least that many calibration rows "
                         f"(got {len(rows)})")
    links = {**HOST_LINKS, **(links or {})}
    measured = np.array([r.measured_ms for r in rows])
    lo, hi = (np.array([SHARED[k][i] for k in shared] + [PER_HOST["overhead_ms"][i]] * n
                       + [PER_HOST["link_efficiency"][i]] * n) for i in (0, 1))

    def residuals(theta):
        f = _unpack(theta, shared, hosts, fixed)
        return np.array([f.device(r.host, peak_macs_per_s, links.get(r.host)).times(r.workload).tpu_ms
                         for r in rows]) / measured - 1

    best = None
    for start in range(3):
        x0 = np.array([SHARED[k][2][start] for k in shared] + [PER_HOST["overhead_ms"][2]] * n
                      + [PER_HOST["link_efficiency"][2]] * n)
        res = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    return _unpack(best.x, shared, hosts, fixed)


def leave_one_architecture_out(rows: list[CalibrationRow], peak: float = PEAK_MACS_PER_S,
                               links: dict[str, float] | None = None, fixed: dict | None = None) -> list[dict]:
    """Each architecture's rows (every host) predicted by the model fitted on the other architectures: relative
    error (predicted/measured - 1) and the term that dominates the prediction."""
    links = {**HOST_LINKS, **(links or {})}
    out = []
    for arch in dict.fromkeys(f"{r.model}@{r.input}" for r in rows):
        held = [r for r in rows if f"{r.model}@{r.input}" == arch]
        f = fit([r for r in rows if f"{r.model}@{r.input}" != arch], peak, links, fixed)
        out += [_row(r, f.device(r.host, peak, links.get(r.host))) for r in held]
    return out


def _row(r: CalibrationRow, tpu: EmulatedEdgeTpu) -> dict:
    terms = tpu.terms(r.workload)
    pred = tpu.times(r.workload).tpu_ms
    return {"model": r.model, "input": r.input, "host": r.host, "measured_ms": r.measured_ms,
            "predicted_ms": round(pred, 4), "error": round(pred / r.measured_ms - 1, 4),
            "dominant": max(terms, key=terms.get),
            "terms_ms": {k: round(v, 4) for k, v in terms.items()}}


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
def calibrated(peak_macs_per_s: float = PEAK_MACS_PER_S, fit_path: Path = FIT_JSON) -> Fit:
    """The joint fit on every calibration row (every host), as shipped in ``data/coral_usb_fit.json``
    (``python -m edgeplan.profile.calibration --fit-only`` rewrites it; a test checks it is the fit of the
    shipped rows)."""
    doc = json.loads(Path(fit_path).read_text())
    if doc.get("model") != MODEL_VERSION or doc.get("peak_macs_per_s") != peak_macs_per_s:
        raise ValueError(f"{fit_path}: fitted for {doc.get('model')} at {doc.get('peak_macs_per_s')} MAC/s, not "
                         f"{MODEL_VERSION} at {peak_macs_per_s}; rerun "
                         "`python -m edgeplan.profile.calibration --fit-only`")
    return Fit(**doc["fit"])


def fit_document(peak_macs_per_s: float = PEAK_MACS_PER_S) -> dict:
    """What ``data/coral_usb_fit.json`` holds: the fit of the shipped rows (scipy: pipeline only)."""
    rows = calibration_rows()
    return {"model": MODEL_VERSION, "peak_macs_per_s": peak_macs_per_s,
            "rows": [f"{r.model}@{r.input}/{r.host}" for r in rows], "fit": asdict(fit(rows, peak_macs_per_s))}


@cache
def shipped_loao(peak_macs_per_s: float = PEAK_MACS_PER_S) -> tuple[dict, ...]:
    """The leave-one-architecture-out errors of every calibration row (seven fits: about a second)."""
    return tuple(leave_one_architecture_out(calibration_rows(), peak_macs_per_s))


@cache
def for_host(host: str, peak_macs_per_s: float = PEAK_MACS_PER_S, link_bytes_per_s: float | None = None,
             onchip_param_bytes: int = ONCHIP_PARAM_BYTES) -> EmulatedEdgeTpu:
    """The emulated Edge TPU on ``host`` (``desktop``, ``rpi4b``, ``devboard``): the joint fit, with that host's
    overhead and link efficiency; ``link_bytes_per_s`` is the published link rate (the host's by default).
    Its ``calibration`` holds the fitted values and each row's in-fit error and terms."""
    f = calibrated(peak_macs_per_s)
    rows = calibration_rows()
    link = link_bytes_per_s if link_bytes_per_s is not None else HOST_LINKS.get(host, LINK_BYTES_PER_S)
    tpu = f.device(host, peak_macs_per_s, link, onchip_param_bytes)
    return replace(tpu, calibration={
        "hosts": sorted({r.host for r in rows}),
        "host": host,
        "rows": [f"{r.model}@{r.input}/{r.host}" for r in rows],
        "params": {**asdict(f), "link_bytes_per_s_published": link, "link_bytes_per_s": tpu.link_bytes_per_s},
        "fit_rows": [_row(r, f.device(r.host, peak_macs_per_s)) for r in rows],
    })
