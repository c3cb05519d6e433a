"""The emulated Edge TPU compiler: op rules, the single-subgraph rule, the parameter cache."""
from __future__ import annotations

import json

from edgeplan.compile import edgetpu_ops as rules
from edgeplan.compile import emulated
from edgeplan.quantize.tflite_graph import TfliteGraph


def test_fully_int8_cnn_maps_entirely(compiled):
    d, result, _ = compiled("tiny_cnn")
    last = result.analysis.last
    r = json.loads((d / "segments" / f"p{last}" / "compile.json").read_text())
    assert r["compiler"] == "emulated" and r["first_unmapped"] is None
    assert r["tpu_ops"] == r["total_ops"] > 0 and r["subgraph_count"] == 1
    graph = TfliteGraph((d / "model_int8.tflite").read_bytes())
    assert r["onchip_param_bytes"] == graph.param_bytes() and r["offchip_param_bytes"] == 0
    assert emulated.is_emulated((d / "segments" / f"p{last}" / "prefix_edgetpu.tflite").read_bytes())
    assert not emulated.is_emulated((d / "model_int8.tflite").read_bytes())


def test_lrn_float_island_ends_the_tpu_part_and_names_lrn(compiled):
    d, result, _ = compiled("tiny_cnn_lrn")
    report = result.reports[result.analysis.last]
    first = report.first_unmapped
    assert first["op"] == "DEQUANTIZE" and first["status"] == rules.UNSUPPORTED_TYPE
    assert "LOCAL_RESPONSE_NORMALIZATION has no int8 kernel" in first["reason"]
    statuses = {(o.op, o.status) for o in report.operators}
    assert ("CONV_2D", rules.MAPPED) in statuses  # conv1, before the island
    assert ("CONV_2D", rules.MORE_THAN_ONE_SUBGRAPH) in statuses  # every conv after it
    assert report.tpu_ops == 1 and report.subgraph_count == 1


def test_multiple_subgraphs_map_what_follows_the_island(compiled):
    d, result, _ = compiled("tiny_cnn_lrn")
    data = (d / "model_int8.tflite").read_bytes()
    ((one, _),) = emulated.compile_models([("m", data)])
    ((many, _),) = emulated.compile_models([("m", data)], allow_multiple_subgraphs=True)
    assert many.tpu_ops > one.tpu_ops and many.subgraph_count == 2
    assert all(o.status != rules.MORE_THAN_ONE_SUBGRAPH for o in many.operators)


def test_cache_fills_in_cocompilation_order_and_streams_the_rest(compiled):
    d, _, _ = compiled("tiny_cnn")
    data = (d / "model_int8.tflite").read_bytes()
    total = TfliteGraph(data).param_bytes()
    (a, _), (b, _) = emulated.compile_models([("a", data), ("b", data)], onchip_bytes=int(total * 1.5))
    assert a.onchip_param_bytes == total and a.offchip_param_bytes == 0
    assert 0 < b.onchip_param_bytes < total and b.onchip_param_bytes + b.offchip_param_bytes == total
    assert b.onchip_remaining_bytes == int(total * 1.5) - total - b.onchip_param_bytes
    assert a.cocompiled_with == ("b",)
    ((small, _),) = emulated.compile_models([("a", data)], onchip_bytes=1000)
    assert small.onchip_param_bytes <= 1000 and small.offchip_param_bytes == total - small.onchip_param_bytes


def test_the_marked_model_is_flatbuffer_utils_round_trip_byte_for_byte(compiled):
    """``_mark`` packs from views of the input into one builder of its size (a 0.57 GB prefix: 3.9 -> 2.5 GB above
    its start); its bytes are those of TensorFlow's own object round trip with the same metadata added."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    d, _, _ = compiled("light_squeezenet")
    data = (d / "segments" / "p5" / "prefix_int8.tflite").read_bytes()
    (report, out), = emulated.compile_models([("prefix_int8.tflite", data)])
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    buf = schema.BufferT()
    buf.data = list(json.dumps({"compiler": report.compiler, "version": report.compiler_version,
                                "tpu_ops": report.tpu_ops, "total_ops": report.total_ops}).encode())
    md = schema.MetadataT()
    md.name, md.buffer = emulated.METADATA_KEY, len(model.buffers)
    model.buffers.append(buf)
    model.metadata = list(model.metadata or []) + [md]
    assert out == bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    assert emulated.is_emulated(out) and not emulated.is_emulated(data)
