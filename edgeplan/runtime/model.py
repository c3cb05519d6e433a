"""One model of an active revision as the runtime serves it: its segments by point, input/output
quantization, the profile's service times, and the SwapLess model spec. numpy + ai-edge-litert only."""
from __future__ import annotations

import json
import random
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeplan.bundle.manifest import Manifest, ModelEntry, Quantization
from edgeplan.errors import EdgeplanError
from edgeplan.plan.swapless.from_profiles import model_spec
from edgeplan.plan.swapless.instance import ModelSpec
from edgeplan.plan.swapless.plan import SwapLessPlan
from edgeplan.profile.schema import Profile


class BadRequest(EdgeplanError):
    """A request the runtime cannot serve as sent (wrong shape, dtype, unknown model)."""


def load_plan(rev_dir: Path, manifest: Manifest) -> SwapLessPlan:
    return SwapLessPlan.from_json(json.loads((Path(rev_dir) / manifest.plan).read_text()))


def segment_dir(rev_dir: Path, entry: ModelEntry, point: int) -> Path:
    return Path(rev_dir) / "models" / entry.name / entry.version / "segments" / f"p{point}"


def segment_paths(rev_dir: Path, entry: ModelEntry, point: int) -> tuple[Path | None, Path | None]:
    """(prefix_int8, suffix_int8) of ``point``: no prefix at 0 (all CPU), no suffix at P (all TPU)."""
    base = segment_dir(rev_dir, entry, point)
    return (base / "prefix_int8.tflite" if point > 0 else None,
            base / "suffix_int8.tflite" if point < entry.points else None)


def quantize_input(x: np.ndarray, q: Quantization) -> np.ndarray:
    """A float request in the model's float layout -> the int8 model's input tensor, C-ordered (~0.6 ms for a
    224x224x3 image here: the transposing read dominates). An input already in the int8 model's dtype and
    shape (a client that quantized it, e.g. a camera pipeline producing the model's tensor) is taken as it is."""
    x = np.asarray(x)
    if x.dtype == np.dtype(q.dtype) and tuple(x.shape) in (tuple(q.shape), tuple(q.shape[1:])):
        return np.ascontiguousarray(x.reshape(q.shape))
    if x.ndim == len(q.float_shape) - 1:
        x = x[None]
    if tuple(x.shape) != tuple(q.float_shape):
        raise BadRequest(f"input shape {tuple(x.shape)}; the model takes {tuple(q.float_shape)} (float, "
                         f"{'NCHW' if len(q.float_shape) == 4 else 'its layout'})")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise BadRequest(f"input dtype {x.dtype}; send real numbers (float32)")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise BadRequest(f"input holds {int(np.sum(~np.isfinite(x)))} NaN or infinite values; send finite numbers")
    info = np.iinfo(np.dtype(q.dtype))
    # one C-ordered float buffer in the int8 layout, divided into from the float layout's transposed view, rounded
    # and clipped in place (bit-equal to round(x / scale + zero) of the converter's reference; an int8 transpose
    # is slower). C order: the fingerprint and the interpreter read it without another copy.
    buf = np.empty(q.shape, np.float32)
    np.divide(x.transpose(q.to_int8_layout) if q.to_int8_layout else x.reshape(q.shape), np.float32(q.scale), out=buf)
    buf += np.float32(q.zero_point)
    np.rint(buf, out=buf)
    np.clip(buf, info.min, info.max, out=buf)
    return buf.astype(q.dtype)


def dequantize_output(y: np.ndarray, q: Quantization) -> np.ndarray:
    """The int8 model's output -> float in the ONNX model's layout."""
    out = (y.astype(np.float32) - q.zero_point) * np.float32(q.scale)
    if q.to_int8_layout:
        out = out.transpose(np.argsort(q.to_int8_layout))
    return out.reshape(q.float_shape)


def input_key(q: np.ndarray) -> int:
    """A cheap fingerprint of an int8 input: crc32 of every 61st byte (~5 us for a 224x224x3 image, against
    ~80 us for all of it); the emulated accelerator confirms a hit by comparing the whole input."""
    return zlib.crc32(np.ascontiguousarray(q).reshape(-1)[::61].tobytes())


@dataclass
class ServedModel:
    """A model's segments, timings and quantization. Segment bytes are read once per point; interpreters
    are per thread (a LiteRT interpreter is not thread-safe)."""

    entry: ModelEntry
    rev_dir: Path
    profile: Profile
    spec: ModelSpec
    preload: frozenset[int]
    _bytes: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    misses: int = 0  # partitions loaded from disk at serving time (not preloaded)

    @classmethod
    def load(cls, rev_dir: Path, entry: ModelEntry, rate: float, preload, edgetpu: bool = True) -> ServedModel:
        """``edgetpu`` False: the device has no Edge TPU (no prefix is ever chosen)."""
        profile = Profile.from_json(json.loads((Path(rev_dir) / entry.profile).read_text()))
        spec = model_spec(entry.name, rate, profile, f"{rev_dir / entry.profile}", edgetpu, entry.excluded_points)
        m = cls(entry, Path(rev_dir), profile, spec, frozenset(preload))
        for p in m.preload:
            m.segment(p, "suffix", count=False)
            m.segment(p, "prefix", count=False)
        return m

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def last(self) -> int:
        return self.entry.points

    def segment(self, point: int, role: str, count: bool = True) -> bytes | None:
        """The int8 segment's bytes (None where the point has no such segment)."""
        key = (point, role)
        with self._lock:
            if key not in self._bytes:
                prefix, suffix = segment_paths(self.rev_dir, self.entry, point)
                path = prefix if role == "prefix" else suffix
                self._bytes[key] = path.read_bytes() if path is not None else None
                if count and path is not None:
                    self.misses += 1
            return self._bytes[key]

    def tpu_service_s(self, point: int, rng: random.Random) -> float:
        """One prefix service time on the (emulated) Edge TPU: a draw from the profile's samples (s^TPU +
        d/B), else its mean."""
        samples = self.spec.tpu_samples[point]
        base = rng.choice(samples) if samples else self.spec.s_tpu[point]
        return base + self.spec.io[point]

    def load_s(self, point: int) -> float:
        return self.spec.t_load[point]

    def footprint(self, point: int) -> int:
        return self.spec.footprint[point]


def load_inputs(rev_dir: Path, entry: ModelEntry, n: int = 8, seed: int = 0) -> list[np.ndarray]:
    """The finite input set a load test uses and ``serve`` computes prefixes for ahead: the model's
    self-test inputs, then seeded uniform [-1, 1] inputs of its float shape, ``n`` in all."""
    xs = [np.load(Path(rev_dir) / t.input, allow_pickle=False) for t in entry.selftests][:n]
    rng = np.random.default_rng(seed)
    while len(xs) < n:
        xs.append(rng.uniform(-1, 1, entry.input.float_shape).astype(np.float32))
    return xs
