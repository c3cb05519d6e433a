"""A fast subset of bench/reliability.py's model-fuzzing campaign: broken models (one of each kind that once
ended in a traceback, an abort or a misleading line) through a real ``edgeplan compile``, into an artifact root
that holds another model's results; judged by exit status, stderr and a hash of every other file."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

# kinds -> what the one error line must say (before the fixes: traceback, traceback, abort, misleading, ...)
EXPECTED = {
    "cycle": "has a cycle through",
    "duplicate-output": "has a cycle through",
    "nan-weights": "NaN or infinite values",
    "inf-weights": "NaN or infinite values",
    "huge-weight": "abort",
    "future-opset": "this onnx reads opsets up to",
    "unknown-op": "ONNX does not define",
    "custom-domain": "edgeplan converts standard ONNX ops only",
    "huge-dim": "edgeplan takes at most",
    "keras-truncate": "not a readable .keras file",
    "garbage": "not a readable ONNX model",
    "oversize": "over the limit of 4,194,304 (params.yaml ingest.max_model_bytes)",  # before: no limit, compiled
}


def _whole(rows) -> str:
    """The violations as one string: pytest shows a string message whole, and cuts a list's repr short."""
    return json.dumps(rows, default=str)


def _fuzz_root(compiled, tmp_path):
    """(the bench module, an artifact root holding tiny_cnn's results, the commands' environment, a valid .keras)."""
    sys.path.insert(0, str(BENCH))
    import _model_fuzz

    d, _, _ = compiled("tiny_cnn")
    arts = tmp_path / "artifacts"
    shutil.copytree(d, arts / "tiny_cnn" / "1")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return _model_fuzz, arts, env, _model_fuzz.small_keras(tmp_path / "small.keras", env)


def test_broken_models_end_in_one_line_and_harm_nothing_else(compiled, tmp_path):
    _model_fuzz, arts, env, keras_path = _fuzz_root(compiled, tmp_path)
    kinds = tuple(EXPECTED)  # seed 2 draws 3e38 into conv4.w for huge-weight: the TFLite quantizer crashes on it
    r = _model_fuzz.run_model_fuzz(arts / "tiny_cnn" / "1" / "model.onnx", keras_path, arts, env, len(kinds),
                                   seed=2, work=tmp_path / "work", limit_s=240, kinds=kinds)
    assert r["tried"] == len(kinds) and r["violations"] == 0, _whole(r["violated"])
    assert r["tracebacks"] == 0 and r["collateral_damage"] == 0
    for row in r["rows"]:
        assert row["exit"] == 2, row
        assert EXPECTED[row["kind"]] in row["message"], row


def test_a_broken_model_given_to_edgeplan_run_fails_its_flow_in_one_line(compiled, tmp_path):
    """Regression (campaign 4 through ``edgeplan run``): the flow failed with the same one error line at its end,
    but before it Prefect's run loggers printed the ingest task's traceback, a "NotReady" line for every task
    downstream, and the events worker's flush warning; and (CI of stop 45) the ephemeral server's own process, which
    shares the command's stderr, logged a cancelled event flush with two tracebacks as the command ended. The whole
    flow runs here, on the ephemeral Prefect server the tests choose (conftest)."""
    _model_fuzz, arts, env, keras_path = _fuzz_root(compiled, tmp_path)
    kinds = ("truncate", "cycle", "oversize")
    (tmp_path / "work").mkdir()
    r = _model_fuzz.run_model_fuzz(arts / "tiny_cnn" / "1" / "model.onnx", keras_path, arts, env, len(kinds), seed=2,
                                   work=tmp_path / "work", limit_s=240, kinds=kinds, command="run")
    assert r["tried"] == 3 and r["violations"] == 0, _whole(r["violated"])
    for row, said in zip(r["rows"], ("not a readable ONNX model", "has a cycle through", EXPECTED["oversize"])):
        assert row["exit"] == 2 and said in row["message"] and row["stderr_lines"] == 1, row
