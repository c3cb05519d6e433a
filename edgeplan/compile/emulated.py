"""The emulated Edge TPU compiler: the documented rules applied to int8 TFLite prefixes.

- every op is checked against ``edgetpu_ops`` (full int8, supported op, its limitations);
- without ``allow_multiple_subgraphs`` the first op that does not map ends the Edge TPU part: every later
  op stays on the CPU ("More than one subgraph is not supported" when it would otherwise map);
- the on-chip parameter cache (about 8 MiB) is filled in co-compilation order, op by op, until an op's
  parameters do not fit; the parameters of that op and of every later op are streamed per inference.

The output model is the input model with an ``edgeplan.emulated_edgetpu`` metadata entry: it runs on a
CPU interpreter (the emulated device's correctness mode) and a device with a real Edge TPU refuses it.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import flatbuffers
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from edgeplan.artifacts import CompileReport, OperatorRow
from edgeplan.compile import edgetpu_ops as rules
from edgeplan.quantize.tflite_graph import TfliteGraph

VERSION = "edgeplan-emulated-1"
METADATA_KEY = "edgeplan.emulated_edgetpu"
DEFAULT_ONCHIP_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class OpPlacement:
    index: int
    op: str
    status: str
    reason: str | None
    param_bytes: int
    cached: bool


def place_ops(graph: TfliteGraph, allow_multiple_subgraphs: bool = False) -> list[OpPlacement]:
    """Which ops map to the Edge TPU (cache decisions are made across models by ``compile_models``)."""
    placements = []
    ended = False
    for op in graph.ops:
        status, reason = rules.check(graph, op)
        if status == rules.MAPPED and ended and not allow_multiple_subgraphs:
            status, reason = rules.MORE_THAN_ONE_SUBGRAPH, "after the first op that does not map"
        if status != rules.MAPPED:
            ended = True
        placements.append(OpPlacement(op.index, op.name, status, reason, graph.op_param_bytes[op.index], False))
    return placements


def _subgraphs(placements: list[OpPlacement]) -> int:
    runs, inside = 0, False
    for p in placements:
        mapped = p.status == rules.MAPPED
        runs += mapped and not inside
        inside = mapped
    return runs


def _table(placements: list[OpPlacement]) -> tuple[OperatorRow, ...]:
    counts = Counter((p.op, p.status) for p in placements)
    return tuple(OperatorRow(op, n, status) for (op, status), n in counts.items())


def fill_cache(param_bytes: list[int], remaining: int, filling: bool = True) -> tuple[list[bool], int, bool]:
    """The on-chip cache filled op by op in order: (on chip per op, bytes left, still filling). Once an op's
    parameters do not fit, it and every later op (of this model and of models co-compiled after it) stream."""
    cached = []
    for b in param_bytes:
        if filling and b <= remaining:
            remaining -= b
            cached.append(True)
        else:
            filling = False
            cached.append(False)
    return cached, remaining, filling


def compile_models(
    models: list[tuple[str, bytes]],
    onchip_bytes: int = DEFAULT_ONCHIP_BYTES,
    allow_multiple_subgraphs: bool = False,
) -> list[tuple[CompileReport, bytes]]:
    """Co-compile ``(name, int8 tflite)`` models in order; return a report and the output model for each."""
    remaining = onchip_bytes
    filling = True
    results = []
    names = [n for n, _ in models]
    for name, data in models:
        graph = TfliteGraph(data)
        placements = place_ops(graph, allow_multiple_subgraphs)
        mapped = [i for i, p in enumerate(placements) if p.status == rules.MAPPED]
        cached, remaining, filling = fill_cache([placements[i].param_bytes for i in mapped], remaining, filling)
        onchip = offchip = 0
        for i, on_chip in zip(mapped, cached):
            p = placements[i]
            if on_chip:
                onchip += p.param_bytes
                placements[i] = OpPlacement(p.index, p.op, p.status, p.reason, p.param_bytes, True)
            else:
                offchip += p.param_bytes
        first = next((p for p in placements if p.status != rules.MAPPED), None)
        tpu_ops = sum(p.status == rules.MAPPED for p in placements)
        report = CompileReport(
            compiler="emulated",
            compiler_version=VERSION,
            model=name,
            onchip_param_bytes=onchip,
            offchip_param_bytes=offchip,
            onchip_remaining_bytes=remaining,
            subgraph_count=_subgraphs(placements),
            total_ops=len(placements),
            tpu_ops=tpu_ops,
            cpu_ops=len(placements) - tpu_ops,
            operators=_table(placements),
            first_unmapped=(
                {"op": first.op, "index": first.index, "status": first.status, "reason": first.reason}
                if first else None
            ),
            cocompiled_with=tuple(n for n in names if n != name),
        )
        results.append((report, _mark(data, report)))
    return results


def _mark(data: bytes, report: CompileReport) -> bytes:
    """``data`` with the emulated compiler's metadata added. Its buffers are packed from views of ``data`` into
    one builder of about the output's size: flatbuffer_utils' round trip (a bytearray of the input, a builder
    grown by doubling, two copies of its output) took a 0.57 GB prefix 3.4 GB above its stage's start."""
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(data, 0))
    buf = schema.BufferT()
    buf.data = list(json.dumps({"compiler": report.compiler, "version": report.compiler_version,
                                "tpu_ops": report.tpu_ops, "total_ops": report.total_ops}).encode())
    md = schema.MetadataT()
    md.name = METADATA_KEY
    md.buffer = len(model.buffers)
    model.buffers.append(buf)
    model.metadata = list(model.metadata or []) + [md]
    builder = flatbuffers.Builder(len(data) + (1 << 16))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(memoryview(builder.Bytes)[builder.Head():])


def is_emulated(data: bytes) -> bool:
    """True when a model was written by the emulated compiler (reads the flatbuffer's metadata only)."""
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    for md in model.metadata or []:
        name = md.name.decode() if isinstance(md.name, bytes) else md.name
        if name == METADATA_KEY:
            return True
    return False
