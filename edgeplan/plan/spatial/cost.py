"""ADaPS cost model, eqs. (1)–(11): the thresholded space of one layer's partitions and its score.

A layer's partition gives device ``d`` (in order along the dimension) the output rows ``[s_d, e_d)``. The
space (§4.3) is every partition whose sizes lie in ``[min_size_d, min_size_d + search_size_d]`` (eqs. (1)–(3)),
that leaves no row uncovered, and whose neighbours share fewer rows than the smaller of their minimum sizes
(so starts and ends both increase with ``d``). Sharing rows is the overlap a Type 1 layer may buy to need fewer
rows from its neighbours (Fig. 1).

The score of a layer (eq. (11)) is ``t_comp + t_data + t_ov``: the slowest device's time for its rows (eqs. (4)–
(5)), the rows it needs of the layer's input and does not hold, over its bandwidth (eqs. (6)–(8)), and the
shared rows at the speed of each device computing them (eqs. (9)–(10)). Eq. (12) attaches the data between
layers ``l`` and ``l+1`` to layer ``l``; here it is attached to the layer that needs it (the same sum), so a
layer's score reads its input holder: the previous layer's partition, or for the first layer the head, which
holds the whole input and sends the others the rows they read (``source``; the paper leaves the input's
distribution out: here it is measured traffic, so it is scored).

Times are seconds. ``speed_d`` is not entered by hand: a device's seconds per MAC and per layer come from a
linear fit of its class's measured layer times on their MACs (``fit_speed``).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from edgeplan.errors import PlanError
from edgeplan.plan.spatial.intervals import Interval, Window, missing

Partition = tuple[Interval, ...]


class Joined(tuple):
    """The holders of a merge layer's inputs (path analysis: a residual ``Add``), one partition per input of one
    row size: the rows a device lacks are counted in each."""


@dataclass(frozen=True)
class Device:
    name: str
    s_per_mac: float  # slope of the fit: 1 / speed_d
    bytes_per_s: float  # BW_d, the device's link
    s_per_layer: float = 0.0  # intercept of the fit: what a layer costs however few rows it has

    def __post_init__(self) -> None:
        if not (self.s_per_mac > 0 and self.bytes_per_s > 0 and self.s_per_layer >= 0):
            raise PlanError(f"device {self.name!r}: speed and bandwidth must be positive (got {self})")


def fit_speed(macs: np.ndarray, seconds: np.ndarray, layers=None) -> tuple[float, float]:
    """Seconds per MAC and per layer: a least-squares line through measured (MACs, seconds) of conv layers. With
    ``layers`` (which conv each point was measured on: each at several row counts) the slope is fitted within
    each conv, every conv with its own intercept, and the per-layer seconds are the median of those intercepts:
    a partition changes a conv's rows, not which conv it is, and convs differ in seconds per MAC by their shapes
    (tiny_cnn's 3-channel first conv costs ~10x per MAC what its later ones do, which tilted one line through all
    the points negative on one host)."""
    macs, seconds = np.asarray(macs, float), np.asarray(seconds, float)
    if macs.size < 2 or np.ptp(macs) == 0:
        raise PlanError(f"a speed fit needs layers of at least two sizes (got {macs.size} layer times)")
    if layers is None:
        slope, intercept = np.polyfit(macs, seconds, 1)
    else:
        keys = np.asarray(layers)
        groups = [keys == k for k in dict.fromkeys(keys.tolist())]
        dm = np.concatenate([macs[g] - macs[g].mean() for g in groups])
        ds = np.concatenate([seconds[g] - seconds[g].mean() for g in groups])
        if not dm.any():
            raise PlanError("a speed fit needs a conv measured at two or more row counts")
        slope = float(dm @ ds / (dm @ dm))
        intercept = float(np.median([seconds[g].mean() - slope * macs[g].mean() for g in groups]))
    if slope <= 0:
        raise PlanError(f"measured layer times do not grow with MACs (slope {slope:.3g} s/MAC): re-profile")
    return float(slope), float(max(intercept, 0.0))


@dataclass(frozen=True)
class Layer:
    """A partitionable layer: one Type 1 op (or a leading Type 2 op) and the Type 2 ops after it."""

    name: str
    window: Window  # input rows from output rows, along the partitioned dimension
    macs: int  # the whole layer's work
    in_row_bytes: int  # one input row (int8: one byte per element)
    out_row_bytes: int

    @property
    def out_size(self) -> int:
        return self.window.out_size


def check_rows(size: int, devices: int, where: str = "") -> None:
    """Every device needs at least one row of a layer it shares."""
    if devices > size:
        raise PlanError(f"{devices} devices but {where or 'the layer'} has only {size} rows to share")


@dataclass(frozen=True)
class Space:
    """The thresholded partitions of one layer (eqs. (1)–(3)); ``overlap`` False: neighbours share no row.

    Always holds the proportional split (rounded), so it is never empty."""

    size: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    overlap: bool = True

    @classmethod
    def of(cls, size: int, devices: tuple[Device, ...], threshold: float, *, overlap: bool = True,
           where: str = "") -> Space:
        n = len(devices)
        if not 0 < threshold <= 1:
            raise PlanError(f"threshold {threshold} is outside (0, 1]")
        check_rows(size, n, where)
        speed = np.array([1.0 / d.s_per_mac for d in devices])
        lo = [max(int(size * s / speed.sum()), 1) for s in speed]  # eq. (1)
        max_size = size - (n - 1)  # eq. (2)
        hi = [min(lo_d + int((max_size - lo_d) * threshold), max_size) for lo_d in lo]  # eq. (3)
        # The floors of eq. (1) can leave rows no device may take at a small threshold: the rounded
        # proportional split is always in the space.
        hi = [max(h, e - s) for h, (s, e) in zip(hi, proportional(size, devices))]
        return cls(size, tuple(lo), tuple(hi), overlap)

    @property
    def devices(self) -> int:
        return len(self.lo)

    def shared_max(self, d: int) -> int:
        """Most rows device ``d`` may share with device ``d-1``."""
        return min(self.lo[d - 1], self.lo[d]) - 1 if self.overlap and d else 0

    def starts(self, d: int, e_prev: int) -> range:
        """Starts of device ``d`` after a device ending at ``e_prev``, in tree order: no shared row first."""
        if d == 0:
            return range(1)
        return range(e_prev, e_prev - self.shared_max(d) - 1, -1)

    def ends(self, d: int, s: int) -> range:
        """Ends of device ``d`` starting at ``s``, in tree order: growing sizes. The last device ends at the edge."""
        if d == self.devices - 1:
            return range(self.size, self.size + 1) if self.lo[d] <= self.size - s <= self.hi[d] else range(0)
        last = min(s + self.hi[d], self.size - (self.devices - 1 - d))
        return range(s + self.lo[d], last + 1)

    @cached_property
    def completions(self) -> list[list[int]]:
        """``completions[d][e]``: ways devices ``d..D-1`` can finish after a device ending at ``e`` (counted)."""
        n, m = self.devices, self.size
        table = [[0] * (m + 1) for _ in range(n + 1)]
        table[n][m] = 1
        for d in range(n - 1, -1, -1):
            for e_prev in range(m + 1) if d else (0,):
                table[d][e_prev] = sum(table[d + 1][e] for s in self.starts(d, e_prev) for e in self.ends(d, s))
        return table

    def count(self) -> int:
        """How many partitions the space holds (checked against ``enumerate`` on small spaces)."""
        return self.completions[0][0]

    def feasible(self, d: int, e_prev: int) -> bool:
        return self.completions[d][e_prev] > 0

    def enumerate(self) -> Iterator[Partition]:
        def walk(d: int, e_prev: int, head: Partition) -> Iterator[Partition]:
            if d == self.devices:
                yield head
                return
            for s in self.starts(d, e_prev):
                for e in self.ends(d, s):
                    if self.feasible(d + 1, e):
                        yield from walk(d + 1, e, head + ((s, e),))

        return walk(0, 0, ())


def proportional(size: int, devices: tuple[Device, ...]) -> Partition:
    """Rows in proportion to speed, no overlap: the ideal split of eq. (1) with its rounding spread."""
    speed = np.array([1.0 / d.s_per_mac for d in devices])
    n = len(devices)
    edges, prev = [], 0
    for d, x in enumerate(np.round(np.cumsum(speed) / speed.sum() * size).astype(int)):
        prev = min(max(int(x), prev + 1), size - (n - 1 - d))  # every device at least one row
        edges.append(prev)
    return tuple(zip([0, *edges[:-1]], edges))


def equal(size: int, n: int) -> Partition:
    edges = [round(size * (d + 1) / n) for d in range(n)]
    return tuple(zip([0, *edges[:-1]], edges))


class LayerCost:
    """Eqs. (4)–(11) for one layer on one set of devices."""

    def __init__(self, layer: Layer, devices: tuple[Device, ...]):
        self.layer = layer
        self.devices = devices
        per_row = layer.macs / layer.out_size
        self.row_s = np.array([per_row * d.s_per_mac for d in devices])  # eq. (4): 1 / (speed_d per row)
        self.fixed_s = np.array([d.s_per_layer for d in devices])
        self.bw = np.array([d.bytes_per_s for d in devices])

    def comp(self, d: int, s: int, e: int) -> float:
        """Eq. (4): device ``d``'s time for output rows ``[s, e)``."""
        return float(self.fixed_s[d] + (e - s) * self.row_s[d])

    def rows_in(self, d: int, s: int, e: int, holder: Partition | None) -> int:
        """Eqs. (6)–(7): input rows device ``d`` needs for ``[s, e)`` and does not hold."""
        if holder is None:
            return 0
        return sum(sum(missing(self.layer.window.needs((s, e)), held[d])) for held in _parts(holder))

    def data(self, d: int, s: int, e: int, holder: Partition | None) -> float:
        """Eq. (8), device ``d``'s term."""
        return self.rows_in(d, s, e, holder) * self.layer.in_row_bytes / float(self.bw[d])

    @cached_property
    def _hull(self) -> tuple[np.ndarray, np.ndarray]:
        """``first[s]``, ``last[e]``: the first input row that output rows from ``s`` read, and the row after the
        last one that output rows up to ``e`` read. For an interval of at least ``dilation`` rows ``window.needs``
        is ``(first[s], last[e])``; -1 where a short interval reads only padding."""
        w = self.layer.window
        first, last = np.full(w.out_size, -1), np.full(w.out_size + 1, -1)
        for r in range(w.out_size):
            for at, interval, side in ((first, (r, min(r + w.dilation, w.out_size)), 0),
                                       (last, (max(r + 1 - w.dilation, 0), r + 1), 1)):
                try:
                    at[r + side] = w.needs(interval)[side]
                except ValueError:
                    pass
        return first, last

    def data_grid(self, d: int, s: np.ndarray, e: np.ndarray, holder: Partition | None) -> np.ndarray:
        """``data(d, s, e, holder)`` over arrays of starts and ends (broadcast; every ``s < e``), at numpy speed.
        An interval no ``needs`` can be read for (it reads only padding) gets 0 rows: the caller takes bounds."""
        s, e = np.broadcast_arrays(np.asarray(s), np.asarray(e))
        if holder is None:
            return np.zeros(s.shape)
        first, last = self._hull
        ns, ne = first[s], last[e]
        exact = (e - s >= self.layer.window.dilation) & (ns >= 0) & (ne >= 0)
        rows = np.zeros(s.shape, dtype=np.int64)
        for held in _parts(holder):
            hs, he = held[d]
            # intervals.missing, before and after the held rows, over arrays
            rows += np.where(ns < hs, np.maximum(np.minimum(hs, ne) - ns, 0), 0)
            rows += np.where(ne > he, np.maximum(ne - np.maximum(ns, he), 0), 0)
        for at in zip(*np.nonzero(~exact)):  # short intervals under a dilation, and padding: one by one
            try:
                rows[at] = self.rows_in(d, int(s[at]), int(e[at]), holder)
            except ValueError:
                rows[at] = 0
        return rows * self.layer.in_row_bytes / float(self.bw[d])

    def shared(self, d: int, rows: int) -> float:
        """Eqs. (9)–(10) for a band of ``rows`` devices ``d-1`` and ``d`` both compute."""
        return rows * float(self.row_s[d - 1] + self.row_s[d])

    def t_data(self, p: Partition, holder: Partition | None) -> float:
        """Eq. (8)."""
        return sum(self.data(d, s, e, holder) for d, (s, e) in enumerate(p))

    def score(self, p: Partition, holder: Partition | None) -> float:
        """Eq. (11)."""
        t_comp = max(self.comp(d, s, e) for d, (s, e) in enumerate(p))
        t_ov = sum(self.shared(d, max(p[d - 1][1] - p[d][0], 0)) for d in range(1, len(p)))
        return t_comp + self.t_data(p, holder) + t_ov

    def bytes_in(self, p: Partition, holder: Partition | None) -> int:
        return sum(self.rows_in(d, s, e, holder) for d, (s, e) in enumerate(p)) * self.layer.in_row_bytes


