"""``params.yaml``: every knob, with embedded defaults when there is no file."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from edgeplan.errors import EdgeplanError

DEFAULTS: dict = {
    "models": [
        {"name": "mobilenetv2", "version": "1", "source": "zoo:mobilenetv2_0.35_96"},
    ],
    "ingest": {"max_model_bytes": 16 << 30, "max_memory_bytes": None},
    "analysis": {"max_points": 8},
    "quantize": {
        "calibration": {"kind": "random", "low": -1.0, "high": 1.0, "samples": 64, "seed": 0},
        "match_min_cosine": 0.5,
        "timeout_s": 1800,
        "piece_bytes": 128 << 20,
    },
    "compile": {"compiler": "auto", "onchip_bytes": 8 * 1024 * 1024, "allow_multiple_subgraphs": False},
    "verify": {"samples": 4, "seed": 1000, "min_cosine": 0.85},
    "accuracy": {"dataset": None, "max_top1_drop": 0.02, "max_samples": 2000},
    "profile": {
        "warmup": 2,
        "repeats": 300,
        "min_repeats": 5,
        "span_s": 20.0,
        "budget_s": 10.0,
        "timeout_s": 120.0,
        "kernels": "xnnpack",
        "drift_threshold": 0.10,
    },
    "plan": {"variant": "refined", "rate_factors": [0.5, 1.0, 2.0], "preload_ram_share": 0.5},
    "flashmem": {"max_segment_bytes": 16 * 1024 * 1024, "verify_samples": 2, "chunk_bytes": 64 * 1024,
                 "objective": "resident", "lambda": 0.9, "window": 100, "lookback": 100, "time_limit_s": 10.0,
                 "capacity_rounds": 5, "m_peak_ram_share": 0.25, "m_peak_bytes": None, "min_segment_ms": 5.0,
                 "solve_share": 0.7, "read_lead": 4, "read_in_time": False, "segment_kernels": "fastest"},
    "parallax": {"workers": 2, "margin": 0.4, "budget_bytes": None, "min_nodes": 3, "beta": 1.5, "repeats": 9,
                 "confirm_repeats": 15, "confirm_min_gain": 0.01, "verify_samples": 2, "force": False},
    "spatial": {"threshold": 0.15, "dims": ["H"], "verify_samples": 2},
    "multidevice": {"objective": "throughput", "population": 100, "generations": 400, "mutation": 0.1,
                    "crossover": 0.5, "seed": 0, "repeats": 5},
    "orchestration": {"conversion_slots": 1, "reprofile_cron": "0 3 * * *", "prefect_server": "local",
                      "prefect_server_idle_s": 1800, "dvc_timeout_s": 600},
    "publish": {"store": ".edgeplan/store", "trusted_keys": [".edgeplan/keys"]},
    "deployments": [
        {"name": "mobilenetv2-solo", "device_class": "coral-usb-emulated",
         "models": [{"name": "mobilenetv2", "version": "latest", "rate": 10.0}]},
    ],
    "fleet": {
        "device_classes": {
            "coral-usb-emulated": {
                "cpu": "measured",
                "cores": None,
                "ram_bytes": 8 * 1024**3,
                "cpu_probe_ms": {1: 5.0, 2: 2.8},
                "accelerator": {"kind": "edgetpu-usb-emulated", "onchip_param_bytes": 8 * 1024 * 1024,
                                "link_bytes_per_s": 5.0e8, "calibration_host": "desktop"},
            },
        },
        "devices": [
            {"id": "edge-0001", "device_class": "coral-usb-emulated", "deployment": "mobilenetv2-solo",
             "work_pool": "coral-usb-emulated", "work_queue": "default"},
        ],
    },
}

# Keys whose value replaces the default as a whole (their own modules validate them).
_REPLACED = {"calibration", "deployments", "fleet"}


def _merge(base: dict, over: dict, where: str) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k not in base:
            raise EdgeplanError(f"{where}: unknown key {k!r} (known: {', '.join(base)})")
        if isinstance(base[k], dict) and k not in _REPLACED:
            if not isinstance(v, dict):
                raise EdgeplanError(f"{where}.{k}: expected a mapping")
            out[k] = _merge(base[k], v, f"{where}.{k}")
        else:
            out[k] = v
    return out


def load(path: str | Path | None = None) -> dict:
    """Defaults, overridden by ``path`` (or ``./params.yaml`` when it exists and no path is given)."""
    if path is None:
        path = Path("params.yaml") if Path("params.yaml").is_file() else None
    if path is None:
        return copy.deepcopy(DEFAULTS)
    path = Path(path)
    if not path.is_file():
        raise EdgeplanError(f"{path}: params file not found")
    data = yaml.safe_load(path.read_text()) or {}
    known = {k: v for k, v in data.items() if k in DEFAULTS}
    return _merge(DEFAULTS, known, str(path))
