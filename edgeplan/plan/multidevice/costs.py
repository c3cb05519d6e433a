"""What AutoDiCE's exploration predicts from: each unit's measured time (1 core and all cores), its int8 weight
and activation bytes, and the int8 tensors between units (who makes them, who reads them).

Units are taken in dependency order; a mapping of the exploration cuts that order into consecutive segments,
one per device, so a tensor crosses from the segment that makes it to every later segment that reads it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from edgeplan.plan.multidevice.units import Units
from edgeplan.profile.cpu import median_ms
from edgeplan.quantize import litert
from edgeplan.quantize.stream import cut_ops
from edgeplan.quantize.tflite_graph import TfliteGraph, tensor_bytes


@dataclass(frozen=True)
class RankOverhead:
    """What a rank costs beyond its invokes (``overhead.measure``; zero until measured)."""

    frame_s: float = 0.0  # CPU s per frame
    byte_s: float = 0.0  # CPU s per byte sent or received
    poll: float = 0.0  # CPU s per wall s
    invoke_scale: float = 1.0  # a rank's invoke CPU / its units' times measured alone (cache, the host's quota)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict | None) -> RankOverhead:
        return cls(**{k: float(v) for k, v in (d or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Costs:
    order: tuple[int, ...]  # unit indices in dependency order (positions 0..U-1)
    ms: np.ndarray  # (U, 2): per position, ms on 1 core and on all cores (measured, this machine)
    param_bytes: np.ndarray  # (U,) int8 weights
    act_bytes: np.ndarray  # (U,) the unit's inputs + outputs (what its arena holds at least)
    tensors: tuple[tuple[int, tuple[int, ...], int], ...]  # (producer position, consumer positions, bytes)
    input_bytes: int
    output_bytes: int
    cores: int  # "all cores" above
    rank_overhead: RankOverhead = field(default_factory=RankOverhead)  # measured over MPI, else zero

    def to_json(self) -> dict:
        return {"order": list(self.order), "ms": self.ms.tolist(), "param_bytes": self.param_bytes.tolist(),
                "act_bytes": self.act_bytes.tolist(), "tensors": [[p, list(c), b] for p, c, b in self.tensors],
                "input_bytes": self.input_bytes, "output_bytes": self.output_bytes, "cores": self.cores,
                "rank_overhead": self.rank_overhead.to_json()}

    @cached_property
    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The tensors as arrays: producer position per tensor; for every (tensor, reader) pair the tensor and the
        reader's position; bytes per tensor."""
        prod = np.array([p for p, _, _ in self.tensors], int)
        tid = np.array([k for k, (_, rs, _) in enumerate(self.tensors) for _ in rs], int)
        reader = np.array([q for _, rs, _ in self.tensors for q in rs], int)
        nbytes = np.array([b for _, _, b in self.tensors], np.int64)
        return prod, tid, reader, nbytes

    @classmethod
    def from_json(cls, d: dict) -> Costs:
        return cls(tuple(d["order"]), np.asarray(d["ms"], float), np.asarray(d["param_bytes"], np.int64),
                   np.asarray(d["act_bytes"], np.int64), tuple((p, tuple(c), b) for p, c, b in d["tensors"]),
                   d["input_bytes"], d["output_bytes"], d["cores"], RankOverhead.from_json(d.get("rank_overhead")))


def invoke_ms(data: bytes, threads: int, repeats: int) -> float:
    """Median ms of one invoke of the TFLite model ``data`` on ``threads`` threads (zero inputs, after a warm-up)."""
    return median_ms(litert.primed(data, threads).invoke, repeats)


def measure(graph: TfliteGraph, units: Units, order: list[int], cores: int, repeats: int = 5,
            progress=lambda done, total: None) -> Costs:
    """Time every unit as its own int8 sub-model on 1 thread and on ``cores`` threads (interleaved, medians), less
    a trivial invoke's cost (each measured invoke pays it once; a stage of many units pays it once too)."""
    pos = {u: k for k, u in enumerate(order)}
    ms = np.zeros((len(order), 2))
    for k, u in enumerate(order):
        data = cut_ops(graph, list(units.units[u].ops), f"u{u}")
        ms[k] = [invoke_ms(data, 1, repeats), invoke_ms(data, cores, repeats)]
        progress(k + 1, len(order))
    # the cost of an invoke that does almost nothing: the cheapest unit's floor, at most 50 us
    trivial = min(float(ms.min()), 0.05)
    ms = np.maximum(ms - trivial, 0.0)
    params = np.array([sum(graph.op_param_bytes[o] for o in units.units[u].ops) for u in order], np.int64)
    tensors, act = [], np.zeros(len(order), np.int64)
    producer_unit = {}
    for u in order:
        for o in units.units[u].outputs:
            producer_unit[o] = u
    for k, u in enumerate(order):
        for x in (*units.units[u].inputs, *units.units[u].outputs):
            if x in units.int8_tensor:
                act[k] += tensor_bytes(graph, units.int8_tensor[x])
    readers: dict[str, list[int]] = {}
    for u in order:
        for x in units.units[u].inputs:
            if x in producer_unit:
                readers.setdefault(x, []).append(pos[u])
    for x, rs in readers.items():
        tensors.append((pos[producer_unit[x]], tuple(sorted(set(rs))), tensor_bytes(graph, units.int8_tensor[x])))
    return Costs(tuple(order), ms, params, act, tuple(tensors), tensor_bytes(graph, graph.inputs[0]),
                 tensor_bytes(graph, graph.outputs[0]), cores)
