"""Delegate pruning (plan/parallax/prune.py): the regions the emulated compiler maps with multiple subgraphs, kept
only where Appendix B's inequality says the accelerator wins, and the structure with the kept ones contracted."""
from __future__ import annotations

import pytest

from edgeplan.compile import edgetpu_ops
from edgeplan.compile.emulated import place_ops
from edgeplan.graph.branches import from_tflite, structure
from edgeplan.plan.parallax.prune import mapped_regions, prune, region_map
from edgeplan.profile import tpu_model
from edgeplan.quantize.tflite_graph import TfliteGraph


@pytest.fixture(scope="module")
def graph(compiled):
    d, _, _ = compiled("light_inception_v1")  # its LRN ops do not map: several regions
    return TfliteGraph((d / "model_int8.tflite").read_bytes())


def test_regions_are_the_runs_of_mapped_ops(graph):
    regions = mapped_regions(graph)
    mapped = [p.index for p in place_ops(graph, allow_multiple_subgraphs=True) if p.status == edgetpu_ops.MAPPED]
    assert len(regions) > 1 and [i for r in regions for i in r] == mapped
    assert all(list(r) == list(range(r[0], r[-1] + 1)) for r in regions)
    structure(from_tflite(graph, {i: k for k, r in enumerate(regions) for i in r}))  # each convex: no error


def test_the_inequality_decides_and_small_regions_never_stay(graph):
    tpu = tpu_model.for_host("desktop")  # EMULATED: its fitted overhead and efficiency
    kw = dict(overhead_ms=tpu.overhead_ms, acc_macs_per_s=tpu.peak_macs_per_s * tpu.efficiency,
              link_bytes_per_s=tpu.link_bytes_per_s)
    regions, bounds = prune(graph, cpu_macs_per_s=2e10, **kw)
    for r in regions:
        assert r.macs >= sum(graph.op_macs[i] for i in r.ops) > 0 or not any(graph.op_macs[i] for i in r.ops)
        assert r.keep == (len(r.ops) >= 3 and r.offload_ms < r.cpu_ms)
        assert r.offload_ms == pytest.approx(tpu.overhead_ms + 1e3 * (r.macs / kw["acc_macs_per_s"]
                                                                      + r.boundary_bytes / tpu.link_bytes_per_s))
    assert any(len(r.ops) < 3 for r in regions) and not any(r.keep for r in regions if len(r.ops) < 3)
    assert bounds.l_r_acc == pytest.approx(tpu.overhead_ms / 1e3 * kw["acc_macs_per_s"])
    assert bounds.l_r_acc > bounds.l_r_cpu  # §3.1's bound and Appendix B's differ by R_acc / R_cpu
    slow_cpu, _ = prune(graph, cpu_macs_per_s=1e6, **kw)  # a CPU a thousand times slower: every big region stays
    assert all(r.keep == (len(r.ops) >= 3) for r in slow_cpu)
    fast_cpu, _ = prune(graph, cpu_macs_per_s=1e15, **kw)  # faster than the accelerator: nothing stays
    assert not any(r.keep for r in fast_cpu)
    kept = region_map(slow_cpu)
    s = structure(from_tflite(graph, kept))
    assert sum(1 for b in s.branches if b.kind == "region") == sum(1 for r in slow_cpu if r.keep)
    with pytest.raises(ValueError):
        prune(graph, cpu_macs_per_s=0, **kw)

