"""What a rank costs beyond its invokes: the fit recovers known coefficients, and the exploration's period adds
them to a device's unit times as the overhead model says."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edgeplan.pipeline import multidevice as pipeline
from edgeplan.plan.multidevice import costs, explore, overhead, spec
from edgeplan.plan.multidevice.costs import RankOverhead
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery import multidevice

FAST = "".join(f"d{i}, cpu, slots=0, host=h{i}, net=1e15, quota={q}\n" for i, q in enumerate((0.5, 0.25)))


@pytest.fixture(scope="module")
def measured(compiled, params):
    d, _, _ = compiled("tiny_cnn")
    us = pipeline.find_units(d, params)
    graph = TfliteGraph((d / "model_int8.tflite").read_bytes())
    return us, costs.measure(graph, us, multidevice.unit_order(us), cores=1, repeats=3)


def test_the_fit_recovers_the_coefficients_it_was_made_with():
    rng = np.random.default_rng(0)
    true = RankOverhead(frame_s=4e-4, byte_s=6e-10, poll=0.02)
    rows = []
    for _ in range(12):
        nbytes, wall = float(rng.integers(0, 4_000_000)), float(rng.uniform(0.02, 0.6))
        over = true.frame_s + true.byte_s * nbytes + true.poll * wall
        units = float(rng.uniform(0.005, 0.1))
        rows.append({"over_s": over * (1 + rng.normal(0, 0.01)), "bytes": nbytes, "wall_s": wall,
                     "units_s": units, "invoke_s": 1.1 * units})
    got = overhead.fit(rows)
    assert got.invoke_scale == pytest.approx(1.1, rel=1e-9)
    assert got.frame_s == pytest.approx(true.frame_s, rel=0.15)
    assert got.byte_s == pytest.approx(true.byte_s, rel=0.05)
    assert got.poll == pytest.approx(true.poll, rel=0.05)
    with pytest.raises(ValueError, match="at least 3"):
        overhead.fit(rows[:2])


def test_the_period_adds_a_ranks_overhead_to_its_units(measured):
    _, c = measured
    plat = spec.parse_text(FAST, "p")
    ov = RankOverhead(frame_s=1e-3, byte_s=2e-9, poll=0.05, invoke_scale=1.2)
    with_ov = dataclasses.replace(c, rank_overhead=ov)
    u = len(c.order)
    # one device: its units (as slowed in a rank) + one frame's overhead, on what its quota leaves after polling
    # (no bytes move)
    period, *_ = explore.evaluate(with_ov, plat, [u], [0, 0])
    assert period == pytest.approx((1.2 * c.ms[:, 0].sum() / 1e3 + ov.frame_s) / (0.5 - ov.poll), rel=1e-9)
    # a 2-way cut: each side moves the crossing tensors and the output (back to the head)
    cut = overhead.calibration_cuts(c)[0]
    moved = overhead.crossing_bytes(c, cut) + c.output_bytes
    period, _, _, seg = explore.evaluate(with_ov, plat, [cut], [0, 0])
    assert seg == [0] * cut + [1] * (u - cut)
    sides = [(c.ms[:cut, 0].sum() / 1e3, 0.5), (c.ms[cut:, 0].sum() / 1e3, 0.25)]
    assert period == pytest.approx(max((1.2 * t + ov.frame_s + ov.byte_s * moved) / (q - ov.poll) for t, q in sides),
                                   rel=1e-9)
    # and without a measured overhead the period is the units' alone
    assert explore.evaluate(c, plat, [cut], [0, 0])[0] == pytest.approx(max(t / q for t, q in sides), rel=1e-9)


def test_calibration_cuts_span_the_bytes_a_rank_moves(measured):
    _, c = measured
    cuts = overhead.calibration_cuts(c)
    sizes = [overhead.crossing_bytes(c, k) for k in range(1, len(c.order))]
    assert len(set(cuts)) == len(cuts) and all(0 < k < len(c.order) for k in cuts)
    assert overhead.crossing_bytes(c, cuts[0]) == max(sizes)
    assert overhead.crossing_bytes(c, cuts[1]) == min(sizes)
