"""Ingest: ONNX files, Keras ``.keras`` files and SavedModel directories to one canonical ONNX form.

Canonical form (DESIGN.md): one input and one output, static shapes (a dynamic batch dimension
becomes 1; any other dynamic dimension is an error unless ``input_shape`` gives it), shape-inferred,
constants folded, identity-like nodes removed, nodes in topological order, NCHW image inputs.
"""
from __future__ import annotations

import logging
import math
import os
import re
import zipfile
from pathlib import Path
from typing import Sequence

import onnx
from onnx import shape_inference

from edgeplan.errors import (
    CorruptModelError,
    DynamicShapeError,
    EdgeplanError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from edgeplan.graph import tf_ops, wire
from edgeplan.graph.model import data_in_place

log = logging.getLogger(__name__)

OPSET = 17
_IDENTITY_LIKE = {"Identity", "Dropout"}


def load_any(path: str | os.PathLike, input_shape: Sequence[int] | None = None) -> onnx.ModelProto:
    """Read a model file of any supported format and return it canonicalised."""
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"{path}: no such file or directory.")
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise UnsupportedModelError(
                f"{path}: a directory, but not a TensorFlow SavedModel (no saved_model.pb). "
                "Give an .onnx file, a .keras file or a SavedModel directory."
            )
        model = _renumber_generated_names(_from_saved_model(path, input_shape))
    elif path.suffix == ".keras":
        model = _renumber_generated_names(_from_keras(path, input_shape))
    elif path.suffix in (".h5", ".hdf5", ".tflite", ".pb", ".pt", ".pth"):
        raise UnsupportedModelError(
            f"{path}: {path.suffix} files are not supported; give an .onnx file, a .keras file "
            "or a SavedModel directory."
        )
    else:
        return canonicalise(_read_onnx(path), input_shape=input_shape, source=str(path))
    # numbered again in the canonical graph's order: the converted graph's order follows Python's string hashing and
    # the file's path (EfficientNetB0 got one of three fingerprints in three runs, MobileNetV2 0.35 two under
    # PYTHONHASHSEED 1 and 2)
    return _renumber_generated_names(canonicalise(model, input_shape=input_shape, source=str(path)))


_GENERATED = re.compile(r"(__|^)(\d+)(?=\D|$)")  # tf2onnx's ``X__58``; TensorFlow's captured ``551:0``


def _renumber_generated_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """Number the names the conversion made up from 1 in order of first appearance: tf2onnx's
    ``conv2d/BiasAdd__58``, a SavedModel's captured constants ``551:0`` (and drop the doc strings, which name the
    traced function ``__inference_<lambda>_555``).

    tf2onnx and TensorFlow number them from process-wide counters, so the same file converted twice in one process
    (or after another model) gave other names, another canonical ONNX and another fingerprint: a second
    ``edgeplan ingest`` of the same file was refused as another model. Every number is mapped through one
    bijection, the rest of the name kept, so distinct names stay distinct."""
    numbers: dict[str, str] = {}

    def renamed(name: str) -> str:
        return _GENERATED.sub(lambda m: m.group(1) + numbers.setdefault(m.group(2), str(len(numbers) + 1)), name)

    def graph(g: onnx.GraphProto) -> None:
        for v in (*g.input, *g.initializer, *g.sparse_initializer, *g.output, *g.value_info):
            named = v.values if isinstance(v, onnx.SparseTensorProto) else v
            named.name = renamed(named.name)
        for n in g.node:
            n.name = renamed(n.name)
            n.input[:] = [renamed(x) for x in n.input]
            n.output[:] = [renamed(x) for x in n.output]
            for a in n.attribute:
                for sub in (*([a.g] if a.HasField("g") else []), *a.graphs):
                    graph(sub)

    # First appearance in graph order: the nodes (topological, the same whatever the counter) before the rest.
    for n in model.graph.node:
        for x in (n.name, *n.input, *n.output):
            renamed(x)
    graph(model.graph)
    model.doc_string = model.graph.doc_string = ""
    return model


