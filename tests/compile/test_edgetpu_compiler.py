"""The real compiler's output parser, on real compiler output from public threads and repositories."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from edgeplan.compile import edgetpu_compiler as ec
from edgeplan.errors import CompilerError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "edgetpu_compiler"
MiB, KiB = 1024**2, 1024


def _read(name):
    return (FIX / name).read_text()


def test_sizes():
    assert ec.size_bytes("0.00B") == 0
    assert ec.size_bytes("1.75KiB") == 1792
    assert ec.size_bytes("7.04MiB") == round(7.04 * MiB)
    with pytest.raises(ValueError):
        ec.size_bytes("seven")


def test_fully_mapped_model():
    (r,) = ec.parse_output(_read("facenet_stdout.txt"))
    assert r.compiler == "edgetpu_compiler" and r.compiler_version == "15.0.340273435"
    assert r.model == "facenet_keras.tflite"
    assert r.onchip_param_bytes == round(7.04 * MiB) and r.offchip_param_bytes == round(15.06 * MiB)
    assert r.onchip_remaining_bytes == round(1.25 * KiB)
    assert (r.subgraph_count, r.total_ops, r.tpu_ops, r.cpu_ops) == (1, 214, 214, 0)
    assert sum(row.count for row in r.operators) == 214
    assert ("CONV_2D", 132, "Mapped to Edge TPU") in [(o.op, o.count, o.status) for o in r.operators]
    assert r.first_unmapped is None


def test_partly_mapped_model_names_the_op_that_ends_the_tpu_part():
    (r,) = ec.parse_output(_read("yolov3_tiny_stdout.txt"))
    assert (r.total_ops, r.tpu_ops, r.cpu_ops) == (36, 2, 34)
    assert r.offchip_param_bytes == 0 and r.onchip_param_bytes == 3 * KiB
    statuses = {(o.op, o.status) for o in r.operators}
    assert ("MAX_POOL_2D", "More than one subgraph is not supported") in statuses
    assert r.first_unmapped["op"] == "QUANTIZE"
    assert r.first_unmapped["status"].startswith("Operation is otherwise supported, but not mapped")


def test_table_with_all_other_operators_line():
    (r,) = ec.parse_output(_read("frc_stdout.txt"))
    assert (r.tpu_ops, r.cpu_ops) == (138, 3)
    assert [o.op for o in r.operators] == ["RESHAPE", "CONCATENATION", "QUANTIZE"]
    assert r.compiler_version == "unknown"  # the excerpt starts below the version line


def test_cocompiled_models_share_the_cache():
    first, second = ec.parse_output(_read("cocompile_stdout.txt"))
    assert (first.model, second.model) == ("cnn_first.tflite", "rnn_second.tflite")
    assert first.onchip_param_bytes == round(7.16 * MiB) and second.onchip_param_bytes == 0
    assert second.offchip_param_bytes == round(2.99 * MiB)
    assert first.cocompiled_with == ("rnn_second.tflite",) and second.cocompiled_with == ("cnn_first.tflite",)
    assert (first.total_ops, second.total_ops) == (313, 17)


def test_operation_log_fills_the_table():
    stdout = _read("model_no_table_stdout.txt").replace("quantized_model_edgetpu.log", "tiny_yolo_edgetpu.log")
    (r,) = ec.parse_output(stdout, {"tiny_yolo_edgetpu.log": _read("tiny_yolo_edgetpu.log")})
    assert r.onchip_param_bytes == round(604.5 * KiB) and r.onchip_remaining_bytes == round(511.5 * KiB)
    assert len(r.operators) == 8
    assert ("RESIZE_NEAREST_NEIGHBOR", 1, "Operation version not supported") in [(o.op, o.count, o.status) for o in r.operators]
    assert r.first_unmapped["op"] == "RESIZE_NEAREST_NEIGHBOR"
    assert "Operator" in r.log


def test_log_table_alone():
    rows = ec.parse_table(_read("tiny_yolo_edgetpu.log"))
    assert sum(r.count for r in rows) == 25


def test_output_without_a_model_section_is_an_error():
    with pytest.raises(CompilerError, match="Input model"):
        ec.parse_output("Edge TPU Compiler version 16.0\nCompilation failed: Compilation failed due to large activation tensors in model.\n")


def test_adapter_command_line(tmp_path, monkeypatch):
    """No edgetpu_compiler can be installed here: a stand-in on PATH replays real recorded output and
    records its argv, so the adapter's flags, co-compile order and file handling are exercised."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "edgetpu_compiler"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys, pathlib\n"
        f"pathlib.Path({str(tmp_path / 'argv.txt')!r}).write_text(' '.join(sys.argv[1:]))\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('-o') + 1])\n"
        "for m in [a for a in sys.argv[1:] if a.endswith('.tflite')]:\n"
        "    (out / (pathlib.Path(m).stem + '_edgetpu.tflite')).write_bytes(b'x')\n"
        f"sys.stdout.write(open({str(FIX / 'cocompile_stdout.txt')!r}).read())\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    models = [tmp_path / "cnn_first.tflite", tmp_path / "rnn_second.tflite"]
    out = ec.compile_models(models, tmp_path / "out", allow_multiple_subgraphs=True, num_segments=2)
    argv = (tmp_path / "argv.txt").read_text().split()
    assert argv[:3] == ["-s", "-o", str(tmp_path / "out")] and "-a" in argv and argv[argv.index("-n") + 1] == "2"
    assert argv[-2:] == [str(m) for m in models]
    assert [r.model for r, _ in out] == ["cnn_first.tflite", "rnn_second.tflite"]
    assert all(p.is_file() for _, p in out)
