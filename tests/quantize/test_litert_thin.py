"""edgeplan.quantize.litert is what a device uses to run segments: it must not pull in anything heavy."""
from __future__ import annotations

import subprocess
import sys

BLOCKER = r'''
import importlib.abc, sys
HEAVY = ("tensorflow", "onnx", "onnxruntime", "prefect", "ortools", "xgboost", "dvc", "keras", "tf2onnx", "onnx2tf")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"heavy import blocked: {name}")
sys.meta_path.insert(0, Block())
import numpy as np
from edgeplan.quantize import litert
x = np.ones((1, 2, 3, 4), np.float32)
assert litert.nhwc_to_nchw(litert.nchw_to_nhwc(x)).shape == x.shape
q = litert.quantize(np.array([0.5, -1.0]), {"dtype": np.int8, "quantization": (0.01, 3)})
assert q.tolist() == [53, -97]
print("thin")
'''


def test_litert_helpers_import_without_heavy_packages():
    proc = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert proc.returncode == 0 and "thin" in proc.stdout, proc.stderr
