"""What each streaming segment holds once built, measured on this host: the resident set its build adds
(packed weights, XNNPACK's buffers, the interpreter), its arena's span, its build time and its first invoke's;
and how fast the runtime's readers read the segments cold (``Streamer.read_only``, page cache
dropped first), for when the loads planned beside a short invoke land (``merge.expected``).

The FlashMem planner merges layers into segments after the load-capacity profile measured them one by one, and
a merged segment holds far less than its layers did apart — one interpreter, buffers shared: DenseNet201's
202 layers cut into 13 segments add 38 MiB built, their layers 64 MiB summed. No rule over the layers' figures
fits the 34 merged segments of ResNet50V2, InceptionV3 and DenseNet201 (the sum: up to 2.5x a segment's
measure; the weights plus the largest layer's rest: down to 0.42x; a fixed saving per merged layer: 0.64-1.6x).
So the planner measures the segments it cut, here, as the profiler measured the
layers (``capacity.measure``): in a fresh process that imports only LiteRT and numpy, the allocator set as the
streaming runtime sets it, a first interpreter built before any is measured, every segment kept once built.
The device class's load capacity was measured on this host too (``plan_flashmem`` refuses a class without it).

A segment whose XNNPACK build takes longer than its first invoke (packing its weights costs more than running
them: VGG19's fully-connected parts) is measured built on LiteRT's reference kernels too (``litert.unpacked``),
which pack nothing — kept as a choice only if its outputs on the same seeded inputs are XNNPACK's bits;
``plan_flashmem`` picks the kernels per segment from the two.

``python -m edgeplan.profile.footprint``: ``{"paths": [segment path, ...], "unpacked": true | false}`` on stdin,
``{"segments": [[built, arena, build ms, first invoke ms], ...], "unpacked": [the same or null, ...], "read_mb_s":
rate}`` on stdout.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from edgeplan.errors import ProfileError

TIMEOUT_S = 600


@dataclass(frozen=True)
class Held:
    """What ``measure`` found: per segment (built bytes, arena bytes, build ms, first invoke ms), the same built
    on unpacked kernels (None: not measured, its XNNPACK build no longer than its invoke), and the cold read
    rate."""

    segments: list[tuple[int, int, float, float]]
    read_mb_s: float
    unpacked: list[tuple[int, int, float, float] | None] | None = None


def measure(paths: list[Path], unpacked: bool = True) -> Held:
    """What each segment holds once built and the readers' cold rate (see the module docstring); ``unpacked``
    False: no segment is tried on the reference kernels (every ``Held.unpacked`` entry None). Raises
    ``ProfileError`` naming what failed."""
    if not paths:
        return Held([], 0.0)
    try:
        res = subprocess.run([sys.executable, "-m", "edgeplan.profile.footprint"], capture_output=True, text=True,
                             input=json.dumps({"paths": [str(p) for p in paths], "unpacked": unpacked}),
                             timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"measuring {len(paths)} built segments took over {TIMEOUT_S} s") from None
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["no message"])[-1]
        raise ProfileError(f"measuring the built segments failed (exit {res.returncode}): {tail}")
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
        def figures(four) -> tuple[int, int, float, float]:
            built, arena, ms, run = four
            return int(built), int(arena), float(ms), float(run)

        held = Held([figures(x) for x in out["segments"]], float(out["read_mb_s"]),
                    [None if u is None else figures(u) for u in out["unpacked"]])
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        raise ProfileError("measuring the built segments: the measuring process answered no list of segments "
                           "and rate") from None
    if len(held.segments) != len(paths) or len(held.unpacked) != len(paths):
        raise ProfileError(f"measuring the built segments: {len(held.segments)} answers and {len(held.unpacked)} "
                           f"on unpacked kernels for {len(paths)} segments")
    if not held.read_mb_s > 0:
        raise ProfileError(f"measuring the built segments: a read rate of {held.read_mb_s} MB/s")
    return held


def _measure_here(paths: list[str], unpacked: bool) -> dict:
    import hashlib

    from edgeplan.profile.capacity import arena_bytes, build_kept
    from edgeplan.runtime import stream
    from edgeplan.runtime.fifo import drop_cache

    stream.return_freed_memory()
    blobs = [Path(p).read_bytes() for p in paths]
    # one-time costs (the first build of each kernel set this process uses) before anything is measured
    kept = [build_kept(blobs[0])[0], *([build_kept(blobs[0], unpacked=True)[0]] if unpacked else [])]
    out, alt = [], []
    for blob in blobs:
        # the heap's free pages handed back first: else the build reuses pages freed before it (the first invoke's
        # inputs, a reference build's scratch) and its delta reads short — a SqueezeNet segment once read 0 bytes
        stream.trim_heap()
        it, ms, added = build_kept(blob)
        out.append((added, arena_bytes(it), round(ms, 3), round(_first_invoke_ms(it), 3)))
        kept.append(it)
        alt.append(None)
        if unpacked and out[-1][2] > out[-1][3]:  # packing costs more than running: try the kernels that pack none
            stream.trim_heap()
            other, ms, added = build_kept(blob, unpacked=True)
            run = _first_invoke_ms(other)  # on the same seeded inputs
            if _same_outputs(it, other):  # else the segment stays on XNNPACK: a stream must give the model's bits
                alt[-1] = (added, arena_bytes(other), round(ms, 3), round(run, 3))
            kept.append(other)
    segs = [stream.Segment(Path(p), hashlib.sha256(b).hexdigest(), len(b), "", k, k)
            for k, (p, b) in enumerate(zip(paths, blobs))]
    del kept, blobs
    readers = stream.Streamer(segs, stream.schedule(segs, "serial"), lambda data: None)
    drop_cache([s.path for s in segs])
    seconds = readers.read_only()
    return {"segments": out, "unpacked": alt, "read_mb_s": sum(s.size for s in segs) / 1e6 / seconds}


def _first_invoke_ms(it) -> float:
    """The first invoke of a freshly built interpreter, on seeded random inputs as the load-capacity profiler
    times layers (what a streamed request's invoke is: its arena's pages are first touched then; ResNet50V2's
    layers alone, back to back, sum to 12 ms, its streamed invokes to 20-23)."""
    import time

    import numpy as np

    from edgeplan.profile.cpu import random_inputs

    random_inputs(it, np.random.default_rng(0))
    t = time.perf_counter()
    it.invoke()
    return (time.perf_counter() - t) * 1e3


def _same_outputs(a, b) -> bool:
    import numpy as np

    return all(np.array_equal(a.get_tensor(x["index"]), b.get_tensor(y["index"]))
               for x, y in zip(a.get_output_details(), b.get_output_details(), strict=True))


if __name__ == "__main__":
    ask = json.load(sys.stdin)
    print(json.dumps(_measure_here(ask["paths"], bool(ask["unpacked"]))))
