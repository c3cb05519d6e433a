"""The pre-flight memory estimate (``pipeline/preflight``): a model whose stages would not fit is refused in one
line naming the stage and the figure, before the stage starts and without touching what was already made."""
from __future__ import annotations

import subprocess
import sys

import pytest

from edgeplan.errors import InsufficientMemoryError
from edgeplan.pipeline import preflight
from edgeplan.zoo import tiny


def test_sizes_parse_in_powers_of_1024():
    assert preflight.parse_size("16G") == 16 << 30
    assert preflight.parse_size("512m") == 512 << 20
    assert preflight.parse_size("1.5GB") == int(1.5 * (1 << 30))
    assert preflight.parse_size("2GiB") == 2 << 30
    assert preflight.parse_size("12345") == 12345
    for bad in ("", "G", "1x", "-1G", "1.2.3"):
        with pytest.raises(ValueError, match="not a size"):
            preflight.parse_size(bad)


def test_the_estimate_grows_with_the_model_and_the_conversion_with_its_largest_piece():
    small, large = preflight.estimate(100 << 20), preflight.estimate(1 << 30)
    assert all(large[s] > small[s] for s in small)
    whole, pieces = preflight.estimate(1 << 30), preflight.estimate(1 << 30, [(128 << 20, 0)] * 8)
    assert pieces["int8 conversion"] < whole["int8 conversion"] and pieces["matching"] == whole["matching"]
    busy = preflight.estimate(1 << 30, [(128 << 20, 0)] * 7 + [(128 << 20, 512 << 20)])  # the costliest child counts
    assert busy["int8 conversion"] > pieces["int8 conversion"] and busy["matching"] == pieces["matching"]
    assert busy == preflight.estimate(1 << 30, [(128 << 20, 512 << 20)])


def test_a_stage_above_the_limit_is_named_with_its_figure():
    est = preflight.estimate(553_000_000, [(128 << 20, 0)])
    stage = max(est, key=est.get)
    with pytest.raises(InsufficientMemoryError, match=rf"{stage} stage is estimated to need "
                                                      rf"{est[stage] / 1e9:.1f} GB .*553 MB.*: 2\.1 GB"):
        preflight.check(553_000_000, "vgg16.keras", 2 << 30, [(128 << 20, 0)])
    preflight.check(553_000_000, "vgg16.keras", int(est[stage]) + 1, [(128 << 20, 0)])  # fits: no error
    preflight.check(553_000_000, "vgg16.keras", 1, stages=())  # no stage asked about: nothing to refuse
    avail = preflight.available_bytes()
    assert avail is None or avail > 0


def test_compile_and_ingest_refuse_in_one_line_and_keep_what_was_made(tmp_path):
    src = tmp_path / "tiny.onnx"
    tiny.build(tmp_path / "tiny")
    out = tmp_path / "artifacts"
    cmd = [sys.executable, "-m", "edgeplan.cli", "ingest", str(src), "--name", "t", "--version", "1", "--out", str(out),
           "--max-memory", "200M"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "ingest stage is estimated to need" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()  # refused before it was read: nothing written
    r = subprocess.run([*cmd[:-2], "--max-memory", "1G"], capture_output=True, text=True, check=False)  # ingest fits in 1 GiB
    assert r.returncode == 0, r.stderr
    made = sorted(p.name for p in (out / "t" / "1").iterdir())
    r = subprocess.run([sys.executable, "-m", "edgeplan.cli", "build", str(out / "t" / "1"), "--max-memory", "1G"],
                       capture_output=True, text=True, check=False)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(lines) == 1 and "int8 conversion stage is estimated" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (out / "t" / "1").iterdir()) == made  # the ingested model stays, nothing added
