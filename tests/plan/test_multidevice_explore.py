"""AutoDiCE's exploration: the cost model agrees with the split it predicts for, and NSGA-II returns valid,
mutually non-dominated mappings."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgeplan.pipeline import multidevice as pipeline
from edgeplan.plan.multidevice import costs, explore, spec
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery import multidevice

PLATFORM = "".join(f"d{i}, cpu, slots=0-1, host=h{i}, net=1e6, power=2/6, quota={q}\n"
                   for i, q in enumerate((1.0, 0.5, 1.0, 1.0)))


@pytest.fixture(scope="module")
def setup(compiled, params):
    d, _, _ = compiled("light_inception_v1")
    us = pipeline.find_units(d, params)
    graph = TfliteGraph((d / "model_int8.tflite").read_bytes())
    c = costs.measure(graph, us, multidevice.unit_order(us), cores=2, repeats=3)
    return d, us, c, spec.parse_text(PLATFORM, "p")


def test_predicted_bytes_and_times_match_the_split(setup, tmp_path):
    d, us, c, plat = setup
    u = len(c.order)
    cuts, res = (u // 3, u // 3, 2 * u // 3), (0, 1, 0, 0)  # d1 gets nothing; d0, d2, d3 a third each
    period, mem, energy, seg = explore.evaluate(c, plat, cuts, res)
    doc = explore.mapping_of(c, us, plat, seg, res)
    assert list(doc) == ["d0_cpu0", "d2_cpu0", "d3_cpu0"]
    m = spec.parse_mapping(doc, plat, us)
    multidevice.split(d, us, m, plat, tmp_path / "md", xs=np.zeros((1, 3, 224, 224), np.float32))
    t = json.loads((tmp_path / "md" / "tables.json").read_text())
    sent, received = [0] * 3, [0] * 3
    for b in t["buffers"].values():
        sent[b["sender"]] += b["nbytes"] * len(b["receivers"])
        for r in b["receivers"]:
            received[r] += b["nbytes"]
    busy = [c.ms[[s == k for s in seg], 0].sum() / 1e3 for k in (0, 2, 3)]  # quota 1.0 on d0, d2, d3
    assert period == pytest.approx(max(max(busy), max(sent) / 1e6, max(received) / 1e6), rel=1e-9)
    # the tables' bytes are what the model predicts each rank sends (outputs back to the head included)
    segs = np.asarray(seg)
    predicted = [0] * 4
    for k, (p, rs, b) in enumerate(c.tensors):
        for dst in {int(segs[q]) for q in rs} - {int(segs[p])}:
            predicted[int(segs[p])] += b
    predicted[3] += c.output_bytes
    assert [predicted[k] for k in (0, 2, 3)] == sent
    assert mem == max(int(c.param_bytes[segs == k].sum() + c.act_bytes[segs == k].max()) for k in (0, 2, 3))
    assert energy > 0


def test_nsga_front_is_valid_and_non_dominated(setup):
    _, us, c, _ = setup
    # 1 Gbit/s links: at the fixture's 1 MB/s a 2.3 MB tensor takes 2 s, so no split beats one device and the front's
    # fastest point was one device on both its cores, faster than one core only by measurement noise (28.1 vs
    # 30.9 ms here; not faster once in CI). At 1e9 the best split is 1.7x faster than one device (18 vs 31 ms)
    plat = spec.parse_text(PLATFORM.replace("net=1e6", "net=1e9"), "p")
    front, stats = explore.explore(c, us, plat, population=40, generations=30)
    assert stats["evaluations"] > 40 and front
    objs = [(p.period_s, p.memory_bytes, p.energy_j) for p in front]
    for a in objs:
        assert not any(all(x <= y for x, y in zip(b, a)) and b != a for b in objs)
    for p in front:
        spec.parse_mapping(p.mapping, plat, us)  # every point is a valid mapping
    one = explore.single_device(c, us, plat)
    assert list(one.mapping) == ["d0_cpu0"] and one.period_s == pytest.approx(c.ms[:, 0].sum() / 1e3)
    assert any(p.period_s < one.period_s for p in front)  # splitting over devices pipelines frames
