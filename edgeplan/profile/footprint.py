"""What each streaming segment holds once built, measured on this host: the resident set its build adds
(packed weights, XNNPACK's buffers, the interpreter) and its arena's span.

The FlashMem planner merges layers into segments after the load-capacity profile measured them one by one, and
a merged segment holds far less than its layers did apart — one interpreter, buffers shared: DenseNet201's
202 layers cut into 13 segments add 38 MiB built, their layers 64 MiB summed. No rule over the layers' figures
fits the 34 merged segments of ResNet50V2, InceptionV3 and DenseNet201 (the sum: up to 2.5x a segment's
measure; the weights plus the largest layer's rest: down to 0.42x; a fixed saving per merged layer: 0.64-1.6x).
So the planner measures the segments it cut, here, as the profiler measured the
layers (``capacity.measure``): in a fresh process that imports only LiteRT and numpy, the allocator set as the
streaming runtime sets it, a first interpreter built before any is measured, every segment kept once built.
The device class's load capacity was measured on this host too (``plan_flashmem`` refuses a class without it).

``python -m edgeplan.profile.footprint``: segment paths as a JSON list on stdin, ``[[built, arena], ...]`` on
stdout.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgeplan.errors import ProfileError

TIMEOUT_S = 600


def measure(paths: list[Path]) -> list[tuple[int, int]]:
    """(built bytes, arena bytes) of each segment, in order. Raises ``ProfileError`` naming what failed."""
    if not paths:
        return []
    try:
        res = subprocess.run([sys.executable, "-m", "edgeplan.profile.footprint"], capture_output=True, text=True,
                             input=json.dumps([str(p) for p in paths]), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"measuring {len(paths)} built segments took over {TIMEOUT_S} s") from None
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["no message"])[-1]
        raise ProfileError(f"measuring the built segments failed (exit {res.returncode}): {tail}")
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
        pairs = [(int(built), int(arena)) for built, arena in out]
    except (ValueError, TypeError, IndexError):
        raise ProfileError("measuring the built segments: the measuring process answered no list of pairs") from None
    if len(pairs) != len(paths):
        raise ProfileError(f"measuring the built segments: {len(pairs)} answers for {len(paths)} segments")
    return pairs


def _measure_here(paths: list[str]) -> list[tuple[int, int]]:
    from edgeplan.profile.capacity import arena_bytes, build_kept
    from edgeplan.runtime.stream import return_freed_memory

    return_freed_memory()
    blobs = [Path(p).read_bytes() for p in paths]
    kept, out = [build_kept(blobs[0])[0]], []  # first: the one-time costs of a first build
    for blob in blobs:
        it, _, added = build_kept(blob)
        out.append((added, arena_bytes(it)))
        kept.append(it)
    return out


if __name__ == "__main__":
    print(json.dumps(_measure_here(json.load(sys.stdin))))