def _name_shared_constants(g: onnx.GraphProto) -> None:
    """Name each constant several nodes read after its first reader: tf2onnx and constant folding merge equal
    constants (ReLU6's bounds, shared by every Clip; zero biases) and keep the name of whichever one they met first,
    in an order that changes from process to process and from call to call (measured: MobileNetV2's bounds came out
    as ``block_13_...`` in one run and ``block_10_...`` in the next, so two ingests of one file had different
    fingerprints)."""
    readers: dict[str, list[tuple[int, int]]] = {}
    inits = {t.name for t in g.initializer}
    for i, n in enumerate(g.node):
        for k, x in enumerate(n.input):
            if x in inits:
                readers.setdefault(x, []).append((i, k))
    names = {x: f"{g.node[at[0][0]].name}:shared{at[0][1]}" for x, at in readers.items() if len(at) > 1}
    if not names:
        return
    for t in g.initializer:
        t.name = names.get(t.name, t.name)
    for n in g.node:
        n.input[:] = [names.get(x, x) for x in n.input]
    for v in (*g.input, *g.value_info):
        v.name = names.get(v.name, v.name)


def _read_onnx(path: Path) -> onnx.ModelProto:
    data = path.read_bytes()
    if not data:
        raise CorruptModelError(f"{path}: the file is empty; expected an ONNX model.")
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeWarning-ish errors
        raise CorruptModelError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e}).") from e
    if not model.graph.node:
        raise CorruptModelError(
            f"{path}: parsed as protobuf but holds no ONNX graph nodes; is it really an ONNX model?"
        )
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # weights in files beside it (a model over protobuf's 2 GB): onnx refuses locations outside its directory
        from onnx.external_data_helper import load_external_data_for_model

        try:
            load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # a missing or short file, or a location outside the directory
            raise CorruptModelError(f"{path}: its external data could not be read ({type(e).__name__}: "
                                    f"{str(e)[:200]}).") from e
        data_in_place(model)
    return model


def _keras_input_signature(shape, input_shape, dtype, name, source):
    import tensorflow as tf

    dims = list(shape)
    if input_shape is not None:
        # --input-shape is given in the canonical NCHW layout; Keras image models are NHWC.
        given = list(input_shape)
        if len(given) == 4 and len(dims) == 4:
            given = [given[0], given[2], given[3], given[1]]
        dims = given
    dims = [None] + [d for d in dims[1:]]
    for i, d in enumerate(dims[1:], start=1):
        if d is None:
            raise DynamicShapeError(
                f"{source}: input {name!r} dimension {i} is dynamic; give it with --input-shape "
                "(NCHW, for example 1,3,224,224)."
            )
    return (tf.TensorSpec(dims, dtype, name=name),)


def _bounded_tf2onnx() -> None:
    """Make tf2onnx's conversion of a frozen graph cost memory in proportion to the model (large models).

    Measured on Keras VGG16 (553 MB of weights), the stock conversion was killed past 24 GB in two places:
    - grappler (``tf_optimize_grappler`` -> TensorFlow's ``OptimizeGraph``: 10 GB in 45 s, with or without
      its constant folding): skipped. Folding happens on the ONNX graph instead (tf2onnx's ConstFoldOptimizer
      and ``canonicalise``'s onnx-graphsurgeon folding), and the Keras function is already inlined when it is
      frozen (``convert_variables_to_constants_v2``, aggressive inlining). Only the function calls a Keras 3
      layer keeps (``PartitionedCall``) are inlined, on graphs without weights (``tf_ops.inline_functions``);
    - tf2onnx's optimizer loop: every pass writes every node back to its NodeProto (``Node.update_proto``),
      and with the upb protobuf runtime the previous copy of a Const's tensor stays in the NodeProto's arena
      until the node dies: +553 MB per pass. A Const whose ``value`` attribute object has not been replaced
      since it was written is now left as it is (no optimizer mutates a tensor in place: each sets a new
      attribute). Its deep copy of the whole graph before every pass (``catch_errors``) is switched off too.
    Applied once per process; the outputs are unchanged (tested against the Keras model's own)."""
    from tf2onnx import constants, tf_loader
    from tf2onnx.graph import Node

    if getattr(Node.update_proto, "_edgeplan", False):
        return
    tf_loader.tf_optimize_grappler = tf_ops.inline_functions  # function calls only, on graphs without weights
    tf_ops.register_handlers()
    os.environ[constants.ENV_TF2ONNX_CATCH_ERRORS] = "false"  # present = no deep copies (tf2onnx 1.17)
    original = Node.update_proto

    def update_proto(self, external_tensor_storage=None):
        if external_tensor_storage is None and self.type == "Const" and len(self._attr) == 1:
            value = self._attr.get("value")
            if value is not None and self.__dict__.get("_edgeplan_written") is value:
                del self._op.input[:]
                self._op.input.extend(self.input)
                del self._op.output[:]
                self._op.output.extend(self.output)
                return
            original(self)
            self.__dict__["_edgeplan_written"] = value
            return
        original(self, external_tensor_storage)

    update_proto._edgeplan = True
    Node.update_proto = update_proto


