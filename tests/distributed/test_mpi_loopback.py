"""A split's ranks as real Open MPI processes (mpirun, python -m mpi4py) on this machine's loopback: the outputs
are the int8 model's, and every failure names its rank and leaves no process behind."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from edgeplan.distributed import launch
from edgeplan.pipeline import multidevice as pipeline
from edgeplan.plan.multidevice import spec
from edgeplan.quantize import litert
from edgeplan.runtime.cli import main as runtime_main
from edgeplan.runtime.stream import invoke_named
from edgeplan.surgery import multidevice

PLATFORM = "dev0, cpu, slots=0, host=localhost\ndev1, cpu, slots=0-1, host=localhost\ndev2, cpu, slots=1, host=localhost\n"



@pytest.fixture(scope="module")
def split(compiled, params, tmp_path_factory):
    """tiny_cnn with unit i on rank i mod 3: 9 stages, every rank waits between its stages."""
    d, _, _ = compiled("tiny_cnn")
    us = pipeline.find_units(d, params)
    p = spec.parse_text(PLATFORM, "platform")
    keys = ["dev0_cpu", "dev1_cpu", "dev2_cpu"]
    doc = {k: [] for k in keys}
    for u in us.units:
        doc[keys[u.index % 3]] += list(u.names)
    out = tmp_path_factory.mktemp("split") / "md"
    xs = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    multidevice.split(d, us, spec.parse_mapping(doc, p, us), p, out, xs=xs)
    return d, out


@pytest.mark.parametrize("window", [["--window", "2"], ["--send-window", "1"], ["--send-window", "0", "--ahead", "2"]])
def test_ranks_give_the_int8_models_outputs(split, tmp_path, ranks_left, window):
    """Every rank waits between its stages for data from the others (both ways): no frame window, nor a rank
    holding back until its sends of the frame before (``--send-window 1``) or of this frame (0) are done, stalls."""
    d, out = split
    t = json.loads((out / "tables.json").read_text())
    assert len(t["stages"]) == 9
    rng = np.random.default_rng(1)
    xs = rng.integers(-128, 127, (16, *t["input"]["shape"]), endpoint=True).astype(np.int8)
    np.save(tmp_path / "x.npy", xs)
    r = launch.run(out, frames=16, timeout_s=120, extra=["--inputs", str(tmp_path / "x.npy"), "--out",
                                                         str(tmp_path / "y.npy"), *window])
    assert r.summary["frames"] == 16 and len(r.summary["ranks"]) == 3
    assert sorted(s for k in r.summary["ranks"] for s in k["stages"]) == list(range(9))
    # memory as measured by each rank: its private memory grew by its interpreters (weights, arena), and the
    # first one paged LiteRT's code in (file-backed)
    for k in r.summary["ranks"]:
        assert k["peak_rss_bytes"] > k["base_rss_bytes"] > k["base_anon_bytes"] > 0
        assert k["peak_anon_bytes"] > k["base_anon_bytes"] and k["file_bytes"] > k["base_file_bytes"] > 0
    whole = litert.interpreter((d / "model_int8.tflite").read_bytes(), deterministic=False)
    want = np.stack([invoke_named(whole, {t["input"]["name"]: x})[t["output"]["name"]] for x in xs])
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    assert not ranks_left()


def test_the_benchs_float_ranks_give_the_float_models_outputs(split, tmp_path, ranks_left):
    """bench/float_rank.py: the same rank loop over the float sub-models (9 stages on 3 ranks, each waiting
    between its stages; the default window and receives posted a frame ahead) equals the whole float model."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    from float_rank import whole_model

    d, out = split
    xs = np.random.default_rng(2).normal(size=(6, 1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "xf.npy", xs)
    launch.run(out, frames=6, timeout_s=120, program=(str(bench / "float_rank.py"),),
               extra=["--inputs", str(tmp_path / "xf.npy"), "--out", str(tmp_path / "yf.npy")])
    want = whole_model(d / "model.onnx", xs)  # 1 thread, as each rank (2 threads round differently: 1.4e-6 here)
    assert np.array_equal(np.load(tmp_path / "yf.npy").reshape(want.shape), want)
    assert not ranks_left()


def test_steady_throughput_skips_the_pipeline_filling():
    from edgeplan.distributed.rank import steady_fps

    ended = [1.0, 2.0, 2.5, 3.0, 3.5]  # two frames filling, then one every 0.5 s
    assert steady_fps(ended, skip=2) == 2.0
    assert steady_fps(ended, skip=9) == 2.0  # at least one interval is kept
    assert steady_fps([1.0, 2.0], skip=3) == 1.0
    assert steady_fps([1.0], skip=0) is None


def test_a_rank_report_with_another_writers_text_after_it_is_read():
    """Regression (CI): mpirun's banner of dashes landed on the line of a rank's last report, which was then
    refused as garbled instead of naming the rank's error."""
    line = 'EDGEPLAN-RANK-ERROR {"rank": 1, "host": "vm", "error": "tables.json: axis 3"}' + "-" * 66
    assert launch._report(line, launch.ERROR) == {"rank": 1, "host": "vm", "error": "tables.json: axis 3"}
    for bad in ("EDGEPLAN-RANK-ERROR {\"rank\": 1", "EDGEPLAN-RANK-ERROR [1, 2]", "EDGEPLAN-RANK-ERROR"):
        with pytest.raises(launch.DistributedError, match="garbled"):
            launch._report(bad, launch.ERROR)


@pytest.mark.parametrize("fault,says", [
    ("1:3:raise", r"^rank 1 on \S+ \(stage \d+, frame 3\): fault injected"),
    ("2:5:kill", r"^rank 2 on localhost failed \(killed, exited or cut off\): rank [01] on \S+ \(.*frame 5\) lost it"),
    ("0:2:exit", r"^rank 0 on localhost failed .* rank [12] on \S+ \(.*frame 2\) lost it"),
    ("1:4:hang", r"^rank 1 on localhost stopped answering .*: rank [02] on \S+ \(.*frame 4\) waited 2 s for .*rank 1"),
])
def test_a_failing_rank_is_named_and_nothing_is_left(split, fault, says, ranks_left):
    _, out = split
    t0 = time.perf_counter()
    with pytest.raises(launch.DistributedError, match=says):
        launch.run(out, frames=20, timeout_s=60, deadline_s=2, extra=["--fault", fault])
    assert time.perf_counter() - t0 < 15
    assert not ranks_left()


def test_a_tampered_stage_is_refused_before_any_frame(split, tmp_path, ranks_left):
    import shutil

    _, out = split
    bad = tmp_path / "md"
    shutil.copytree(out, bad)
    t = json.loads((bad / "tables.json").read_text())
    victim = next(s for s in t["stages"] if s["rank"] == 2)
    (bad / victim["int8"]).write_bytes((bad / victim["int8"]).read_bytes()[:-1] + b"\0")
    with pytest.raises(launch.DistributedError, match=rf"rank 2 on \S+: {victim['int8']}: sha256 differs"):
        launch.run(bad, frames=4, timeout_s=60)
    assert not ranks_left()


def test_runtime_cli(split, tmp_path, capsys):
    _, out = split
    assert runtime_main(["mpi", "run", str(out), "--frames", "5", "--summary", str(tmp_path / "s.json")]) == 0
    assert "5 frames in" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["frames"] == 5
    assert runtime_main(["mpi", "run", str(tmp_path), "--frames", "5"]) == 1
    e = capsys.readouterr().err
    assert "tables.json: missing" in e and len(e.strip().splitlines()) == 1


def test_the_hard_deadline_kills_everything(split, ranks_left):
    _, out = split
    t0 = time.perf_counter()
    with pytest.raises(launch.DistributedError, match="did not finish within 4 s"):
        launch.run(out, frames=20, timeout_s=4, deadline_s=60, extra=["--fault", "1:2:hang"])
    assert time.perf_counter() - t0 < 10
    assert not ranks_left()


@pytest.mark.parametrize("edit,says", [
    (lambda t: t["stages"][1].update(int8="../../../etc/passwd"), r"stage 1: bad index, rank or file "
                                                                   r"'\.\./\.\./\.\./etc/passwd'"),
    (lambda t: next(iter(t["buffers"].values())).update(shape=[1 << 30, 1 << 30]), r"is 1152921504606846976 bytes"),
])
def test_a_malformed_tables_json_is_refused_before_any_frame(split, tmp_path, edit, says, ranks_left, edited_split):
    _, out = split
    bad = edited_split(out, edit)
    with pytest.raises(launch.DistributedError, match=rf"^rank \d on \S+: tables.json .*{says}"):
        launch.run(bad, frames=4, timeout_s=60, extra=["--out", str(tmp_path / "y.npy")])
    assert not (tmp_path / "y.npy").exists() and not ranks_left()
    assert sorted(p.name for p in bad.iterdir()) == sorted(p.name for p in out.iterdir())  # nothing added or lost


def test_a_launch_failing_in_mpiruns_start_up_is_made_again(split, tmp_path, monkeypatch, ranks_left):
    """mpirun 5 now and then fails to start its PMIx server (exit 213, no rank ran): the launch is made again.
    Injected by a wrapper that fails that way on its first call and then runs the real mpirun."""
    real = launch.mpirun()
    wrapper = tmp_path / "mpirun"
    wrapper.write_text(f"""#!/bin/sh
if [ ! -e {tmp_path}/failed-once ]; then
  touch {tmp_path}/failed-once
  echo "The PMIx server's listener thread failed to start. We cannot" >&2
  echo "continue." >&2
  exit 213
fi
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setattr(launch, "mpirun", lambda: str(wrapper))
    _, out = split
    r = launch.run(out, frames=2, timeout_s=120)
    assert r.summary["frames"] == 2 and r.startup_retries == 1
    # when the start-up keeps failing, one error says so and how many launches were made
    (tmp_path / "failed-once").unlink()
    monkeypatch.setattr(launch, "STARTUP_RETRIES", 0)
    with pytest.raises(launch.DistributedError, match=r"start-up.*after 1 launches"):
        launch.run(out, frames=2, timeout_s=120)


def test_the_rank_overhead_is_measured_over_real_ranks(compiled, params, tmp_path, ranks_left):
    """overhead.measure: the whole model on one rank and three 2-way cuts, each a real MPI job; every rank's bytes
    are what the cost model says it moves, and every rank spends CPU beyond its invokes."""
    from edgeplan.plan.multidevice import costs, overhead
    from edgeplan.quantize.tflite_graph import TfliteGraph

    d, _, _ = compiled("tiny_cnn")
    us = pipeline.find_units(d, params)
    c = costs.measure(TfliteGraph((d / "model_int8.tflite").read_bytes()), us, multidevice.unit_order(us), cores=1,
                      repeats=3)
    plat = spec.parse_text("dev0, cpu, slots=0, host=localhost\ndev1, cpu, slots=1, host=localhost\n", "p")
    xs = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    fitted, record = overhead.measure(d, us, c, plat, tmp_path,
                                      lambda out: launch.run(out, frames=8, timeout_s=120).summary, xs)
    jobs = record["jobs"]
    assert list(jobs) == ["whole"] + [f"cut{k}" for k in overhead.calibration_cuts(c)]
    assert [r["bytes"] for r in jobs["whole"]["ranks"]] == [0]
    for name, job in jobs.items():
        if name != "whole":
            moved = overhead.crossing_bytes(c, job["cut"]) + c.output_bytes
            assert [r["bytes"] for r in job["ranks"]] == [moved, moved]
    assert all(r["over_s"] > 0 and r["wall_s"] > 0 and r["invoke_s"] > 0 for job in jobs.values() for r in job["ranks"])
    # the units each rank ran, timed alone: all of them on the whole model's one rank, split between two at a cut
    assert jobs["whole"]["ranks"][0]["units_s"] == pytest.approx(c.ms[:, 0].sum() / 1e3)
    for name, job in jobs.items():
        if name != "whole":
            assert [r["units_s"] for r in job["ranks"]] == pytest.approx(
                [c.ms[: job["cut"], 0].sum() / 1e3, c.ms[job["cut"]:, 0].sum() / 1e3])
    assert record["fit"] == fitted.to_json()
    assert not ranks_left()
