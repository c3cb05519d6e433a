"""The per-stage RSS sampler measures what a stage and the processes it starts hold (real allocations)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from edgeplan.pipeline.memory import Sampler, tree_rss


def test_a_stage_peak_counts_its_own_allocation_and_its_children():
    with Sampler(interval_s=0.005) as s:
        with s.stage("outer"):
            with s.stage("own"):
                a = np.ones(200 * 1024 * 1024 // 8)  # 200 MB touched in this process, then freed
                del a
            with s.stage("child"):  # 300 MB in a child process, held for a moment
                subprocess.run([sys.executable, "-c", "import numpy as np, time; a = np.ones(300 * 2**20 // 8); "
                                "time.sleep(0.5)"], check=True)
    rec = s.record()
    assert rec["own"]["peak_over_baseline_bytes"] >= 190e6
    assert rec["child"]["peak_over_baseline_bytes"] >= 290e6  # the child's RSS is in the tree's
    assert rec["outer"]["peak_over_baseline_bytes"] >= rec["child"]["peak_over_baseline_bytes"]  # nested: not reset
    # the split, each against its own baseline (the test process may hold other children, e.g. a fixture's
    # server): the 200 MB were this process's, the 300 MB the child's
    own, child = rec["own"], rec["child"]
    assert own["peak_self_rss_bytes"] - own["baseline_self_rss_bytes"] >= 190e6
    assert own["baseline_self_rss_bytes"] + own["baseline_children_rss_bytes"] == own["baseline_rss_bytes"]
    assert child["peak_children_rss_bytes"] - child["baseline_children_rss_bytes"] >= 290e6
    assert own["peak_children_rss_bytes"] - own["baseline_children_rss_bytes"] < 50e6
    assert tree_rss() > 0