def _from_keras(path: Path, input_shape) -> onnx.ModelProto:
    import keras
    import tf2onnx

    _bounded_tf2onnx()

    if path.suffix == ".keras" and not zipfile.is_zipfile(path):  # Keras would say "File not found"
        raise CorruptModelError(f"{path}: not a readable .keras file (a .keras file is a zip archive; this one is "
                                "not: truncated or damaged?).")
    try:
        km = keras.models.load_model(path, compile=False)
    except Exception as e:
        raise CorruptModelError(f"{path}: Keras could not load it ({type(e).__name__}: {e}).") from e
    if len(km.inputs) != 1 or len(km.outputs) != 1:
        raise UnsupportedModelError(
            f"{path}: the model has {len(km.inputs)} inputs and {len(km.outputs)} outputs; "
            "edgeplan handles single-input, single-output models."
        )
    name = "input"
    sig = _keras_input_signature(km.inputs[0].shape, input_shape, km.inputs[0].dtype, name, path)
    nchw = [name] if len(sig[0].shape) == 4 else None
    try:
        if hasattr(km, "stateless_call"):
            held = [km]
            del km  # the conversion frees the model once it has its weights: no reference may stay here
            return _stateless_keras(held, sig, nchw, path)
        model, _ = tf2onnx.convert.from_keras(km, input_signature=sig, opset=OPSET, inputs_as_nchw=nchw)
        _refuse_unknown_ops(model, path, "tf2onnx has no conversion for")
    except EdgeplanError:
        raise
    except Exception as e:
        raise UnsupportedModelError(f"{path}: tf2onnx could not convert it ({type(e).__name__}: {e}).") from e
    del km
    _release_heap()
    return model


WEIGHT = "edgeplan_weight_"


def _stateless_keras(held: list, sig, nchw, source) -> onnx.ModelProto:
    """A Keras 3 model to ONNX without freezing its variables into constants (TensorFlow's freezing took +5.1
    GB for VGG16's 553 MB): its ``stateless_call`` is converted with every variable as a function input,
    so the converted graph holds no weights; the weights become initializers afterwards, the Keras model is
    freed, the constant subgraphs they feed (batch-norm scales, kernel layouts) are folded on the ONNX graph,
    and then tf2onnx's optimizer (transpose cancellation, ...) runs on a copy without the large tensors.
    VGG16: 26 s and 3.3 GB above the libraries' baseline, against 84 s and 7.7 GB frozen (OOM with grappler)."""
    import numpy as np
    import tensorflow as tf
    import tf2onnx
    from onnx import numpy_helper
    from tf2onnx import optimizer
    from tf2onnx.graph import GraphUtil

    km = held.pop()  # ``held``: the caller's only reference, so that ``del km`` below frees the model
    variables = [*km.trainable_variables, *km.non_trainable_variables]
    n_trainable = len(km.trainable_variables)
    specs = [*sig, *(tf.TensorSpec(v.shape, v.dtype, name=f"{WEIGHT}{i}") for i, v in enumerate(variables))]

    @tf.function(input_signature=specs)
    def call(x, *ws):
        return km.stateless_call(list(ws[:n_trainable]), list(ws[n_trainable:]), x, training=False)[0]

    model, _ = tf2onnx.convert.from_function(call, input_signature=specs, opset=OPSET, inputs_as_nchw=nchw)
    _refuse_unknown_ops(model, source, "tf2onnx has no conversion for")
    g = model.graph
    names = {i.name for i in g.input}
    transposed = _lone_transposes(g, names)
    for i, v in enumerate(variables):
        key = f"{WEIGHT}{i}" if f"{WEIGHT}{i}" in names else f"{WEIGHT}{i}:0"
        if key not in names:  # (a variable the inference graph does not use has no input)
            continue
        value = v.numpy()
        if key in transposed:  # a kernel read only by a layout Transpose: stored transposed, the node dropped
            key, perm = transposed[key]
            value = np.ascontiguousarray(value.transpose(perm))
        g.initializer.append(numpy_helper.from_array(value, key))
        del value
    kept = [i for i in g.input if not i.name.startswith(WEIGHT)]
    del g.input[:]
    g.input.extend(kept)
    if transposed:
        outs = {out for out, _ in transposed.values()}
        nodes = [n for n in g.node if not (n.op_type == "Transpose" and n.output[0] in outs)]
        del g.node[:]
        g.node.extend(nodes)
    _captures_as_constants(model, call)
    del km, variables, call
    _release_heap()
    model = _fold(_infer_shapes(model))  # kernels and batch-norm constants become plain initializers
    # tf2onnx's passes (transposes pushed and cancelled, ...) never need the large tensors by now: they run on a
    # model where those are typed graph inputs, and the tensors are attached again after (one copy, not four)
    light = wire.light_copy(model, large_as_inputs=True)
    large = [t for t in model.graph.initializer if wire.large(t)]
    graph = optimizer.optimize_graph(GraphUtil.create_graph_from_onnx_model(light), catch_errors=False)
    out = graph.make_model("edgeplan")
    del graph, light
    names = {t.name for t in large}
    kept = [i for i in out.graph.input if i.name not in names]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(large)
    del model, large
    _release_heap()
    return out


