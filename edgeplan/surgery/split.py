"""Split a canonical ONNX model at one tensor into a prefix (input -> tensor) and a suffix (tensor -> output)."""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from edgeplan.errors import CutError


def _export(graph: gs.Graph, like: onnx.ModelProto) -> onnx.ModelProto:
    graph.cleanup(remove_unused_graph_inputs=True).toposort()
    model = gs.export_onnx(graph)
    model.ir_version = like.ir_version
    del model.opset_import[:]
    model.opset_import.extend(like.opset_import)
    return model


def _import(model: onnx.ModelProto, tensor: str, side: str) -> tuple[gs.Graph, gs.Variable]:
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    if tensor not in tensors:
        raise CutError(f"{side}: tensor {tensor!r} is not in the model")
    t = tensors[tensor]
    if t.dtype is None or t.shape is None:
        raise CutError(f"{side}: tensor {tensor!r} has no inferred dtype/shape")
    return graph, t


def prefix(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """Every node ``tensor`` depends on; the model's input in, ``tensor`` out."""
    graph, t = _import(model, tensor, "prefix")
    graph.outputs = [t]
    graph.name = f"{graph.name}_prefix"
    return _export(graph, model)


def suffix(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """Every node after ``tensor``; ``tensor`` in, the model's output out."""
    graph, t = _import(model, tensor, "suffix")
    t.inputs.clear()  # detach the producer so cleanup drops everything before the cut
    graph.inputs = [t]
    graph.name = f"{graph.name}_suffix"
    out = _export(graph, model)
    _check_closed(out, tensor)
    return out


def _check_closed(model: onnx.ModelProto, tensor: str) -> None:
    """A suffix must be computable from ``tensor`` and constants alone (else the cut was not single-tensor)."""
    known = {tensor} | {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        for x in n.input:
            if x and x not in known:
                raise CutError(
                    f"suffix at {tensor!r}: node {n.name!r} ({n.op_type}) needs {x!r} from before the cut; "
                    "the tensor is not a single-tensor cut."
                )
        known.update(o for o in n.output if o)
