"""The command line: help, the whole compile, analyze --json, exit codes and error messages."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx

from edgeplan.cli import main
from edgeplan.zoo import tiny

REPO = Path(__file__).resolve().parents[1]


def _edgeplan(*args, cwd):
    env = dict(os.environ, COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "edgeplan.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_help_explains_every_command():
    out = subprocess.run([sys.executable, "-m", "edgeplan.cli", "--help"], capture_output=True, text=True).stdout
    for cmd in ("compile", "analyze", "verify", "ingest", "build", "zoo"):
        assert cmd in out
    out = subprocess.run([sys.executable, "-m", "edgeplan.cli", "compile", "--help"], capture_output=True, text=True).stdout
    assert "--input-shape" in out and "--out" in out and "zoo:NAME" in out


def test_compile_writes_the_tree_and_prints_the_verify_table(tmp_path):
    onnx.save(tiny.model(lrn=True), str(tmp_path / "m.onnx"))
    proc = _edgeplan("compile", "m.onnx", "--name", "tiny", "--version", "2", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "EMULATED Edge TPU compiler" in proc.stdout
    assert "verify passed" in proc.stdout and "100.00%" in proc.stdout
    assert "ends at op 1 DEQUANTIZE" in proc.stdout and "LOCAL_RESPONSE_NORMALIZATION has no int8 kernel" in proc.stdout
    root = tmp_path / "out" / "tiny" / "2"
    for f in ("model.onnx", "model.json", "model_int8.tflite", "analysis.json", "verify.json", "memory.json"):
        assert (root / f).is_file(), f
    stages = json.loads((root / "memory.json").read_text())["stages"]  # measured per stage, printed too
    assert {"ingest", "analyze", "int8 conversion", "matching", "cutting", "compile", "verify"} <= set(stages)
    assert all(r["peak_rss_bytes"] >= r["baseline_rss_bytes"] > 0 for r in stages.values())
    assert stages["int8 conversion"]["peak_over_baseline_bytes"] > 0  # onnx2tf runs in a child process: counted
    assert "peak memory per stage" in proc.stdout
    # what the converter's children printed is kept beside the artifacts, one block per child (edgeplan/childlog.py)
    kept = (root / "logs" / "convert.log").read_text()
    assert kept.count("=== ") == 2 and "onnx2tf" in kept and kept.count(" exit 0: ") == 2, kept[:2000]
    # verify alone re-runs the checks; a tampered int8 model fails with exit status 1
    assert _edgeplan("verify", str(root), cwd=tmp_path).returncode == 0
    data = bytearray((root / "segments" / "p2" / "suffix_int8.tflite").read_bytes())
    (root / "segments" / "p2" / "suffix_int8.tflite").write_bytes(bytes(data[: len(data) // 2]))
    proc = _edgeplan("verify", str(root), cwd=tmp_path)
    assert proc.returncode == 1 and "verify FAILED" in proc.stdout


def test_analyze_lists_onnx_candidates(tmp_path):
    out = tmp_path / "a.json"
    assert main(["analyze", "zoo:tiny_cnn", "--out", str(tmp_path), "--json", str(out)]) == 0
    a = json.loads(out.read_text())
    assert a["complete"] is False and a["onnx_candidates"] == 11
    assert a["points"][0]["tensor"] == "input" and a["points"][-1]["tensor"] == "logits"
    assert all(p["tflite_tensor"] is None for p in a["points"])


def test_analyze_branches_prints_the_parallax_layers(tmp_path, capsys):
    """SqueezeNet's 8 fire modules: an expand 1x1 and an expand 3x3 side by side; tiny_cnn's residual skip
    holds no operator, so nothing runs beside its convolutions."""
    assert main(["analyze", "zoo:light_squeezenet", "--out", str(tmp_path), "--branches"]) == 0
    assert "64 nodes, 41 branches, 33 layers, 8 of them parallel (largest: 2 branches)" in capsys.readouterr().out
    assert main(["analyze", "zoo:tiny_cnn", "--out", str(tmp_path), "--branches"]) == 0
    assert "0 of them parallel (largest: 1 branches)" in capsys.readouterr().out


def test_analyze_paths_prints_the_adaps_sub_blocks(tmp_path, capsys):
    assert main(["analyze", "zoo:tiny_cnn", "--out", str(tmp_path), "--paths"]) == 0
    out = capsys.readouterr().out
    assert "ADaPS sub-blocks of zoo:tiny_cnn along H" in out and "relu2.out, conv4.out" in out
    assert ("7 layers in 3 sub-blocks (1 merge); the region ends: GlobalAveragePool 'gap' is Type 3; gathered: "
            "relu5.out") in out
    assert main(["analyze", "zoo:tiny_cnn", "--out", str(tmp_path), "--paths", "W"]) == 0
    assert "along W" in capsys.readouterr().out


def test_an_unexpected_exception_is_one_line_and_its_traceback_a_log_file(tmp_path, capsys, monkeypatch):
    """A fault inside edgeplan or a library is not the input's: one line, exit 70, the traceback in
    ARTIFACT_DIR/logs/ (or .edgeplan/logs/ where no artifact directory is named)."""
    from edgeplan import cli

    class Broken:
        def verify(self, *a):
            raise ValueError("boom\nsecond line")

    monkeypatch.setattr(cli, "_stages", lambda: Broken())
    monkeypatch.chdir(tmp_path)
    art = tmp_path / "out" / "m" / "1"
    art.mkdir(parents=True)
    (art / "model.json").write_text("{}")
    for argv, logs in ((["verify", str(art)], art / "logs"), (["verify", str(tmp_path / "none")], None)):
        assert main(argv) == 70
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: internal error ValueError: boom (the traceback is in ")
        path = Path(lines[0].split("the traceback is in ")[1].split(";")[0])
        assert path.parent == (logs or tmp_path / ".edgeplan" / "logs").resolve()
        text = path.read_text()
        assert "Traceback (most recent call last)" in text and "ValueError: boom" in text and "second line" in text


def test_a_full_disk_is_one_line_saying_so_not_an_internal_error(tmp_path, monkeypatch, capsys):
    import errno

    from edgeplan import cli

    class Full:
        def verify(self, *a):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "verify.json"))

    monkeypatch.setattr(cli, "_stages", lambda: Full())
    monkeypatch.chdir(tmp_path)
    assert main(["verify", str(tmp_path / "art")]) == 74
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: no space left on the device writing {tmp_path / 'out' / 'verify.json'}: free some (or "
                     "write elsewhere: --out) and run it again; what a stage had finished is kept"]
    assert not (tmp_path / ".edgeplan" / "logs").exists()  # not a crash: nothing to report


def test_tensorflow_load_time_lines_stay_off_the_terminal_unless_verbose(tmp_path):
    """TensorFlow writes four absl/CUDA lines to descriptor 2 as it loads, whatever TF_CPP_MIN_LOG_LEVEL says."""
    code = "import sys, edgeplan, tensorflow; print('loaded', file=sys.stderr)"
    env = {k: v for k, v in os.environ.items() if k != "EDGEPLAN_NATIVE_LOGS"}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "loaded\n", quiet.stderr
    loud = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**env, "EDGEPLAN_NATIVE_LOGS": "1"})
    assert "absl::InitializeLog" in loud.stderr and loud.stderr.endswith("loaded\n")


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "missing.onnx"), "--name", "x", "--version", "1", "--out", str(tmp_path)]) == 2
    assert "missing.onnx: no such file" in capsys.readouterr().err
    (tmp_path / "junk.onnx").write_text("not a model at all\n" * 10)
    assert main(["ingest", str(tmp_path / "junk.onnx"), "--name", "x", "--version", "1", "--out", str(tmp_path)]) == 2
    assert "junk.onnx" in capsys.readouterr().err
    assert main(["compile", "zoo:nope", "--name", "x", "--version", "1", "--out", str(tmp_path)]) == 2
    assert "no such zoo model" in capsys.readouterr().err


def test_a_model_tf2onnx_cannot_convert_fails_in_one_line_naming_the_op_and_the_log(tmp_path):
    """tf2onnx's own lines about an op it cannot convert go to the artifact's logs/, not the terminal; the one error
    line names the op, its node and that file. The failed attempt is not a version: ``latest`` does not pick it."""
    import tensorflow as tf

    from edgeplan.errors import PlanError
    from edgeplan.pipeline.planning import resolve_version

    class Bessel(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.random.stateless_normal((3, 3, 3, 4), seed=(1, 2)))

        @tf.function(input_signature=[tf.TensorSpec((1, 8, 8, 3), tf.float32)])
        def __call__(self, x):
            return tf.math.special.bessel_i0e(tf.nn.conv2d(x, self.w, 1, "SAME"))

    tf.saved_model.save(Bessel(), str(tmp_path / "bessel"))
    proc = _edgeplan("compile", "bessel", "--name", "bessel", "--version", "1", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error" in ln.lower()]
    log = tmp_path / "out" / "bessel" / "1" / "logs" / "ingest-failed.log"
    assert len(said) == 1 and "'BesselI0e' x1 ('StatefulPartitionedCall" in said[0], proc.stdout + proc.stderr
    assert said[0].endswith(f"(converter output: {Path('out') / 'bessel' / '1' / 'logs' / 'ingest-failed.log'})")
    assert "Traceback" not in proc.stdout + proc.stderr and "is not supported" not in proc.stdout + proc.stderr
    assert "BesselI0e: BesselI0e] is not supported" in log.read_text()  # tf2onnx's line, kept
    assert not (log.parents[1] / "model.json").exists()
    try:
        resolve_version(tmp_path / "out", "bessel", "latest")
        raise AssertionError("a failed ingest was taken for a version")
    except PlanError as e:
        assert "no artifacts" in str(e)


def test_a_keras_3_model_with_modern_blocks_compiles_and_verifies(tmp_path, modern_keras):
    """Grouped convolution (a function call in Keras 3's graph), LayerNormalization, exact GELU, hard-swish, SiLU
    and squeeze-excite: ingest inlines the call and converts Erfc; the int8 conversion writes Erf as tanh, 1/sqrt
    as a power (RSQRT in TFLite) and -x as a product, which LiteRT runs (an int8 DIV by a standard deviation near
    zero did not). Before: ingest failed with a UnicodeDecodeError, then the int8 model did not run."""
    proc = _edgeplan("compile", str(modern_keras[0]), "--name", "modern", "--version", "1", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verify passed" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert "absl" not in proc.stderr and "cuda" not in proc.stderr.lower(), proc.stderr  # (edgeplan/quiet.py)
    art = tmp_path / "out" / "modern" / "1"
    report = json.loads((art / "verify.json").read_text())
    assert report["ok"] and all(p["int8_identical_fraction"] == 1.0 for p in report["points"])
    # every block is int8 and on the Edge TPU's list (EMULATED compiler): LayerNormalization's -mean is a MUL
    # (the quantizer had no int8 NEG: a float island that ended the TPU part at the first block)
    last = json.loads((art / "analysis.json").read_text())["points"][-1]["index"]
    compiled = json.loads((art / "segments" / f"p{last}" / "compile.json").read_text())
    assert compiled["cpu_ops"] == 0 and compiled["tpu_ops"] == compiled["total_ops"], compiled["operators"]