def _lone_transposes(g: onnx.GraphProto, weights: set[str]) -> dict[str, tuple[str, list[int] | None]]:
    """``weight input -> (Transpose output, perm)`` for the weight inputs whose one reader is a Transpose (Keras
    kernels, HWIO, to ONNX's OIHW). Stored already transposed, they never reach the constant folding: folding them
    ran every kernel through onnxruntime at once, and ResNet152V2 at 299 held 1.0 GB above the folding's start
    (241 MB of weights), the peak of its ingest. A transpose moves values: the same bits either way."""
    readers: dict[str, list] = {}
    for n in g.node:
        for x in n.input:
            if x in weights:
                readers.setdefault(x, []).append(n)
    out = {}
    for name, ns in readers.items():
        if len(ns) == 1 and ns[0].op_type == "Transpose" and len(ns[0].input) == 1:
            perm = next((list(a.ints) for a in ns[0].attribute if a.name == "perm"), None)
            out[name] = (ns[0].output[0], perm)
    return out


def _captures_as_constants(model: onnx.ModelProto, fn) -> None:
    """Graph inputs that are tensors the converted ``fn`` captured rather than took as arguments become
    initializers: Keras 3's Normalization keeps its mean and variance as tensors made at build, not as
    variables (EfficientNet's stem), and tf2onnx leaves such captures as inputs."""
    import tensorflow as tf
    from onnx import numpy_helper

    captured = {inner.name: outer for outer, inner in fn.get_concrete_function().graph.captures
                if outer.dtype != tf.resource}
    g = model.graph
    found = [i.name for i in g.input if i.name in captured]
    for name in found:
        g.initializer.append(numpy_helper.from_array(captured[name].numpy(), name))
    kept = [i for i in g.input if i.name not in found]
    del g.input[:]
    g.input.extend(kept)


