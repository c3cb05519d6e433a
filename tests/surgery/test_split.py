"""Prefix/suffix surgery: compared with sub-graphs built by hand, and run on data."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgeplan.errors import CutError
from edgeplan.graph.ingest import canonicalise
from edgeplan.surgery import split
from edgeplan.zoo import tiny


def _structure(model):
    return [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString())
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def model():
    return canonicalise(tiny.model())


def test_split_after_the_residual_block(model):
    pre = split.prefix(model, "relu4.out")
    suf = split.suffix(model, "relu4.out")
    whole = _structure(model)
    cut = [i for i, n in enumerate(model.graph.node) if "relu4.out" in n.output][0] + 1
    # Expected: exactly the nodes before and after the cut, in order, wired as in the whole model.
    assert _structure(pre) == whole[:cut]
    assert _structure(suf) == whole[cut:]
    assert [i.name for i in pre.graph.input] == ["input"] and [o.name for o in pre.graph.output] == ["relu4.out"]
    assert [i.name for i in suf.graph.input] == ["relu4.out"] and [o.name for o in suf.graph.output] == ["logits"]
    assert {t.name for t in pre.graph.initializer}.isdisjoint({t.name for t in suf.graph.initializer})
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(suf, _run(pre, x)), _run(model, x), rtol=0, atol=1e-6)


def test_a_tensor_inside_the_residual_block_is_not_a_cut(model):
    with pytest.raises(CutError, match="not a single-tensor cut"):
        split.suffix(model, "relu3.out")


def test_unknown_tensor(model):
    with pytest.raises(CutError, match="nope"):
        split.prefix(model, "nope")
