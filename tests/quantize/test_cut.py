"""Cutting the int8 model: prefix -> suffix chains are bit-identical to the whole model; buffers pruned."""
from __future__ import annotations

import numpy as np
import pytest

from edgeplan.errors import CutError
from edgeplan.quantize import litert
from edgeplan.quantize.cut import cut
from edgeplan.quantize.tflite_graph import TfliteGraph


@pytest.mark.parametrize("name", ["tiny_cnn", "light_squeezenet"])
def test_every_single_tensor_cut_chains_bit_identically(compiled, name):
    d, _, _ = compiled(name)
    data = (d / "model_int8.tflite").read_bytes()
    g = TfliteGraph(data)
    whole = litert.interpreter(data)
    inp = whole.get_input_details()[0]
    rng = np.random.default_rng(7)
    xs = [rng.integers(-128, 128, inp["shape"], dtype=np.int8) for _ in range(2)]
    ref = [litert.run(whole, x) for x in xs]
    cuts = [t.index for t in g.tensors if t.index in g.producer and t.index not in g.outputs
            and not t.constant and g.is_single_tensor_cut(t.index)]
    assert len(cuts) >= 5
    for ix in cuts:
        pre, suf = cut(g, ix)
        pg, sg = TfliteGraph(pre), TfliteGraph(suf)
        # every parameter lands in exactly one side; nothing unused is kept
        assert pg.param_bytes() + sg.param_bytes() == g.param_bytes()
        assert len(pg.ops) + len(sg.ops) == len(g.ops)
        assert pg.tensors[pg.outputs[0]].scale == g.tensors[ix].scale == sg.tensors[sg.inputs[0]].scale
        p, s = litert.interpreter(pre), litert.interpreter(suf)
        for x, r in zip(xs, ref):
            np.testing.assert_array_equal(litert.run(s, litert.run(p, x)), r)


def test_a_tensor_inside_a_residual_block_is_refused(compiled):
    d, _, _ = compiled("tiny_cnn")
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    inside = [t.index for t in g.tensors if t.index in g.producer and not g.is_single_tensor_cut(t.index)]
    assert inside, "tiny_cnn has a residual block"
    with pytest.raises(CutError, match="not a single-tensor cut"):
        cut(g, inside[0])
