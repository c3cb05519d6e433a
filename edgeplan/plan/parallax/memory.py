"""Parallax's branch peak memory (§3.2-3.3), estimated from shapes: each tensor a branch makes lives from the
op that makes it until the last op of the branch that reads it, or to the end when it leaves the branch; what
the branch reads from outside lives throughout (its sub-model's inputs: TFLite keeps model inputs for the whole
invocation); kernel scratch (``scratch_bytes``) lives while its op runs; a linear scan over those intervals
keeps the running total and its peak.
Beside it, the naive figure (one buffer per tensor, no reuse), as the paper's Table 5 compares.
"""
from __future__ import annotations

from edgeplan.quantize.stream import ops_boundary
from edgeplan.quantize.tflite_graph import TfliteGraph, itemsize, tensor_bytes


def intervals(graph: TfliteGraph, ops: list[int], outputs: list[int] | None = None) -> dict[int, tuple[int, int]]:
    """Tensor -> (first step, last step) it is live, steps = positions of ``ops`` (sorted) in the branch;
    ``outputs``: the sub-model's outputs when not every tensor another op reads."""
    order = sorted(ops)
    inputs, read_elsewhere = ops_boundary(graph, order)
    outputs = read_elsewhere if outputs is None else outputs
    life = {x: (0, 0) for x in inputs}
    for step, i in enumerate(order):
        op = graph.ops[i]
        for x in graph.activations(op):
            a, _ = life.get(x, (step, step))
            life[x] = (a, step)
        for x in op.outputs:
            life.setdefault(x, (step, step))
    end = len(order) - 1
    # read after the branch: live to its end; and what it reads from outside too — a sub-model's inputs are
    # TFLite model inputs, which its arena planner keeps for the whole invocation
    for x in [*outputs, *inputs]:
        life[x] = (life[x][0], end)
    return life


def scratch_bytes(graph: TfliteGraph, i: int) -> int:
    """The kernel scratch an op holds while it runs, beside its tensors (TFLite's int8 kernels, the one table):
    CONV_2D other than 1x1 / stride 1 / dilation 1 unrolls its input patches (im2col): out_h x out_w x k_h x
    k_w x c_in bytes; MEAN and SUM accumulate in int32: 4 bytes per output element; every other op none."""
    op = graph.ops[i]
    if op.name in ("MEAN", "SUM"):
        return 4 * sum(tensor_bytes(graph, o) // itemsize(graph.tensors[o]) for o in op.outputs)
    if op.name != "CONV_2D":
        return 0
    o = op.builtin_options
    _, kh, kw, cin = graph.tensors[op.inputs[1]].shape
    strided = any(getattr(o, f, 1) != 1 for f in ("strideH", "strideW", "dilationHFactor", "dilationWFactor"))
    if kh == kw == 1 and not strided:
        return 0
    _, oh, ow, _ = graph.tensors[op.outputs[0]].shape
    return oh * ow * kh * kw * cin * itemsize(graph.tensors[op.inputs[0]])


def peak_bytes(graph: TfliteGraph, ops: list[int], outputs: list[int] | None = None) -> int:
    """The largest total of live tensors and kernel scratch at any step of the branch (a linear scan over
    interval endpoints)."""
    events: list[tuple[int, int]] = []
    for x, (a, b) in intervals(graph, ops, outputs).items():
        n = tensor_bytes(graph, x)
        events += [(a, n), (b + 1, -n)]
    for step, i in enumerate(sorted(ops)):
        n = scratch_bytes(graph, i)
        events += [(step, n), (step + 1, -n)]
    live = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1] >= 0)):  # frees before allocations at a step
        live += delta
        peak = max(peak, live)
    return peak


def naive_bytes(graph: TfliteGraph, ops: list[int]) -> int:
    """One buffer per tensor the branch reads or makes and per kernel scratch, none reused."""
    return sum(tensor_bytes(graph, x) for x in intervals(graph, ops)) + sum(scratch_bytes(graph, i) for i in ops)
