"""What a device uses to verify bundles and read stores imports only cryptography, the standard library and
(for s3:// stores) boto3."""
from __future__ import annotations

import subprocess
import sys

VERIFY = r'''
import importlib.abc, sys, tempfile
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "onnx", "onnxruntime", "prefect", "ortools", "xgboost", "dvc",
                                  "keras", "yaml", "rich", "boto3", "botocore"):
            raise ImportError(f"heavy import blocked: {name}")
sys.meta_path.insert(0, Block())
from edgeplan.bundle import keys
from edgeplan.bundle.manifest import Latest
from edgeplan.store import open_store
d = tempfile.mkdtemp()
kid, key_path, _ = keys.generate(d)
k = keys.load_signing_key(key_path)
s = open_store(d + "/store")
s.put("deployments/x/latest", Latest("x", 1, "0" * 64).signed(k).encoded())
assert Latest.parse(s.get("deployments/x/latest"), keys.load_trusted([d]), "latest").revision == 1
print("thin")
'''


def test_bundle_verification_and_local_store_import_no_heavy_package():
    proc = subprocess.run([sys.executable, "-c", VERIFY], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "thin" in proc.stdout, proc.stderr