def _release_heap() -> None:
    """Free what the Keras model, the conversion or a pass of canonicalisation held, and hand freed heap back to
    the system (VGG16: canonicalisation then starts at 2.6 GB instead of 5.1 GB).
    Not ``keras.backend.clear_session()``: it resets global Keras state another thread may be using."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _from_saved_model(path: Path, input_shape) -> onnx.ModelProto:
    import tensorflow as tf
    import tf2onnx

    _bounded_tf2onnx()

    try:
        loaded = tf.saved_model.load(str(path))
        fn = loaded.signatures["serving_default"]
    except Exception as e:
        raise CorruptModelError(
            f"{path}: TensorFlow could not load a 'serving_default' signature ({type(e).__name__}: {e})."
        ) from e
    specs = [s for s in fn.structured_input_signature[1].values()]
    if len(specs) != 1 or len(fn.structured_outputs) != 1:
        raise UnsupportedModelError(
            f"{path}: the serving signature has {len(specs)} inputs and {len(fn.structured_outputs)} "
            "outputs; edgeplan handles single-input, single-output models."
        )
    arg = next(iter(fn.structured_input_signature[1]))
    spec = specs[0]
    sig = _keras_input_signature(spec.shape, input_shape, spec.dtype, "input", path)
    nchw = [sig[0].name] if len(sig[0].shape) == 4 else None
    output_key = next(iter(fn.structured_outputs))
    wrapped = tf.function(lambda x: fn(**{arg: x})[output_key], input_signature=sig)
    try:
        model, _ = tf2onnx.convert.from_function(wrapped, input_signature=sig, opset=OPSET, inputs_as_nchw=nchw)
        _refuse_unknown_ops(model, path, "tf2onnx has no conversion for")
    except EdgeplanError:
        raise
    except Exception as e:
        raise UnsupportedModelError(f"{path}: tf2onnx could not convert it ({type(e).__name__}: {e}).") from e
    _captures_as_constants(model, wrapped)
    return model


def _static_input(model: onnx.ModelProto, input_shape, source: str) -> None:
    inp = model.graph.input[0]
    dims = inp.type.tensor_type.shape.dim
    if input_shape is not None:
        if len(input_shape) != len(dims):
            raise DynamicShapeError(
                f"{source}: --input-shape has {len(input_shape)} dimensions, input {inp.name!r} has {len(dims)}."
            )
        for d, v in zip(dims, input_shape):
            d.Clear()
            d.dim_value = int(v)
        return
    for i, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value > 0:
            continue
        if i == 0:
            d.Clear()
            d.dim_value = 1
            continue
        label = d.dim_param or "?"
        raise DynamicShapeError(
            f"{source}: input {inp.name!r} dimension {i} is dynamic ({label}); give the full shape with "
            "--input-shape (for example 1,3,224,224)."
        )


def _two_input_sum_to_add(model: onnx.ModelProto) -> None:
    """Sum of two tensors is Add: Add has an int8 TFLite kernel and maps to the Edge TPU, while Sum
    converts to ADD_N, which has neither and would open a float island (ResNet50 of the onnx zoo)."""
    for n in model.graph.node:
        if n.op_type == "Sum" and len(n.input) == 2:
            n.op_type = "Add"


def _bypass_identities(model: onnx.ModelProto) -> None:
    g = model.graph
    outputs = {o.name for o in g.output}
    keep = []
    rename: dict[str, str] = {}
    for n in g.node:
        if n.op_type in _IDENTITY_LIKE and n.output[0] not in outputs:
            src = n.input[0]
            rename[n.output[0]] = rename.get(src, src)
            continue
        keep.append(n)
    if not rename:
        return
    for n in keep:
        for i, x in enumerate(n.input):
            if x in rename:
                n.input[i] = rename[x]
    del g.node[:]
    g.node.extend(keep)


def _explicit_pool_padding(model: onnx.ModelProto) -> None:
    """MaxPool padding after a ReLU becomes an explicit zero Pad (exactly equivalent: the input is >= 0).

    Converted as-is, a padded MaxPool becomes PADV2 with -FLT_MAX as the pad value; int8 calibration then
    sees a range of 1e38 for that tensor (and the convolution output it shares a scale with), which
    destroys the int8 model. A zero pad quantizes exactly.
    """
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    out = []
    for n in g.node:
        pads = next((list(a.ints) for a in n.attribute if a.name == "pads"), [])
        auto = next((a.s for a in n.attribute if a.name == "auto_pad"), b"NOTSET")
        src = producer.get(n.input[0])
        if n.op_type != "MaxPool" or not any(pads) or auto not in (b"NOTSET", b"") or src is None or src.op_type != "Relu":
            out.append(n)
            continue
        rank = len(pads) // 2
        full = [0, 0] + pads[:rank] + [0, 0] + pads[rank:]
        padded = f"{n.input[0]}__maxpool_pad"
        if opset >= 11:
            name = f"{padded}__pads"
            g.initializer.append(onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [len(full)], full))
            out.append(onnx.helper.make_node("Pad", [n.input[0], name], [padded], name=f"{n.name}_pad", mode="constant"))
        else:
            out.append(onnx.helper.make_node("Pad", [n.input[0]], [padded], name=f"{n.name}_pad", mode="constant",
                                             pads=full, value=0.0))
        n.input[0] = padded
        for a in n.attribute:
            if a.name == "pads":
                del a.ints[:]
                a.ints.extend([0] * len(pads))
        out.append(n)
    del g.node[:]
    g.node.extend(out)


def _fold_conv_affine(model: onnx.ModelProto) -> None:
    """A per-output-channel constant ``Mul`` or ``Add`` that alone consumes a Conv's output is folded into the
    Conv's weights and bias (a batch norm after a bias-free convolution, as converters emit it): W*c, b*c+d.
    Exact up to float32 rounding of the products."""
    import numpy as np
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    while True:
        consumers: dict[str, list] = {}
        for n in g.node:
            for x in n.input:
                consumers.setdefault(x, []).append(n)
        folded = None
        for conv in g.node:
            if conv.op_type != "Conv" or len(conv.input) < 2 or conv.input[1] not in inits:
                continue
            out = conv.output[0]
            nxt = consumers.get(out, [])
            if len(nxt) != 1 or out in graph_outputs or nxt[0].op_type not in ("Mul", "Add"):
                continue
            op = nxt[0]
            other = op.input[1] if op.input[0] == out else op.input[0]
            if other not in inits:  # (a constant several nodes share stays for the others)
                continue
            wt, ct = inits[conv.input[1]], inits[other]
            o, rank = wt.dims[0], len(wt.dims)
            # per output channel: broadcast against the (N, C, spatial...) output, every axis but C has size 1;
            # checked on the dims, before any tensor is decoded
            dims = (1,) * (rank - len(ct.dims)) + tuple(ct.dims)
            if ct.data_type != wt.data_type or len(ct.dims) > rank \
                    or any(d != 1 for k, d in enumerate(dims) if k != 1) or dims[1] not in (1, o):
                continue
            w, c = numpy_helper.to_array(wt), numpy_helper.to_array(ct)
            c = np.broadcast_to(c.reshape(-1), (o,)).astype(w.dtype)
            b = (numpy_helper.to_array(inits[conv.input[2]]) if len(conv.input) > 2 and conv.input[2]
                 else np.zeros(o, w.dtype))
            if op.op_type == "Mul":
                w = w * c.reshape((o,) + (1,) * (w.ndim - 1))
                b = b * c
            else:
                b = b + c
            wname, bname = f"{conv.name or out}__w", f"{conv.name or out}__b"
            for name, arr in ((wname, w), (bname, b)):
                if name in inits:
                    g.initializer.remove(inits.pop(name))
                t = numpy_helper.from_array(np.ascontiguousarray(arr.astype(w.dtype)), name)
                g.initializer.append(t)
                inits[name] = t
            del conv.input[1:]
            conv.input.extend([wname, bname])
            conv.output[0] = op.output[0]
            folded = op
            break
        if folded is None:
            break
        g.node.remove(folded)
    used = {x for n in g.node for x in n.input}
    for t in [t for t in g.initializer if t.name not in used]:
        g.initializer.remove(t)


def _infer_shapes(model: onnx.ModelProto, **kw) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` without copying the weights: it round-trips the whole model
    through bytes (twice 553 MB for VGG16) yet needs only the dims of large initializers (values only of small,
    shape-like ones). Inference runs on a copy whose large initializers are dims-only stubs; the inferred
    value_info and outputs are put into ``model``, which is returned."""
    g = model.graph
    inferred = shape_inference.infer_shapes(wire.light_copy(model), **kw)
    del g.value_info[:]
    g.value_info.extend(inferred.graph.value_info)
    for out, found in zip(g.output, inferred.graph.output):
        out.type.CopyFrom(found.type)
    return model


