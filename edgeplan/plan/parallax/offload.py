"""Edge TPU regions inside a served CPU suffix (Parallax §3.1, Appendix B, under a SwapLess partition).

With ``compile.allow_multiple_subgraphs`` the compiler also maps the runs of ops that come after the first op
ending the Edge TPU prefix. Those a one-subgraph compile maps are the SwapLess point's to take or leave; the
others are candidate regions, and delegate pruning (``prune``) keeps one only where N >= 3 and
L + F / R_acc + B / B_bw < F / R_cpu — L, R_acc and B_bw from the EMULATED Edge TPU the class's profile was made
with, R_cpu the suffix's MACs over its measured 1-thread time.

The suffix then runs as stages over its structure with the kept regions contracted (``graph/branches``): a layer
holding a region is one stage, each region a sub-model the runtime hands to the accelerator (EMULATED: held on
the device's FCFS clock for its offload time) while the layer's other branches run as one CPU sub-model on W
threads; every run of layers between is one sub-model on W threads. A request then visits the Edge TPU twice
(its prefix, then these regions), which the SwapLess model does not cover: one-model deployments only.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgeplan.graph.branches import from_tflite, structure, tflite_flops
from edgeplan.plan.parallax.prune import Bounds, Region, mapped_regions, prune, region_map
from edgeplan.plan.parallax.schedule import stage_plan
from edgeplan.quantize.tflite_graph import TfliteGraph


@dataclass(frozen=True)
class OffloadStage:
    """A stage of the suffix: op indices per sub-model, each run at once with the others; ``offload_ms`` per
    sub-model is its EMULATED hold on the accelerator, None for a CPU sub-model (on ``threads``)."""

    layer: int | None
    submodels: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]  # tensor indices per sub-model
    peak_bytes: tuple[int, ...]
    offload_ms: tuple[float | None, ...]
    threads: tuple[int, ...]


def regions(graph: TfliteGraph, tpu: dict, cpu_ms_1t: float) -> tuple[list[Region], Bounds]:
    """The suffix's candidate regions with pruning's decision; ``tpu``: a profile's ``tpu_model`` (EMULATED:
    ``overhead_ms``, ``peak_macs_per_s``, ``efficiency``, ``link_bytes_per_s``); ``cpu_ms_1t``: the suffix's
    measured time on one thread."""
    if not cpu_ms_1t > 0:
        raise ValueError(f"the suffix's 1-thread time must be positive, not {cpu_ms_1t!r}")
    flops = tflite_flops(graph)
    macs = sum(graph.op_macs[i] or flops[i] for i in range(len(graph.ops)))
    return prune(graph, overhead_ms=float(tpu["overhead_ms"]),
                 acc_macs_per_s=float(tpu["peak_macs_per_s"]) * float(tpu["efficiency"]),
                 link_bytes_per_s=float(tpu["link_bytes_per_s"]), cpu_macs_per_s=macs / (cpu_ms_1t / 1e3),
                 runs=mapped_regions(graph, beyond_prefix=True))


def stages(graph: TfliteGraph, kept: list[Region], workers: int) -> list[OffloadStage]:
    """The suffix as stages around its kept regions (see the module)."""
    of = region_map(kept)
    hold = {r.index: r.offload_ms for r in kept}
    s = structure(from_tflite(graph, of))
    groups: list[tuple[int | None, list[list[int]], list[float | None]]] = []
    run: list[int] = []
    for k, layer in enumerate(s.layers):
        branches = [s.branches[b] for b in layer]
        held = [b for b in branches if b.kind == "region"]
        if not held:
            run.extend(v for b in branches for v in b.nodes)
            continue
        if run:
            groups.append((None, [sorted(run)], [None]))
            run = []
        cpu = sorted(v for b in branches if b.kind != "region" for v in b.nodes)
        groups.append((k, [cpu] * bool(cpu) + [sorted(b.nodes) for b in held],
                       [None] * bool(cpu) + [hold[of[b.nodes[0]]] for b in held]))
    if run:
        groups.append((None, [sorted(run)], [None]))
    out = []
    for layer, own, ms in groups:
        st = stage_plan(graph, layer, own, [], workers)
        out.append(OffloadStage(layer, st.submodels, st.outputs, st.peak_bytes, tuple(ms),
                                tuple(workers if m is None else 1 for m in ms)))
    return out
