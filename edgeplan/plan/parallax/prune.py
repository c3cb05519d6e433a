"""Parallax's delegate pruning (§3.1, Appendix B) for the Edge TPU: with ``compile.allow_multiple_subgraphs`` the
compiler maps every run of supported ops, however small; a region is worth the accelerator only if

    N >= 3  and  L + F / R_acc + B / B_bw  <  F / R_cpu

with N its ops, F its MACs (an op without multiply-accumulates counts its Table 8 FLOPs), B the bytes of its
boundary tensors; L and R_acc = peak x efficiency from the emulated Edge TPU's fit (its fixed overhead and
efficiency: EMULATED), B_bw the device class's link, R_cpu the CPU's measured MAC rate. A pruned region goes back
to the CPU. Beside it, the paper's relaxed constants (F >= 1e9 MACs, B / F <= 0.1 bytes per MAC) and both
simplified bounds, §3.1's F > L R_acc and Appendix B's F > L R_cpu (they disagree; the full inequality is what
decides here).
"""
from __future__ import annotations

from dataclasses import dataclass

from edgeplan.compile import edgetpu_ops
from edgeplan.compile.emulated import place_ops
from edgeplan.graph.branches import tflite_flops
from edgeplan.quantize.stream import ops_boundary
from edgeplan.quantize.tflite_graph import TfliteGraph, tensor_bytes

RELAXED_MIN_MACS = 1e9
RELAXED_MAX_BYTES_PER_MAC = 0.1


@dataclass(frozen=True)
class Region:
    index: int
    ops: tuple[int, ...]
    macs: int
    boundary_bytes: int
    offload_ms: float  # EMULATED: L + F / R_acc + B / B_bw
    cpu_ms: float  # F / R_cpu, R_cpu measured
    keep: bool
    why: str
    relaxed_keep: bool  # the paper's constants


@dataclass(frozen=True)
class Bounds:
    """The two simplified compute bounds, MACs: §3.1's L x R_acc and Appendix B's L x R_cpu."""

    l_r_acc: float
    l_r_cpu: float


def mapped_regions(graph: TfliteGraph, beyond_prefix: bool = False) -> list[tuple[int, ...]]:
    """Runs of consecutive ops the (emulated) compiler maps, multiple subgraphs allowed: each one region (a run of
    consecutive ops in a topological order is convex). ``beyond_prefix``: only ops it maps *because* several
    subgraphs are allowed (those a one-subgraph compile maps are the SwapLess prefix's to take or leave)."""
    prefix = ({p.index for p in place_ops(graph) if p.status == edgetpu_ops.MAPPED} if beyond_prefix else set())
    runs: list[list[int]] = []
    previous = False
    for p in place_ops(graph, allow_multiple_subgraphs=True):
        mapped = p.status == edgetpu_ops.MAPPED and p.index not in prefix
        if mapped and not previous:
            runs.append([])
        if mapped:
            runs[-1].append(p.index)
        previous = mapped
    return [tuple(r) for r in runs]


def prune(graph: TfliteGraph, *, overhead_ms: float, acc_macs_per_s: float, link_bytes_per_s: float,
          cpu_macs_per_s: float, runs: list[tuple[int, ...]] | None = None) -> tuple[list[Region], Bounds]:
    """Every mapped region (``runs``, default ``mapped_regions``) with the decision and its terms."""
    if min(acc_macs_per_s, link_bytes_per_s, cpu_macs_per_s) <= 0 or overhead_ms < 0:
        raise ValueError("rates must be positive and the overhead not negative")
    flops = tflite_flops(graph)
    out = []
    for k, ops in enumerate(mapped_regions(graph) if runs is None else runs):
        macs = sum(graph.op_macs[i] or flops[i] for i in ops)
        ins, outs = ops_boundary(graph, ops)
        b = sum(tensor_bytes(graph, x) for x in (*ins, *outs))
        offload = overhead_ms + 1e3 * (macs / acc_macs_per_s + b / link_bytes_per_s)
        cpu = 1e3 * macs / cpu_macs_per_s
        if len(ops) < 3:
            keep, why = False, f"{len(ops)} ops (< 3)"
        elif offload < cpu:
            keep, why = True, f"offload {offload:.3f} ms < CPU {cpu:.3f} ms"
        else:
            keep, why = False, f"offload {offload:.3f} ms >= CPU {cpu:.3f} ms"
        relaxed = len(ops) >= 3 and macs >= RELAXED_MIN_MACS and b <= RELAXED_MAX_BYTES_PER_MAC * macs
        out.append(Region(k, ops, macs, b, offload, cpu, keep, why, relaxed))
    l_s = overhead_ms / 1e3
    return out, Bounds(l_s * acc_macs_per_s, l_s * cpu_macs_per_s)


def region_map(regions: list[Region]) -> dict[int, int]:
    """Op index -> region id for the regions kept (``graph.branches.from_tflite``'s ``regions``)."""
    return {i: r.index for r in regions if r.keep for i in r.ops}
