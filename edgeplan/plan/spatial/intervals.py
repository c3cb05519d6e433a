"""Which input rows an output interval needs (ADaPS §3.2–3.3, Fig. 1): intervals are half-open ``[s, e)`` along
the partitioned dimension (H or W), origin at the top-left.

A Type 1 op's output row ``o`` reads input rows ``o*stride - pad_begin + j*dilation`` for ``j < kernel``; rows
outside ``[0, in_size)`` are padding. TF/ONNX SAME padding puts ``pad_total // 2`` before (SAME_UPPER; ONNX's
SAME_LOWER puts the larger half before). A Type 2 op is the identity window.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Interval = tuple[int, int]


@dataclass(frozen=True)
class Window:
    kernel: int = 1
    stride: int = 1
    dilation: int = 1
    pad_begin: int = 0
    pad_end: int = 0
    in_size: int = 1
    out_size: int = 1

    def __post_init__(self) -> None:
        if min(self.kernel, self.stride, self.dilation, self.in_size, self.out_size) < 1:
            raise ValueError(f"window {self} has a non-positive size")
        span = (self.kernel - 1) * self.dilation + 1
        expected = (self.in_size + self.pad_begin + self.pad_end - span) // self.stride + 1
        if expected < self.out_size:
            raise ValueError(f"window {self} gives {expected} output rows, not {self.out_size}")

    @classmethod
    def identity(cls, size: int) -> Window:
        return cls(in_size=size, out_size=size)

    @classmethod
    def same(cls, kernel: int, stride: int, in_size: int, dilation: int = 1, *, lower: bool = False) -> Window:
        """SAME padding as TensorFlow computes it (``lower``: ONNX SAME_LOWER)."""
        out = math.ceil(in_size / stride)
        total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - in_size, 0)
        begin = (total + 1) // 2 if lower else total // 2
        return cls(kernel, stride, dilation, begin, total - begin, in_size, out)

    def needs(self, out: Interval) -> Interval:
        """The input rows (the hull of those inside the tensor) that output rows ``[s, e)`` read."""
        s, e = out
        if not 0 <= s < e <= self.out_size:
            raise ValueError(f"output interval {out} outside [0, {self.out_size})")
        taps = range(self.kernel)
        # with a dilation a window's first taps may fall in the padding and skip rows: look at as many
        # windows from each end as it takes for the pattern to repeat
        near = range(s, min(e, s + self.dilation))
        far = range(max(s, e - self.dilation), e)
        firsts = [r for o in near for j in taps if 0 <= (r := o * self.stride - self.pad_begin + j * self.dilation)
                  < self.in_size]
        lasts = [r for o in far for j in taps if 0 <= (r := o * self.stride - self.pad_begin + j * self.dilation)
                 < self.in_size]
        if not firsts or not lasts:
            raise ValueError(f"output rows {out} of {self} read only padding")
        return min(firsts), max(lasts) + 1

    def pads(self, out: Interval) -> tuple[int, int]:
        """Padding rows a tile computing ``out`` from ``needs(out)`` must add before and after."""
        s, e = out
        lo = s * self.stride - self.pad_begin
        hi = (e - 1) * self.stride - self.pad_begin + (self.kernel - 1) * self.dilation + 1
        return max(-lo, 0), max(hi - self.in_size, 0)


def chain_needs(windows: list[Window], out: Interval) -> Interval:
    """Input rows of the first window that rows ``out`` of the last one need, through every window between."""
    for w in reversed(windows):
        out = w.needs(out)
    return out


def missing(need: Interval, held: Interval | None) -> tuple[int, int]:
    """ADaPS eqs. (6)–(7): rows of ``need`` before and after the rows ``held`` (the dependencies, Fig. 1 blue).

    ``held`` None: the device holds none of the tensor, so every needed row is missing (counted as "before").
    """
    ns, ne = need
    if held is None:
        return ne - ns, 0
    hs, he = held
    before = min(hs, ne) - ns if ns < hs else 0
    after = ne - max(ns, he) if ne > he else 0
    return max(before, 0), max(after, 0)


def overlaps(partition: tuple[Interval, ...]) -> list[int]:
    """ADaPS eq. (9): rows each device computes that a neighbour also computes (Fig. 1 yellow).

    The paper writes the last device's term as ``s_D - e_{D-1}``, negative for an overlap; the size of the
    shared band ``e_{D-1} - s_D`` is what it means, and is used here for every neighbour pair.
    """
    shared = [max(partition[d][1] - partition[d + 1][0], 0) for d in range(len(partition) - 1)]
    return [(shared[d - 1] if d > 0 else 0) + (shared[d] if d < len(shared) else 0) for d in range(len(partition))]
