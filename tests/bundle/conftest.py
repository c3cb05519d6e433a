from __future__ import annotations

import shutil

import pytest

from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline.planning import plan_swapless
from edgeplan.profile import cpu, fleet, run

SETTINGS = cpu.Settings(repeats=10, span_s=0.3, budget_s=1)


@pytest.fixture(scope="session")
def deployment_root(compiled, tmp_path_factory):
    """Artifacts of tiny_cnn (compiled, verified, profiled) and deployment ``solo``'s plan; (root, params)."""
    root = tmp_path_factory.mktemp("bundle-artifacts")
    src, _, _ = compiled("tiny_cnn")
    shutil.copytree(src, root / "tiny_cnn" / "1")
    p = params_mod.load(None)
    run.profile(root / "tiny_cnn" / "1", fleet.load(p).device_class("coral-usb-emulated"), SETTINGS)
    p["deployments"] = [{"name": "solo", "device_class": "coral-usb-emulated",
                         "models": [{"name": "tiny_cnn", "version": "1", "rate": 40.0}]}]
    p["fleet"]["devices"] = [{"id": "edge-7", "device_class": "coral-usb-emulated", "deployment": "solo",
                              "work_pool": "coral-usb-emulated"}]
    plan_swapless(root, "solo", p)
    return root, p
