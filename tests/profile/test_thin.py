"""What a device runs to profile itself and to emulate an Edge TPU: no heavy package may be imported."""
from __future__ import annotations

import subprocess
import sys

BLOCKER = r'''
import importlib.abc, sys
HEAVY = ("tensorflow", "onnx", "onnxruntime", "prefect", "ortools", "xgboost", "dvc", "keras", "tf2onnx", "onnx2tf",
         "yaml", "rich", "scipy")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"heavy import blocked: {name}")
sys.meta_path.insert(0, Block())
from edgeplan.profile import cpu, tpu_model
from edgeplan.profile.schema import CpuTiming, Profile
with cpu.Profiler(cpu.Settings(repeats=5, span_s=0.1)) as p:
    found, probe = p.measure_many([str(cpu.PROBE)], [1])
assert found[0].status == "ok", found[0].error
t = CpuTiming.from_samples(1, found[0].samples_ms[1])
assert t.median_ms > 0 and probe.samples_ms[1]
tpu = tpu_model.for_host("desktop")
assert tpu.times(tpu_model.TpuWorkload(10**9, 10**6, 0, 150528, 1000, 50)).tpu_ms > 0
assert cpu.host()["cores"] >= 1
print("thin")
'''


def test_profiler_and_emulator_import_without_heavy_packages():
    proc = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "thin" in proc.stdout, proc.stderr


PLANNER = r'''
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "onnx", "onnxruntime", "prefect", "ortools", "xgboost", "dvc",
                                  "keras", "yaml", "rich", "ai_edge_litert"):
            raise ImportError(f"heavy import blocked: {name}")
sys.meta_path.insert(0, Block())
from edgeplan.plan.swapless import allocate, baselines, from_profiles, queueing
from edgeplan.plan.swapless.instance import Instance, ModelSpec
m = ModelSpec("m", 20.0, (0.0, 0.002, 0.004), (0.0, 0.0005, 0.0005), (0.0, 0.002, 0.004), (0, 1, 2), (0.01, 0.005, 0.0))
a = allocate.refined(Instance((m,), 2, 8 << 20))
assert a.config is not None
print("thin")
'''


def test_swapless_planner_imports_only_numpy_and_the_standard_library():
    proc = subprocess.run([sys.executable, "-c", PLANNER], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "thin" in proc.stdout, proc.stderr
