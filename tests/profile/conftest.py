"""Profiles built in code for the schema and drift tests."""
from __future__ import annotations

import pytest

from edgeplan.profile.schema import CpuTiming, Host, Profile, SegmentProfile, TpuTiming

HOST = Host("x86_64", "test cpu", 2, "3.11.0", "2.3.0", "h")


def make_profile(cpu_scale: float = 1.0, **over) -> Profile:
    """Points 0..2: suffixes at 0 and 1, prefixes at 1 and 2 (P = 2)."""
    def cpu(ms):
        return tuple(CpuTiming.from_samples(n, [ms * cpu_scale / n] * 5) for n in (1, 2))

    def tpu(ms):
        return TpuTiming("emulated", ms - 0.1, 0.1, 0.5, ms, 100, 0, 10**6, 5, 5, (ms,))

    segs = (
        SegmentProfile(0, "suffix", "segments/p0/suffix_int8.tflite", "a", 10, 4, cpu=cpu(8.0)),
        SegmentProfile(1, "prefix", "segments/p1/prefix_int8.tflite", "b", 10, 6, tpu=tpu(1.5)),
        SegmentProfile(1, "suffix", "segments/p1/suffix_int8.tflite", "c", 6, 4, cpu=cpu(3.0)),
        SegmentProfile(2, "prefix", "segments/p2/prefix_int8.tflite", "d", 10, 4, tpu=tpu(2.5)),
    )
    fields = dict(device_class="coral-usb-emulated", model="m/1", model_sha256="f" * 64, profiler_version="t",
                  host=HOST, created="2026-11-22T00:00:00+00:00", last_point=2, threads=(1, 2), kernels="xnnpack",
                  segments=segs)
    fields.update(over)
    return Profile(**fields)


@pytest.fixture
def profile_factory():
    return make_profile
