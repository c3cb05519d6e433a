"""Before a model is read, and again before it is converted: an estimate of the peak memory each stage of
``edgeplan compile`` needs, from the model's size, checked against what the machine has available
(``MemAvailable`` of /proc/meminfo) or the limit given (``--max-memory``; params.yaml ``ingest.max_memory_bytes``).
A model that would not fit is refused in one line naming the stage and the figure, before the machine runs out
(and before anything of the model is written).

The estimate of a stage is the sum over the processes it runs at once of their baseline (the process with its
libraries imported) and their measured growth per float parameter byte (the largest over the six models of
``bench/compile_memory.py``, rounded up), so it errs on the high side. The conversion grows with its largest piece,
not with the model (``quantize/pieces``), and with the piece's activations as well as its parameters once the model
is known (ResNet152V2 at 299 holds more than twice as many activation bytes as parameter bytes); the other stages
are estimated from the parameters alone.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from edgeplan.errors import InsufficientMemoryError

GB = 1e9
# Baselines measured by bench/compile_memory.py (fresh processes, libraries imported): the compile process and a
# TensorFlow child; ingest starts before the compile process has imported its libraries.
COMPILE_BASE = 0.75 * GB
CHILD_BASE = 0.72 * GB
START_BASE = 0.1 * GB
# Growth per float parameter byte (bench/compile_memory.py, the largest over its models, rounded up).
INGEST_PER_BYTE = 6.0  # the ingest child converting a Keras model (Keras loads every variable, then the weights)
HELD_PER_BYTE = 1.5  # the compile process during the conversion: the ONNX model and its view
CONVERSION_PER_BYTE = 14.0  # a conversion child, per float parameter byte of the piece it converts
# ... and per float activation byte of it: ResNet152V2's largest piece by parameters alone held 1.98 GB for 126 MB
# of parameters and 452 MB of activations (3.4 per byte of both)
CONVERSION_PER_ACTIVATION_BYTE = 3.5
IN_PROCESS_PER_BYTE = {"matching": 5.0, "cutting": 4.0, "verify": 4.0}  # the compile process


def estimate(parameter_bytes: int, children: Sequence[tuple[int, int]] | None = None) -> dict[str, float]:
    """Estimated peak RSS of each stage's processes together, bytes, for a model of ``parameter_bytes`` float
    parameters converted by children each converting ``(parameter bytes, activation bytes)`` (``Piece.child``; the
    costliest sets the figure; None: the whole model in one, its activations not counted)."""
    p = float(parameter_bytes)
    growth = max((conversion_growth(q, a) for q, a in children), default=0.0) if children else conversion_growth(p)
    out = {"ingest": START_BASE + CHILD_BASE + INGEST_PER_BYTE * p,
           "int8 conversion": COMPILE_BASE + HELD_PER_BYTE * p + CHILD_BASE + growth}
    out.update({stage: COMPILE_BASE + k * p for stage, k in IN_PROCESS_PER_BYTE.items()})
    return out


def conversion_growth(parameter_bytes: float, activation_bytes: float = 0) -> float:
    """A conversion child's estimated growth above its baseline for a piece of these float bytes."""
    return CONVERSION_PER_BYTE * parameter_bytes + CONVERSION_PER_ACTIVATION_BYTE * activation_bytes


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo, bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check(parameter_bytes: int, where: str, limit: int | None = None,
          children: Sequence[tuple[int, int]] | None = None, stages: tuple[str, ...] | None = None,
          step: str = "nothing") -> None:
    """Raise InsufficientMemoryError when a stage's estimate is above ``limit`` (default: what is available);
    ``step`` names what is then not started."""
    given = limit is not None
    cap = limit if given else available_bytes()
    if cap is None:
        return
    est = {s: v for s, v in estimate(parameter_bytes, children).items()
           if stages is None or s in stages}
    if not est:
        return
    stage = max(est, key=est.get)
    if est[stage] > cap:
        whose = "the limit given (--max-memory / ingest.max_memory_bytes)" if given else (
            "what this machine has available (MemAvailable)")
        raise InsufficientMemoryError(
            f"{where}: its {stage} stage is estimated to need {est[stage] / GB:.1f} GB at its peak (for "
            f"{parameter_bytes / 1e6:,.{1 if parameter_bytes < 1e7 else 0}f} MB of float parameters), above {whose}: "
            f"{cap / GB:.1f} GB; {step} was started. Free memory, use a machine with more, or give --max-memory if "
            "the estimate is too high.")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"20G"``, ``"512M"``, ``"1.5GB"``, ``"16GiB"`` or a number of bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 16G, 512M, 1.5GB or bytes)")
    unit = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * unit)