def _folded_reads(g: onnx.GraphProto) -> set[str]:
    """Names of the initializers constant folding may read: those a node reads whose inputs are all constants,
    directly or through such nodes (a Shape or Size counts as constant: the folding reads static shapes), and
    any a subgraph names."""
    const = {t.name for t in g.initializer}
    folded: list[onnx.NodeProto] = []
    grew = True
    while grew:  # to a fixed point: nodes may be out of order before the first toposort
        grew = False
        for n in g.node:
            if all(o in const for o in n.output if o):
                continue
            if n.op_type in ("Shape", "Size") or all(x in const for x in n.input if x):
                const.update(o for o in n.output if o)
                folded.append(n)
                grew = True
    reads = {x for n in folded for x in n.input}
    for n in g.node:
        for a in n.attribute:
            for sub in [a.g] * a.HasField("g") + list(a.graphs):
                reads.update(x for m in sub.node for x in m.input)
    return reads


def _fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with constants folded, unused tensors removed and nodes in topological order (onnx-graphsurgeon).
    The folding runs on a light copy holding only the large initializers it may read; the others, untouched by it,
    stay in ``model``, which is made into the result in place (VGG16's or a 2 GB model's weights are never copied:
    graphsurgeon's export copied them all, and its folding held more; wide_fc_2g: +7.8 GB)."""
    import onnx_graphsurgeon as gs

    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.severity = G_LOGGER.ERROR
    graph = gs.import_onnx(wire.light_copy(model, keep=_folded_reads(model.graph)))
    graph.fold_constants(error_ok=True, size_threshold=None)
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    out = gs.export_onnx(graph)
    del graph
    out.ir_version = model.ir_version
    return _into(model, out)


def _into(model: onnx.ModelProto, out: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` made equal to ``out`` but for ``out``'s stubs, which become ``model``'s tensors of those names, in
    place: removing from and sorting a repeated field moves no tensor data, appending to another message copies it."""
    g, og = model.graph, out.graph
    stubs = {t.name for t in og.initializer if wire.is_stub(t)}
    order = {t.name: i for i, t in enumerate(og.initializer)}
    for i in reversed(range(len(g.initializer))):
        if g.initializer[i].name not in stubs:
            del g.initializer[i]
    g.initializer.extend(t for t in og.initializer if t.name not in stubs)
    g.initializer.sort(key=lambda t: order[t.name])
    og.ClearField("initializer")
    for fd, _ in model.ListFields():
        if fd.name != "graph":
            model.ClearField(fd.name)
    for fd, _ in g.ListFields():
        if fd.name != "initializer":
            g.ClearField(fd.name)
    model.MergeFrom(out)
    return model


def canonicalise(
    model: onnx.ModelProto, *, input_shape: Sequence[int] | None = None, source: str = "<model>"
) -> onnx.ModelProto:
    """Return the canonical form of ``model`` (see module docstring). Raises on what it cannot fix."""
    g = model.graph
    # IR < 4 requires initializers to be graph inputs too; we drop those inputs, so lift the IR version.
    # onnxruntime (used to fold constants and to verify) reads IR versions up to 13.
    model.ir_version = min(max(model.ir_version, 8), 13)
    inits = {t.name for t in g.initializer}
    real_inputs = [i for i in g.input if i.name not in inits]
    del g.input[:]
    g.input.extend(real_inputs)
    if len(real_inputs) != 1 or len(g.output) != 1:
        raise UnsupportedModelError(
            f"{source}: the model has {len(real_inputs)} inputs and {len(g.output)} outputs; "
            "edgeplan handles single-input, single-output models."
        )
    _static_input(model, input_shape, source)
    _screen(model, source)
    # Forget every inferred shape: they are recomputed from the now static input.
    del g.value_info[:]
    for o in g.output:
        o.type.tensor_type.ClearField("shape")
    try:
        for _ in range(2):
            model = _fold(_infer_shapes(model, data_prop=True))
            _release_heap()
        _bypass_identities(model)
        _fold_conv_affine(model)
        _release_heap()
        _two_input_sum_to_add(model)
        _explicit_pool_padding(model)
        _name_shared_constants(model.graph)
        del model.graph.value_info[:]
        model = _infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        raise UnsupportedModelError(f"{source}: shape inference failed ({e}).") from e
    _check_static(model, source)
    try:
        # on the copy without the large weights' data: the checker serializes what it is given and parses it again
        # (VGG16: +1.8 GB, the peak of its ingest), and never reads the values of large tensors
        onnx.checker.check_model(wire.light_copy(model, large_as_inputs=True), full_check=False)
    except onnx.checker.ValidationError as e:
        raise CorruptModelError(f"{source}: the canonical model does not pass the ONNX checker: {e}") from e
    return model


MAX_INPUT_ELEMENTS = 1 << 26  # 64 Mi values (256 MB of float32 per input): far above any edge model's input


def _screen(model: onnx.ModelProto, source: str) -> None:
    """Refuse, naming what and where, what later stages would fail on with a traceback or an abort: an opset
    newer than this onnx knows, an op ONNX does not define (or of another domain), a node that reads a later
    node's output (a cycle, or nodes out of order), a float initializer holding NaN or infinities, and an
    input of more than MAX_INPUT_ELEMENTS values (calibration data is made at its size)."""
    import numpy as np
    from onnx import numpy_helper

    g = model.graph
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise UnsupportedModelError(f"{source}: opset {o.version}; this onnx reads opsets up to {newest}.")
    _refuse_unknown_ops(model, source, "ONNX does not define")
    cycle = _cycle(g)
    if cycle:
        raise CorruptModelError(f"{source}: the graph has a cycle through node{'s' if len(cycle) > 1 else ''} "
                                f"{', '.join(_shown(n) for n in cycle[:5])}{' ...' if len(cycle) > 5 else ''}.")
    for t in g.initializer:
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            try:  # raw bytes viewed, not converted (reading the field copies them once)
                a = np.frombuffer(t.raw_data, onnx.helper.tensor_dtype_to_np_dtype(t.data_type)) \
                    if t.HasField("raw_data") else numpy_helper.to_array(t).reshape(-1)
            except ValueError as e:
                raise CorruptModelError(f"{source}: initializer {_shown(t.name)} does not hold the values its shape "
                                        f"{list(t.dims)} declares ({e}).") from e
            bad = sum(int(np.count_nonzero(~np.isfinite(a[i:i + (1 << 22)]))) for i in range(0, a.size, 1 << 22))
            if bad:
                raise CorruptModelError(f"{source}: initializer {_shown(t.name)} holds {bad} NaN or infinite values.")
    inp = g.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    count = math.prod(max(d, 1) for d in shape)
    if count > MAX_INPUT_ELEMENTS:
        raise UnsupportedModelError(f"{source}: input {_shown(inp.name)} of shape {shape} holds {count:,} values; "
                                    f"edgeplan takes at most {MAX_INPUT_ELEMENTS:,} per input.")


def _refuse_unknown_ops(model: onnx.ModelProto, source: str, why: str) -> None:
    """Refuse a model with nodes whose op standard ONNX does not define (another domain, or a name ONNX lacks:
    what tf2onnx leaves of a TensorFlow op it cannot convert), naming every such op, how many nodes and which."""
    unknown: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or not onnx.defs.has(n.op_type):
            op = _shown(n.op_type) + (f" (domain {_shown(n.domain)})" if n.domain not in ("", "ai.onnx") else "")
            unknown.setdefault(op, []).append(n.name)
    if not unknown:
        return
    parts = [f"{op} x{len(names)} ({', '.join(_shown(x, 60) for x in names[:2])}{', ...' if len(names) > 2 else ''})"
             for op, names in sorted(unknown.items(), key=lambda kv: -len(kv[1]))]
    raise UnsupportedModelError(f"{source}: {why} {'these ops' if len(parts) > 1 else 'this op'}: "
                                f"{'; '.join(parts[:6])}{'; ...' if len(parts) > 6 else ''}. edgeplan converts "
                                "standard ONNX ops only.")


def _cycle(g) -> list[str]:
    """Names of the nodes on or behind a cycle (Kahn's algorithm over the tensors nodes read and write), or []
    for an acyclic graph, in whatever order its nodes are listed."""
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    waits = [{producer[x] for x in n.input if x in producer} for n in g.node]  # (a node reading itself waits)
    readers: dict[int, list[int]] = {}
    for i, w in enumerate(waits):
        for j in w:
            readers.setdefault(j, []).append(i)
    left = [len(w) for w in waits]
    ready = [i for i, k in enumerate(left) if k == 0]
    while ready:
        j = ready.pop()
        for i in readers.get(j, ()):
            left[i] -= 1
            if left[i] == 0:
                ready.append(i)
    return [g.node[i].name or f"#{i} {g.node[i].op_type}" for i, k in enumerate(left) if k > 0]


def _shown(name: str | bytes, limit: int = 80) -> str:
    """A name read from an untrusted model, quoted and cut short (a corrupt file can put anything there)."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return repr(name if len(name) <= limit else name[:limit] + "...")


def _check_static(model: onnx.ModelProto, source: str) -> None:
    g = model.graph
    known = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output)}
    inits = {t.name for t in g.initializer}
    for n in g.node:
        for o in n.output:
            if not o or o in inits:
                continue
            vi = known.get(o)
            if vi is None or not vi.type.tensor_type.HasField("shape"):
                raise DynamicShapeError(
                    f"{source}: tensor {o!r} (output of {n.op_type} node {n.name!r}) has no static "
                    "shape after inference; give --input-shape or simplify the model."
                )
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value") or d.dim_value <= 0:
                    raise DynamicShapeError(
                        f"{source}: tensor {o!r} (output of {n.op_type} node {n.name!r}) keeps a "
                        f"dynamic dimension ({d.dim_param or '?'}); give --input-shape."
                    )
