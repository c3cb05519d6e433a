"""What tf2onnx needs beyond its stock conversion to take Keras 3 graphs (model coverage).

- **Function calls inlined.** Keras 3 wraps some layers (depthwise convolutions, ...) in their own
  ``tf.function``; the converted graph keeps them as ``PartitionedCall`` nodes, which tf2onnx cannot convert.
  Stock tf2onnx inlines them in grappler, which ingest skips (``ingest._bounded_tf2onnx``: grappler on a frozen
  VGG16 went past 24 GB). Here grappler runs with its function optimizer only, and only on a graph that has
  calls and holds no large constants (the Keras 3 route converts with the weights as inputs: a few MB).
- **Ops ONNX has an exact equivalent for**, registered as tf2onnx handlers: ``Erfc(x) = 1 - Erf(x)`` (Keras
  GELU, exact form).
"""
from __future__ import annotations

import numpy as np

CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# a graph above this holds weights (a frozen model): inlining it is the grappler run that was OOM-killed
INLINE_MAX_BYTES = 64 << 20


def calls(graph_def) -> list[str]:
    """The function-call nodes of ``graph_def``'s main graph."""
    return [n.name for n in graph_def.node if n.op in CALLS]


def inline_functions(input_names: list[str], output_names: list[str], graph_def):
    """``graph_def`` with its function calls inlined (grappler's function optimizer alone), or unchanged when
    it has none or holds weights (see the module docstring); what stays a call is reported by the converter."""
    if not calls(graph_def) or graph_def.ByteSize() > INLINE_MAX_BYTES:
        return graph_def
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    graph_def = _inlinable(graph_def)
    config = config_pb2.ConfigProto()
    config.graph_options.infer_shapes = True
    config.graph_options.rewrite_options.optimizers[:] = ["function"]
    meta_graph = tf.compat.v1.train.export_meta_graph(graph_def=graph_def)
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(input_names + output_names)
    meta_graph.collection_def["train_op"].CopyFrom(fetch)
    return tf_optimizer.OptimizeGraph(config, meta_graph)


# attributes that make grappler keep a call: Keras 3 compiles its depthwise convolution with XLA (jit_compile)
_KEEP_CALL = ("_XlaMustCompile", "_noinline")


def _inlinable(graph_def):
    """A copy of ``graph_def`` without the attributes that keep its calls from being inlined (the XLA hint is
    an execution preference: the function computes the same without it)."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    nodes = [*out.node, *(n for f in out.library.function for n in f.node_def)]
    for n in nodes:
        for key in _KEEP_CALL:
            if key in n.attr:
                del n.attr[key]
    for f in out.library.function:
        for key in _KEEP_CALL:
            if key in f.attr:
                del f.attr[key]
    return out


def register_handlers() -> None:
    """Register the extra op handlers with tf2onnx (once per process)."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    if "Erfc" in _registered:
        return

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):  # ONNX Erf: opset 9
            node.type = "Erf"
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
            sub = ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(node.name),
                                                inputs=[one.output[0], node.output[0]])
            ctx.copy_shape(node.output[0], sub.output[0])
            ctx.set_dtype(sub.output[0], ctx.get_dtype(node.output[0]))

    _registered.add("Erfc")


_registered: set[str] = set()
