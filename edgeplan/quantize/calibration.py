"""Representative data for int8 calibration (params.yaml ``quantize.calibration``).

Two kinds: ``random`` (seeded uniform images in [low, high]) and ``npy_dir`` (every ``.npy`` file in a
directory, each one sample or a batch, in the model's canonical NCHW layout).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeplan.errors import CalibrationError


@dataclass(frozen=True)
class CalibrationSpec:
    kind: str = "random"
    low: float = -1.0
    high: float = 1.0
    samples: int = 32
    seed: int = 0
    path: str | None = None

    @classmethod
    def from_params(cls, p: dict | None) -> "CalibrationSpec":
        p = dict(p or {})
        unknown = set(p) - {"kind", "low", "high", "samples", "seed", "path"}
        if unknown:
            raise CalibrationError(f"quantize.calibration: unknown keys {sorted(unknown)}")
        spec = cls(**p)
        if spec.kind not in ("random", "npy_dir"):
            raise CalibrationError(f"quantize.calibration.kind must be 'random' or 'npy_dir', not {spec.kind!r}")
        if spec.kind == "npy_dir" and not spec.path:
            raise CalibrationError("quantize.calibration.kind is 'npy_dir' but no 'path' is given")
        return spec


def calibration_data(spec: CalibrationSpec, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of shape ``(N, *shape[1:])`` in the model's input layout."""
    if spec.kind == "random":
        rng = np.random.default_rng(spec.seed)
        return rng.uniform(spec.low, spec.high, (spec.samples, *shape[1:])).astype(np.float32)
    directory = Path(spec.path)
    files = sorted(directory.glob("*.npy")) if directory.is_dir() else []
    if not files:
        raise CalibrationError(f"{directory}: no .npy files for calibration")
    parts = []
    for f in files:
        a = np.load(f)
        if a.shape == tuple(shape[1:]):
            a = a[None]
        if a.shape[1:] != tuple(shape[1:]):
            raise CalibrationError(
                f"{f}: calibration sample shape {a.shape} does not fit the model input {tuple(shape)} (NCHW)"
            )
        parts.append(a.astype(np.float32))
    return np.concatenate(parts)[: spec.samples]


def sample_inputs(spec: CalibrationSpec, shape: tuple[int, ...], n: int, seed: int) -> np.ndarray:
    """Inputs for verification: drawn like the calibration data, from a different seed."""
    if spec.kind == "random":
        rng = np.random.default_rng(seed)
        return rng.uniform(spec.low, spec.high, (n, *shape[1:])).astype(np.float32)
    data = calibration_data(spec, shape)
    return data[:n]
