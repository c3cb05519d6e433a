"""A read-only view of a TFLite flatbuffer: operators, tensors, MACs, parameters, single-tensor cuts.

Mirrors ``edgeplan.graph.model.GraphView`` for the int8 model so the same cut definition applies on
both sides of the conversion.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

_OP_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
_TYPE_NAMES = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
_NP_TYPES = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "UINT8": np.uint8, "INT64": np.int64,
    "INT16": np.int16, "INT8": np.int8, "BOOL": np.bool_, "UINT16": np.uint16, "UINT32": np.uint32,
}


@dataclass(frozen=True)
class TfliteTensor:
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str  # "INT8", "FLOAT32", ...
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    constant: bool
    nbytes: int

    @property
    def quantized(self) -> bool:
        return len(self.scale) > 0


@dataclass(frozen=True)
class TfliteOp:
    index: int
    name: str  # builtin op name, e.g. CONV_2D, or the custom code for CUSTOM ops
    inputs: tuple[int, ...]  # -1 marks an omitted optional input
    outputs: tuple[int, ...]
    builtin_options: object | None


def _op_name(model: schema.ModelT, opcode_index: int) -> str:
    code = model.operatorCodes[opcode_index]
    builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
    if builtin == schema.BuiltinOperator.CUSTOM:
        cc = code.customCode
        return cc.decode() if isinstance(cc, bytes) else str(cc)
    return _OP_NAMES.get(builtin, f"BUILTIN_{builtin}")


class TfliteGraph:
    """The first subgraph of a TFLite model (edgeplan's models have one)."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.model: schema.ModelT = flatbuffer_utils.convert_bytearray_to_object(bytearray(self.data))
        self.subgraph = self.model.subgraphs[0]

    @cached_property
    def tensors(self) -> list[TfliteTensor]:
        out = []
        for i, t in enumerate(self.subgraph.tensors):
            buf = self.model.buffers[t.buffer] if t.buffer is not None and t.buffer < len(self.model.buffers) else None
            data = getattr(buf, "data", None) if buf is not None else None
            nbytes = int(len(data)) if data is not None else 0
            if nbytes == 0 and buf is not None and getattr(buf, "size", 0):
                nbytes = int(buf.size)
            q = t.quantization
            scale = tuple(float(s) for s in (q.scale if q is not None and q.scale is not None else []))
            zp = tuple(int(z) for z in (q.zeroPoint if q is not None and q.zeroPoint is not None else []))
            name = t.name.decode() if isinstance(t.name, bytes) else str(t.name)
            shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
            out.append(TfliteTensor(i, name, shape, _TYPE_NAMES.get(t.type, str(t.type)), scale, zp, nbytes > 0, nbytes))
        return out

    @cached_property
    def ops(self) -> list[TfliteOp]:
        return [
            TfliteOp(
                i,
                _op_name(self.model, op.opcodeIndex),
                tuple(int(x) for x in (op.inputs if op.inputs is not None else [])),
                tuple(int(x) for x in (op.outputs if op.outputs is not None else [])),
                op.builtinOptions,
            )
            for i, op in enumerate(self.subgraph.operators)
        ]

    def constant_value(self, index: int) -> np.ndarray | None:
        """The value of a constant tensor, or None when it is not a constant."""
        if index < 0 or not self.tensors[index].constant:
            return None
        t = self.tensors[index]
        buf = self.model.buffers[self.subgraph.tensors[index].buffer]
        return np.frombuffer(bytes(bytearray(buf.data)), dtype=_NP_TYPES[t.dtype]).reshape(t.shape)

    @property
    def inputs(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.subgraph.inputs)

    @property
    def outputs(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.subgraph.outputs)

    def by_name(self, name: str) -> TfliteTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @cached_property
    def producer(self) -> dict[int, int]:
        return {o: op.index for op in self.ops for o in op.outputs}

    def activations(self, op: TfliteOp) -> list[int]:
        """Non-constant inputs of ``op`` (what flows along graph edges)."""
        return [x for x in op.inputs if x >= 0 and not self.tensors[x].constant]

    @cached_property
    def ancestors(self) -> list[int]:
        anc = [0] * len(self.ops)
        for op in self.ops:
            a = 1 << op.index
            for x in self.activations(op):
                p = self.producer.get(x)
                if p is not None:
                    a |= anc[p]
            anc[op.index] = a
        return anc

    @cached_property
    def op_macs(self) -> list[int]:
        return [_macs(self, op) for op in self.ops]

    @cached_property
    def op_param_bytes(self) -> list[int]:
        return [sum(self.tensors[x].nbytes for x in op.inputs if x >= 0 and self.tensors[x].constant) for op in self.ops]

    def prefix_ops(self, tensor: int) -> int:
        """Bitset of the ops a tensor depends on (0 for a graph input)."""
        p = self.producer.get(tensor)
        return 0 if p is None else self.ancestors[p]

    def is_single_tensor_cut(self, tensor: int) -> bool:
        a = self.prefix_ops(tensor)
        if tensor in self.outputs:
            return True
        for o in self.outputs:
            p = self.producer.get(o)
            if p is not None and (a >> p) & 1:
                return False
        for op in self.ops:
            if (a >> op.index) & 1:
                continue
            for x in self.activations(op):
                p = self.producer.get(x)
                inside = p is None or (a >> p) & 1  # graph inputs sit in every prefix
                if inside and x != tensor:
                    return False
        return True

    def members(self, bits: int) -> list[int]:
        return [i for i in range(len(self.ops)) if (bits >> i) & 1]

    def prefix_macs(self, tensor: int) -> int:
        return sum(self.op_macs[i] for i in self.members(self.prefix_ops(tensor)))

    def prefix_param_bytes(self, tensor: int) -> int:
        return sum(self.op_param_bytes[i] for i in self.members(self.prefix_ops(tensor)))

    def param_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors if t.constant)


def _macs(g: TfliteGraph, op: TfliteOp) -> int:
    t = g.tensors
    if op.name == "CONV_2D":
        w = t[op.inputs[1]].shape  # (Cout, kh, kw, Cin)
        return math.prod(t[op.outputs[0]].shape) * math.prod(w[1:])
    if op.name == "DEPTHWISE_CONV_2D":
        w = t[op.inputs[1]].shape  # (1, kh, kw, Cout)
        return math.prod(t[op.outputs[0]].shape) * w[1] * w[2]
    if op.name == "FULLY_CONNECTED":
        w = t[op.inputs[1]].shape  # (N, K)
        return math.prod(t[op.outputs[0]].shape) * w[-1]
    if op.name == "TRANSPOSE_CONV":
        w = t[op.inputs[1]].shape  # (Cout, kh, kw, Cin)
        return math.prod(t[op.inputs[2]].shape) * math.prod(w[:3])
    if op.name == "BATCH_MATMUL":
        return math.prod(t[op.outputs[0]].shape) * t[op.inputs[0]].shape[-1]
    return 0


def np_dtype(tensor: TfliteTensor):
    return _NP_TYPES[tensor.dtype]


def itemsize(tensor: TfliteTensor) -> int:
    """Bytes per element (4 for a type numpy has no name for here)."""
    return np.dtype(_NP_TYPES.get(tensor.dtype, np.float32)).itemsize


def tensor_bytes(graph: TfliteGraph, ix: int) -> int:
    """Bytes of tensor ``ix`` (a dynamic dimension counted as 1)."""
    n = itemsize(graph.tensors[ix])
    for d in graph.tensors[ix].shape:
        n *= max(1, d)
    return n
