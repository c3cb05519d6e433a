"""The model stages on bad input: clear errors that name the op or tensor, nothing produced is lost."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeplan.errors import ArtifactError, ConversionError, ModelVersionConflictError
from edgeplan.pipeline import stages
from edgeplan.quantize import cut as cut_module


def _save(model, path):
    onnx.save(model, str(path))
    return path


def test_an_op_with_no_tflite_conversion_names_the_op(tmp_path, params):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("DFT", ["r"], ["y"], name="spectrum", onesided=0)]
    g = helper.make_graph(nodes, "dft", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dft.onnx")
    d = stages.ingest(path, "dft", "1", tmp_path / "art")
    with pytest.raises(ConversionError, match=r"op 'DFT' \(node 'spectrum'"):
        stages.build(d, params)
    # what ingest produced is still there, untouched
    assert (d / "model.onnx").is_file() and json.loads((d / "model.json").read_text())["name"] == "dft"


def test_model_without_single_tensor_cut_keeps_points_0_and_P(tmp_path, params):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="a", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="b", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "b"], ["y"], name="join")]
    g = helper.make_graph(nodes, "twin", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "twin.onnx")
    d = stages.ingest(path, "twin", "1", tmp_path / "art")
    result = stages.build(d, params)
    assert [p.index for p in result.analysis.points] == [0, 1]
    assert "no single-tensor cut" in result.analysis.note
    report = stages.verify(d, params)
    assert report.ok, report


def test_a_failure_at_one_point_keeps_every_other_point(tmp_path, params, monkeypatch, caplog):
    d = stages.ingest("zoo:tiny_cnn", "tiny", "1", tmp_path / "art")
    real_cut = cut_module.cut
    calls = []

    def failing_third(graph, tensor):  # fault injection: the third interior cut breaks
        calls.append(tensor)
        if len(calls) == 3:
            raise RuntimeError("disk full while writing the cut")
        return real_cut(graph, tensor)

    monkeypatch.setattr(cut_module, "cut", failing_third)
    result = stages.build(d, params)
    assert list(result.errors) == [3] and "disk full" in result.errors[3]
    err = json.loads((d / "segments" / "p3" / "error.json").read_text())
    assert err["point"] == 3 and err["error"] == "RuntimeError: disk full while writing the cut"
    # one line for the user; the traceback only in the point's error.json
    assert "Traceback" in err["traceback"] and "failing_third" in err["traceback"]
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert said == [f"point 3 failed: RuntimeError: disk full while writing the cut (traceback in "
                    f"{d / 'segments' / 'p3' / 'error.json'})"]
    for k in (1, 2, 4, 5):
        assert (d / "segments" / f"p{k}" / "prefix_edgetpu.tflite").is_file()
    report = stages.verify(d, params)
    assert [c.point for c in report.points if not c.ok] == [3] and not report.ok


def test_build_needs_an_ingested_model(tmp_path, params):
    with pytest.raises(ArtifactError, match="model.onnx: missing"):
        stages.build(tmp_path, params)
    with pytest.raises(ArtifactError, match="analysis.json: missing"):
        stages.verify(tmp_path, params)


def test_verify_refuses_segments_of_another_model(compiled, params, tmp_path):
    import shutil

    src, _, _ = compiled("tiny_cnn")
    d = tmp_path / "stale" / "1"
    shutil.copytree(src, d)
    with pytest.raises(ModelVersionConflictError, match="already exists .* as another model"):
        stages.ingest("zoo:tiny_cnn_lrn", "stale", "1", tmp_path)  # a version names one model
    assert stages.ingest("zoo:tiny_cnn", "stale", "1", tmp_path) == d  # the same one again: a no-op
    other = stages.ingest("zoo:tiny_cnn_lrn", "other", "1", tmp_path)
    for f in ("model.onnx", "model.json"):  # a new model.onnx beside the old segments, by hand
        shutil.copy(other / f, d / f)
    with pytest.raises(ArtifactError, match="made for another model.onnx"):
        stages.verify(d, params)


def test_a_conversion_past_its_time_limit_is_stopped_with_a_message(tmp_path):
    from edgeplan.quantize import convert
    from edgeplan.zoo import tiny

    path = _save(tiny.model(), tmp_path / "tiny.onnx")
    log = tmp_path / "logs" / "convert.log"
    with pytest.raises(ConversionError, match=r"did not finish within 1 s \(converter output: .*convert.log\)"):
        convert.to_int8_tflite(path, np.zeros((2, 3, 32, 32), np.float32), tmp_path / "work", timeout=1, log=log)
    assert log.read_text().startswith("=== ") and " timed out: " in log.read_text()


def test_a_build_after_its_conversion_does_not_convert_again(tmp_path, params, monkeypatch):
    """The conversion is build's checkpoint (model_int8.json names what it was made from): a build interrupted
    after it (a killed run, a lost Dask worker) resumes without converting; other inputs, or a damaged int8
    model, convert again."""
    from edgeplan.quantize import convert

    d = stages.ingest("zoo:tiny_cnn", "tiny", "1", tmp_path / "art")
    stages.build(d, params)
    int8 = (d / "model_int8.tflite").read_bytes()
    real, calls = convert.to_int8_tflite, []
    monkeypatch.setattr(convert, "to_int8_tflite", lambda *a, **k: calls.append(a) or real(*a, **k))
    (d / "analysis.json").unlink()  # as a kill after the conversion leaves it
    stages.build(d, params)
    assert calls == [] and (d / "model_int8.tflite").read_bytes() == int8 and (d / "analysis.json").is_file()
    (d / "model_int8.tflite").write_bytes(int8[:-7])  # damaged: converted again
    stages.build(d, params)
    assert len(calls) == 1 and (d / "model_int8.tflite").read_bytes() == int8
    other = {**params, "quantize": {**params["quantize"], "calibration": {**params["quantize"]["calibration"], "seed": 9}}}
    stages.build(d, other)
    assert len(calls) == 2 and json.loads((d / "model_int8.json").read_text())["tflite_sha256"] != hashlib.sha256(int8).hexdigest()
    written = []  # the record goes first: a kill between the two writes leaves no int8 model without its record
    for name in ("write_bytes_atomic", "write_json_atomic"):  # (which the next build would convert and write again)
        monkeypatch.setattr(stages, name,
                            lambda p, *a, _f=getattr(stages, name), **k: written.append(p.name) or _f(p, *a, **k))
    stages.build(d, params)
    assert len(calls) == 3 and written.index("model_int8.json") < written.index("model_int8.tflite")
