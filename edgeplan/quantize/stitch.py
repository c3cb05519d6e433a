"""The int8 pieces of a model converted in pieces (``quantize/pieces``) made into one int8 TFLite model.

``merge_parts``: the parts of a split fully-connected layer become the one layer again — their int8 weights,
per-channel weight scales and int32 biases concatenated along the output channels. Each part's output was
quantized with the whole layer's output range, and per-channel quantization makes every other number of a channel
independent of the rest, so the merged op is the op a conversion of the whole layer makes.

``stitch``: the pieces' operators in chain order, each piece's input tensor replaced by the previous piece's
output tensor — which must have its shape and type, and has its quantization (the pieces were quantized with the
same range at each boundary) unless an op of the next piece that keeps its input's scale took its own range for
both: then a QUANTIZE op goes between — and named after the ONNX tensor of the cut.
"""
from __future__ import annotations

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from edgeplan.errors import ConversionError
from edgeplan.quantize.cut import _prune_buffers

_FC = schema.BuiltinOperator.FULLY_CONNECTED
_QUANTIZE = schema.BuiltinOperator.QUANTIZE
_RUNTIME_KEY = b"min_runtime_version"


def _load(data: bytes) -> schema.ModelT:
    return flatbuffer_utils.convert_bytearray_to_object(bytearray(data))


def _code(model: schema.ModelT, op: schema.OperatorT) -> int:
    c = model.operatorCodes[op.opcodeIndex]
    return max(c.builtinCode, c.deprecatedBuiltinCode)


def _same_quant(a: schema.TensorT, b: schema.TensorT) -> bool:
    qa, qb = a.quantization, b.quantization
    if qa is None or qb is None or qa.scale is None or qb.scale is None:
        return (qa is None or qa.scale is None) and (qb is None or qb.scale is None)
    return np.array_equal(qa.scale, qb.scale) and np.array_equal(qa.zeroPoint, qb.zeroPoint)


def merge_parts(parts: list[bytes], where: str) -> bytes:
    """One model from the parts of a split fully-connected layer (each part: the same ops, one FULLY_CONNECTED)."""
    models = [_load(p) for p in parts]
    fcs = []
    for k, m in enumerate(models):
        ops = [op for op in m.subgraphs[0].operators if _code(m, op) == _FC]
        if len(ops) != 1 or [_code(m, op) for op in m.subgraphs[0].operators] != [
                _code(models[0], op) for op in models[0].subgraphs[0].operators]:
            raise ConversionError(f"{where}: part {k} of the split layer did not convert to the ops of part 0 with one "
                                  "FULLY_CONNECTED; convert the model with a larger quantize.piece_bytes")
        fcs.append(ops[0])
    base, sg = models[0], models[0].subgraphs[0]
    weight, bias, output = (sg.tensors[fcs[0].inputs[1]], sg.tensors[fcs[0].inputs[2]] if fcs[0].inputs[2] >= 0
                            else None, sg.tensors[fcs[0].outputs[0]])
    weights, biases = [], []
    for m, op in zip(models, fcs):
        t = m.subgraphs[0].tensors
        w, o = t[op.inputs[1]], t[op.outputs[0]]
        if not _same_quant(o, output):
            raise ConversionError(f"{where}: the parts of the split layer have different output quantization")
        if len(w.quantization.scale) != w.shape[0]:
            raise ConversionError(f"{where}: the split layer's weights are not quantized per channel; convert the "
                                  "model with a larger quantize.piece_bytes")
        weights.append((np.asarray(m.buffers[w.buffer].data).reshape(w.shape), w.quantization))
        if (op.inputs[2] >= 0) != (bias is not None):
            raise ConversionError(f"{where}: some parts of the split layer have a bias and some do not")
        if bias is not None:
            b = t[op.inputs[2]]
            biases.append((np.asarray(m.buffers[b.buffer].data), b.quantization))
    w = np.concatenate([a for a, _ in weights])
    base.buffers[weight.buffer].data = w.reshape(-1)
    weight.shape = np.array(w.shape, dtype=np.int32)
    weight.quantization.scale = np.concatenate([q.scale for _, q in weights])
    weight.quantization.zeroPoint = np.concatenate([q.zeroPoint for _, q in weights])
    if bias is not None:
        base.buffers[bias.buffer].data = np.concatenate([a for a, _ in biases])
        bias.shape = np.array([w.shape[0]], dtype=np.int32)
        bias.quantization.scale = np.concatenate([q.scale for _, q in biases])
        bias.quantization.zeroPoint = np.concatenate([q.zeroPoint for _, q in biases])
    for t in (output, *(sg.tensors[i] for i in sg.outputs)):
        t.shape = np.array([*t.shape[:-1], w.shape[0]], dtype=np.int32)
        if t.shapeSignature is not None:
            t.shapeSignature = np.array([*t.shapeSignature[:-1], w.shape[0]], dtype=np.int32)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(base))


