"""verify: passes on real models at every point; fails loudly on tampered segments and flat models."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tensorflow.lite.tools import flatbuffer_utils

from edgeplan.pipeline import stages


@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_cnn_lrn", "light_squeezenet", "mobilenetv2_0.35_96"])
def test_real_models_pass_at_every_point(compiled, name):
    d, result, report = compiled(name)
    assert not result.errors
    assert report.ok, [c for c in report.points if not c.ok]
    assert len(report.points) == len(result.analysis.points) >= 3
    assert all(c.int8_identical_fraction == 1.0 for c in report.points)
    assert report.input_dependence > 1e-3
    saved = json.loads((d / "verify.json").read_text())
    assert saved["ok"] and len(saved["points"]) == len(report.points)


def test_keras_mobilenetv2_has_the_expected_segments(compiled):
    d, result, _ = compiled("mobilenetv2_0.35_96")
    assert len(result.analysis.points) == 10  # max_points 8 + points 0 and P
    for p in result.analysis.points[1:-1]:
        seg = d / "segments" / f"p{p.index}"
        assert all((seg / f).is_file() for f in ("prefix.onnx", "suffix.onnx", "prefix_int8.tflite",
                                                    "suffix_int8.tflite", "prefix_edgetpu.tflite", "compile.json"))
    assert not (d / "segments" / "p0" / "prefix.onnx").exists()
    assert (d / "segments" / "p0" / "suffix_int8.tflite").is_file()
    assert (d / "segments" / f"p{result.analysis.last}" / "prefix_edgetpu.tflite").is_file()


def _tamper(path):
    """Flip the low bit of every weight byte in the largest buffer of an int8 model."""
    model = flatbuffer_utils.read_model(str(path))
    big = max(model.buffers, key=lambda b: 0 if b.data is None else len(b.data))
    big.data = (np.asarray(big.data, dtype=np.uint8) ^ 1).tolist()
    flatbuffer_utils.write_model(model, str(path))


def test_a_tampered_suffix_fails_its_point_only(compiled, params, tmp_path):
    src, result, _ = compiled("tiny_cnn")
    d = tmp_path / "copy"
    shutil.copytree(src, d)
    _tamper(d / "segments" / "p3" / "suffix_int8.tflite")
    report = stages.verify(d, params)
    bad = [c.point for c in report.points if not c.ok]
    assert bad == [3] and not report.ok
    assert report.points[3].int8_identical_fraction < 1.0 and not report.points[3].int8_ok
    (d / "segments" / "p4" / "prefix.onnx").write_bytes(b"garbage")
    report = stages.verify(d, params)
    assert [c.point for c in report.points if not c.ok] == [3, 4]
    assert "prefix.onnx" in report.points[4].error or "INVALID" in report.points[4].error


def test_a_flat_model_fails_the_input_dependence_check(compiled, params, tmp_path):
    src, _, _ = compiled("tiny_cnn")
    d = tmp_path / "flat"
    shutil.copytree(src, d)
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(d / "model.onnx"))
    for t in m.graph.initializer:
        if t.name == "conv5.w":
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    onnx.save(m, str(d / "model.onnx"))
    report = stages.verify(d, params)
    assert not report.input_dependence_ok and report.input_dependence < 1e-3 and not report.ok


def test_the_cosine_floor_is_enforced(compiled, params, tmp_path):
    import copy

    src, _, report = compiled("mobilenetv2_0.35_96")
    worst = min(c.int8_float_cosine for c in report.points)
    assert 0.85 <= worst < 0.99
    strict = copy.deepcopy(params)
    strict["verify"]["min_cosine"] = 0.99
    d = tmp_path / "strict"
    shutil.copytree(src, d)
    r = stages.verify(d, strict)
    assert not r.ok and all(not c.cosine_ok and c.int8_ok and c.float_ok for c in r.points)
