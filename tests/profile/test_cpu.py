"""The CPU profiler on real segments: samples per thread count; a corrupt segment, one that runs past its
timeout and one whose worker process crashes are recorded, and the next segment is still profiled."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from edgeplan.profile.cpu import Profiler, Settings


@pytest.fixture(scope="module")
def tiny(compiled):
    root, _, _ = compiled("tiny_cnn")
    return root


def test_samples_per_thread_count(tiny):
    with Profiler(Settings(repeats=7, warmup=1)) as p:
        m = p.measure(str(tiny / "segments/p0/suffix_int8.tflite"), [1, 2])
    assert m.status == "ok", m.error
    assert sorted(m.samples_ms) == [1, 2]
    assert all(len(v) == 7 and all(x > 0 for x in v) for v in m.samples_ms.values())
    assert m.input_bytes == 3 * 32 * 32 and m.output_bytes > 0


def test_budget_caps_repeats(tiny):
    with Profiler(Settings(repeats=100000, min_repeats=3, budget_s=0.2)) as p:
        t0 = time.monotonic()
        m = p.measure(str(tiny / "segments/p0/suffix_int8.tflite"), [1])
    assert m.status == "ok" and 3 <= len(m.samples_ms[1]) < 100000
    assert time.monotonic() - t0 < 30


def test_corrupt_segment_then_a_good_one(tiny, tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"TFL3" + os.urandom(256))
    with Profiler(Settings(repeats=3)) as p:
        m = p.measure(str(bad), [1])
        assert m.status == "failed" and str(bad) in m.error
        assert p.measure(str(tiny / "segments/p0/suffix_int8.tflite"), [1]).status == "ok"


def test_timeout_kills_and_the_next_segment_runs(tiny):
    with Profiler(Settings(repeats=10**9, min_repeats=10**9, budget_s=1e9, timeout_s=3)) as p:
        t0 = time.monotonic()
        m = p.measure(str(tiny / "segments/p0/suffix_int8.tflite"), [1])
        assert m.status == "timeout" and "still running after 3 s" in m.error
        assert time.monotonic() - t0 < 20
        p.settings = Settings(repeats=3)
        assert p.measure(str(tiny / "segments/p1/suffix_int8.tflite"), [1]).status == "ok"


def test_crashed_interpreter_is_recorded(tiny):
    """The worker process dies by SIGSEGV mid-run (as an interpreter bug would kill it)."""
    with Profiler(Settings(repeats=10**9, min_repeats=10**9, budget_s=1e9, timeout_s=60)) as p:
        p._worker()
        pid = p._proc.pid
        threading.Timer(1.5, os.kill, (pid, signal.SIGSEGV)).start()
        m = p.measure(str(tiny / "segments/p0/suffix_int8.tflite"), [1])
        assert m.status == "failed" and "crashed (signal SIGSEGV)" in m.error
        p.settings = Settings(repeats=3)
        assert p.measure(str(tiny / "segments/p0/suffix_int8.tflite"), [1]).status == "ok"


def test_interleaved_rounds_with_the_probe(tiny, tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"junk")
    paths = [str(tiny / "segments/p0/suffix_int8.tflite"), str(bad), str(tiny / "segments/p1/prefix_int8.tflite")]
    seen = []
    with Profiler(Settings(repeats=50, min_repeats=5, span_s=0.3, budget_s=5)) as p:
        found, probe = p.measure_many(paths, [1, 2], lambda stage, done, total: seen.append(stage))
    assert [m.status for m in found] == ["ok", "failed", "ok"]
    for m in (found[0], found[2], probe):
        assert sorted(m.samples_ms) == [1, 2] and all(len(v) >= 5 for v in m.samples_ms.values())
    # the segments and the probe were timed in the same rounds: as many samples each
    assert len(found[0].samples_ms[1]) == len(found[2].samples_ms[1]) == len(probe.samples_ms[1])
    assert "cpu: screen" in seen and "cpu: rounds" in seen


def test_lines_already_read_are_not_waited_for():
    """Several reply lines arriving at once: each is returned at once, not after the deadline."""
    import subprocess
    import sys

    with Profiler(Settings()) as p:
        proc = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdout.write('{\"a\": 1}\\n{\"b\": 2}\\n'); "
                                 "sys.stdout.flush(); time.sleep(30)"], stdout=subprocess.PIPE, bufsize=0)
        p._pending = b""
        try:
            t0 = time.monotonic()
            assert p._read_line(proc, t0 + 20) == '{"a": 1}\n'
            assert p._read_line(proc, t0 + 20) == '{"b": 2}\n'
            assert time.monotonic() - t0 < 10
            assert p._read_line(proc, time.monotonic() + 0.2) is None  # nothing more: the deadline passes
        finally:
            proc.kill()
            proc.wait()