def stitch(pieces: list[bytes], boundaries: list[str], requantized: list[str] | None = None) -> bytes:
    """One model from the int8 pieces in chain order; ``boundaries[k]`` names the tensor between pieces k and k+1.
    A boundary the next piece quantized with another scale (its input's range was given, but an op that keeps its
    input's scale, a MAX_POOL_2D, took its own range for both) gets a QUANTIZE op from the one scale to the other;
    its name is appended to ``requantized``."""
    requantized = [] if requantized is None else requantized
    res = _load(pieces[0])
    rs = res.subgraphs[0]
    names = {bytes(t.name) for t in rs.tensors}
    runtime = [_runtime_version(res)]
    for k, data in enumerate(pieces[1:], 1):
        q = _load(data)
        qs = q.subgraphs[0]
        runtime.append(_runtime_version(q))
        codes = {_code_key(c): i for i, c in enumerate(res.operatorCodes)}
        cmap = {}
        for i, c in enumerate(q.operatorCodes):
            if _code_key(c) not in codes:
                codes[_code_key(c)] = len(res.operatorCodes)
                res.operatorCodes.append(c)
            cmap[i] = codes[_code_key(c)]
        src, qin = rs.outputs[0], qs.inputs[0]
        a, b = rs.tensors[src], qs.tensors[qin]
        where = f"the boundary {boundaries[k - 1]!r} between pieces {k - 1} and {k}"
        if list(a.shape) != list(b.shape) or a.type != b.type:
            raise ConversionError(f"{where}: the pieces disagree on the tensor (shape {[int(d) for d in a.shape]} "
                                  f"vs {[int(d) for d in b.shape]}, or its type)")
        a.name = boundaries[k - 1].encode()
        tmap = {qin: src}
        if not _same_quant(a, b):  # the next piece took another scale for it: requantize, as the converter would
            tmap[qin] = _requantize(res, src, b)
            requantized.append(boundaries[k - 1])
            names.add(bytes(rs.tensors[tmap[qin]].name))
        ops = list(qs.operators)
        bmap = {0: 0}
        for i, buf in enumerate(q.buffers[1:], 1):
            bmap[i] = len(res.buffers)
            res.buffers.append(buf)
        used = {x for op in ops for x in [*op.inputs, *op.outputs, *(op.intermediates or ())]} | set(qs.outputs)
        for i, t in enumerate(qs.tensors):
            if i in tmap or i not in used:
                continue
            t.buffer = bmap[t.buffer]
            name = bytes(t.name)
            if name in names:
                name += f";piece{k}".encode()
            names.add(name)
            t.name = name
            tmap[i] = len(rs.tensors)
            rs.tensors.append(t)
        for op in ops:
            op.opcodeIndex = cmap[op.opcodeIndex]
            op.inputs = [tmap[int(x)] if x >= 0 else -1 for x in op.inputs]
            op.outputs = [tmap[int(x)] for x in op.outputs]
            if op.intermediates is not None:
                op.intermediates = [tmap[int(x)] for x in op.intermediates]
            rs.operators.append(op)
        rs.outputs = [tmap[int(x)] for x in qs.outputs]
    for sig in res.signatureDefs or ():
        for t, out in zip(sig.outputs, rs.outputs):
            t.tensorIndex = out
    _set_runtime_version(res, max(runtime, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit())))
    _prune_buffers(res)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(res))


def _requantize(res: schema.ModelT, src: int, like: schema.TensorT) -> int:
    """A QUANTIZE op from tensor ``src`` to a new tensor quantized as ``like``; the new tensor's index."""
    rs = res.subgraphs[0]
    key = (_QUANTIZE, _QUANTIZE, None, 1)
    codes = {_code_key(c): i for i, c in enumerate(res.operatorCodes)}
    if key not in codes:
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = _QUANTIZE
        code.version = 1
        codes[key] = len(res.operatorCodes)
        res.operatorCodes.append(code)
    t = schema.TensorT()
    t.shape, t.type, t.buffer = like.shape, like.type, 0
    t.name = bytes(rs.tensors[src].name) + b";requantized"
    t.quantization = like.quantization
    rs.tensors.append(t)
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = codes[key], [src], [len(rs.tensors) - 1]
    op.builtinOptionsType = schema.BuiltinOptions.QuantizeOptions
    op.builtinOptions = schema.QuantizeOptionsT()
    rs.operators.append(op)
    return len(rs.tensors) - 1


def _code_key(c: schema.OperatorCodeT) -> tuple:
    return c.deprecatedBuiltinCode, c.builtinCode, c.customCode, c.version


def _runtime_version(model: schema.ModelT) -> str:
    for md in model.metadata or ():
        if bytes(md.name) == _RUNTIME_KEY:
            return bytes(model.buffers[md.buffer].data).rstrip(b"\0").decode()
    return "0"


def _set_runtime_version(model: schema.ModelT, version: str) -> None:
    for md in model.metadata or ():
        if bytes(md.name) == _RUNTIME_KEY:
            held = model.buffers[md.buffer].data
            model.buffers[md.buffer].data = np.frombuffer(version.encode().ljust(max(len(held), len(version)), b"\0"),
                                                           dtype=np.uint8)
