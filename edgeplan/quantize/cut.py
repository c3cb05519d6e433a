"""Cut the whole int8 TFLite model at one tensor into a prefix and a suffix (as Coral's profiling
partitioner cuts TFLite models): the prefix keeps the ops the tensor depends on and outputs the
tensor; the suffix keeps the other ops and takes the tensor as its input. The int8 tensor passes
unchanged, with its quantization, from one to the other. Unused tensors and buffers are pruned.
"""
from __future__ import annotations

import copy

from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from edgeplan.errors import CutError
from edgeplan.quantize.tflite_graph import TfliteGraph


def cut(graph: TfliteGraph, tensor: int) -> tuple[bytes, bytes]:
    """Return ``(prefix, suffix)`` flatbuffers for a cut at ``tensor`` (an index into the subgraph)."""
    if tensor in graph.inputs or tensor in graph.outputs:
        raise CutError(f"tensor {graph.tensors[tensor].name!r} is the model's input or output; no cut needed")
    if not graph.is_single_tensor_cut(tensor):
        raise CutError(
            f"tensor {graph.tensors[tensor].name!r} is not a single-tensor cut of the int8 model: other "
            "tensors cross from its ancestors to the rest of the graph."
        )
    bits = graph.prefix_ops(tensor)
    keep_prefix = [i for i in range(len(graph.ops)) if (bits >> i) & 1]
    keep_suffix = [i for i in range(len(graph.ops)) if not (bits >> i) & 1]
    prefix = _submodel(graph.model, keep_prefix, list(graph.inputs), [tensor], "prefix")
    suffix = _submodel(graph.model, keep_suffix, [tensor], list(graph.outputs), "suffix")
    return prefix, suffix


def _submodel(model: schema.ModelT, keep_ops: list[int], inputs: list[int], outputs: list[int], tag: str) -> bytes:
    m = _shallow(model)
    sg = m.subgraphs[0]
    ops = [sg.operators[i] for i in keep_ops]
    used: list[int] = []
    seen: set[int] = set()

    def use(ix: int) -> None:
        if ix >= 0 and ix not in seen:
            seen.add(ix)
            used.append(ix)

    for ix in inputs:
        use(ix)
    for op in ops:
        for ix in list(op.inputs) + list(op.outputs) + list(op.intermediates if op.intermediates is not None else []):
            use(int(ix))
    for ix in outputs:
        use(ix)
    remap = {old: new for new, old in enumerate(used)}
    sg.tensors = [sg.tensors[i] for i in used]
    for op in ops:
        op.inputs = [remap[int(x)] if x >= 0 else -1 for x in op.inputs]
        op.outputs = [remap[int(x)] for x in op.outputs]
        if op.intermediates is not None:
            op.intermediates = [remap[int(x)] for x in op.intermediates]
    sg.operators = ops
    sg.inputs = [remap[i] for i in inputs]
    sg.outputs = [remap[i] for i in outputs]
    if sg.name:
        base = sg.name.decode() if isinstance(sg.name, bytes) else sg.name
        sg.name = f"{base}_{tag}"
    _prune_buffers(m)
    m.signatureDefs = None
    return bytes(flatbuffer_utils.convert_object_to_bytearray(m))


def _shallow(model: schema.ModelT) -> schema.ModelT:
    """A copy of ``model`` whose lists and the objects ``_submodel`` and ``_prune_buffers`` change (subgraphs,
    their tensors and operators, metadata) are its own, and whose buffers — the weights — are the model's: a deep
    copy of VGG-19's 140 MB int8 model per cut took 0.05 s of every 0.08 s cut."""
    m = copy.copy(model)
    m.subgraphs = []
    for g in model.subgraphs:
        sg = copy.copy(g)
        sg.tensors = [copy.copy(t) for t in g.tensors]
        sg.operators = [copy.copy(op) for op in g.operators]
        m.subgraphs.append(sg)
    m.metadata = [copy.copy(md) for md in model.metadata] if model.metadata is not None else None
    m.buffers = list(model.buffers)
    return m


def _prune_buffers(m: schema.ModelT) -> None:
    """Keep buffer 0 (the empty sentinel), the buffers kept tensors use and the metadata buffers."""
    needed = [0]
    for sg in m.subgraphs:
        needed += [t.buffer for t in sg.tensors]
    needed += [md.buffer for md in (m.metadata or [])]
    order: list[int] = []
    seen: set[int] = set()
    for b in needed:
        if b not in seen:
            seen.add(b)
            order.append(b)
    remap = {old: new for new, old in enumerate(order)}
    m.buffers = [m.buffers[b] for b in order]
    for sg in m.subgraphs:
        for t in sg.tensors:
            t.buffer = remap[t.buffer]
    for md in m.metadata or []:
        md.buffer = remap[md.buffer]
    m.metadataBuffer = None
