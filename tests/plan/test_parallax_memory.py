"""Parallax branch peaks from shapes (``plan/parallax/memory.py``) against the arena TFLite allocates for the
branch's sub-model (the span of its non-constant tensors, reference kernels)."""
from __future__ import annotations

import pytest

from edgeplan.graph.branches import from_tflite, structure
from edgeplan.plan.parallax.memory import naive_bytes, peak_bytes
from edgeplan.profile.capacity import arena_bytes
from edgeplan.quantize import litert
from edgeplan.quantize.stream import cut_ops
from edgeplan.quantize.tflite_graph import TfliteGraph


@pytest.mark.parametrize("model", ["light_squeezenet", "tiny_cnn"])
def test_the_estimate_is_the_arena_tflite_allocates(compiled, model):
    d, _, _ = compiled(model)
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    every = list(range(len(g.ops)))
    whole = arena_bytes(litert.interpreter(g.data, deterministic=True))
    assert peak_bytes(g, every) == pytest.approx(whole, rel=0.01)
    assert naive_bytes(g, every) > whole  # no reuse costs more
    s = structure(from_tflite(g))
    for b in s.branches:  # every branch as its own sub-model
        it = litert.interpreter(cut_ops(g, list(b.nodes), f"b{b.index}"), deterministic=True)
        assert peak_bytes(g, list(b.nodes)) == pytest.approx(arena_bytes(it), rel=0.01), b
