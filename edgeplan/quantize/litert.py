"""Run TFLite models with the LiteRT interpreter (numpy + ai-edge-litert only: safe for the runtime).

``deterministic=True`` uses LiteRT's builtin kernels without the default XNNPACK delegate
(``BUILTIN_WITHOUT_DEFAULT_DELEGATES``), so two runs of the same op on the same data give the same bits whichever
model the op sits in. ``unpacked`` uses the reference kernels (``BUILTIN_REF``), another set.
"""
from __future__ import annotations

import os

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

# threads for runs whose results are compared bit for bit: integer arithmetic gives the same bits on any number
EVERY_CORE = os.cpu_count() or 1


def interpreter(model: bytes, *, deterministic: bool = True, keep_all: bool = False, threads: int = 1) -> Interpreter:
    it = Interpreter(
        model_content=bytes(model),
        num_threads=threads,
        experimental_preserve_all_tensors=keep_all,
        experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if deterministic else OpResolverType.AUTO
        ),
    )
    it.allocate_tensors()
    return it


def unpacked(model: bytes, threads: int = 1) -> Interpreter:
    """``model`` on LiteRT's reference kernels (``BUILTIN_REF``): they read the int8 weights where the model holds
    them, so a build packs nothing. XNNPACK packs every weight at build: a 14 MiB fully-connected part of VGG19's
    fc1 builds in 16-31 ms and runs in 1.3-2.2 ms there, in 0.25 ms and 4.7 ms here, with the same output bits
    (a convolution runs 10x slower here). A streamed segment may be built either way (``flashmem.segment_kernels``).
    """
    it = Interpreter(model_content=bytes(model), num_threads=threads,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    return it


def primed(model: bytes, threads: int = 1, rows: int | None = None) -> Interpreter:
    """A default-kernel (XNNPACK) interpreter fed zero inputs and invoked once: ready to time. ``rows``: the
    first input resized to that many rows (NHWC height) first."""
    it = interpreter(model, deterministic=False, threads=threads)
    if rows is not None:
        first = it.get_input_details()[0]
        it.resize_tensor_input(first["index"], [first["shape"][0], rows, *first["shape"][2:]])
        it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
    return it


def quantize(x: np.ndarray, detail: dict) -> np.ndarray:
    """Float -> the tensor's dtype with its (per-tensor) scale and zero point; pass-through for float."""
    dtype = detail["dtype"]
    scale, zero = detail["quantization"]
    if not scale:
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale + zero), info.min, info.max).astype(dtype)


def random_value(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    """A random input: integers over the whole range of an integer dtype, floats in [-1, 1]."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def dequantize(q: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero = detail["quantization"]
    if not scale:
        return q.astype(np.float32)
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


def run(it: Interpreter, x: np.ndarray) -> np.ndarray:
    """Invoke a single-input, single-output interpreter on one already-typed input."""
    return Runner(it)(x)


class Runner:
    """``run`` for one interpreter served many times: its input and output resolved once (the interpreter's
    ``get_*_details`` build dictionaries on every call, tens of microseconds each)."""

    def __init__(self, it: Interpreter):
        inp, out = it.get_input_details()[0], it.get_output_details()[0]
        self.it, self.index, self.dtype, self.shape, self.out = it, inp["index"], inp["dtype"], inp["shape"], out["index"]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.it.set_tensor(self.index, x if x.dtype == self.dtype and x.shape == tuple(self.shape)
                           else x.astype(self.dtype).reshape(self.shape))
        self.it.invoke()
        return self.it.get_tensor(self.out).copy()


def nchw_to_nhwc(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if x.ndim == 4 else x


def nhwc_to_nchw(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 3, 1, 2) if x.ndim == 4 else x