def _parts(holder: Partition) -> Iterator[Partition]:
    """The partitions a holder is made of: itself, or each input's of a ``Joined`` one."""
    if isinstance(holder, Joined):
        for h in holder:
            yield from _parts(h)
    else:
        yield holder


def next_data(nxt: LayerCost, d: int, s: int, e: int, following: Partition) -> float:
    """The next layer's eq. (8) term for device ``d`` when it holds rows ``[s, e)`` of that layer's input."""
    rows = sum(missing(nxt.layer.window.needs(following[d]), (s, e)))
    return rows * nxt.layer.in_row_bytes / float(nxt.bw[d])


def source(cost: LayerCost) -> Partition:
    """Who holds the first layer's input: the head (device 0) all of it, the others none. The rows another
    device's first tile reads are sent to it (the scatter), over its link like any other rows."""
    return ((0, cost.layer.window.in_size),) + ((0, 0),) * (len(cost.devices) - 1)


def holder_of(costs: list[LayerCost], plan: list[Partition], i: int, entry: Partition | None = None) -> Partition:
    """The holder of layer ``i``'s input: the previous layer's partition; for the first layer ``entry`` (who holds
    a sub-block's input: ``paths``), by default the head."""
    return plan[i - 1] if i else entry if entry is not None else source(costs[0])


def network_score(costs: list[LayerCost], plan: list[Partition], entry: Partition | None = None) -> float:
    """Eq. (12) unrolled: every layer's score, each reading its input's holder (the scatter included)."""
    return sum(c.score(p, holder_of(costs, plan, i, entry)) for i, (c, p) in enumerate(zip(costs, plan)))


def network_bytes(costs: list[LayerCost], plan: list[Partition]) -> int:
    """Bytes the plan moves between devices inside the region (eqs. (6)–(7) rows times row bytes)."""
    return sum(c.bytes_in(p, plan[i - 1]) for i, (c, p) in enumerate(zip(costs, plan)) if i)
