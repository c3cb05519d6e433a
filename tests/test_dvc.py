"""`dvc repro` runs the stages of dvc.yaml for the models listed in params.yaml (real DVC, real git)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import yaml

REPO = Path(__file__).resolve().parents[1]



def _tree(root):
    """The version's files by content, but verify.json, DVC's .gitignore and the converters' output (``logs/``,
    edgeplan/childlog: not versioned)."""
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()
            and p.name not in ("verify.json", ".gitignore") and p.relative_to(root).parts[0] != "logs"}

def test_dvc_repro_builds_and_verifies_the_listed_models(tmp_path, s3_server):
    work = tmp_path / "ws"
    work.mkdir()
    shutil.copy(REPO / "dvc.yaml", work)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["models"] = [{"name": "tiny", "version": "1", "source": "zoo:tiny_cnn"}]
    params["profile"].update({"repeats": 10, "span_s": 0.5, "budget_s": 1.0})
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", COLUMNS="160")

    def run(*cmd):
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    run("git", "init", "-q")
    run(str(bindir / "dvc"), "init", "-q")
    run(str(bindir / "dvc"), "repro")
    root = work / "artifacts" / "tiny" / "1"
    assert json.loads((root / "verify.json").read_text())["ok"]
    assert (root / "segments" / "p1" / "compile.json").is_file()
    lock = yaml.safe_load((work / "dvc.lock").read_text())
    assert {"ingest@0", "build@0", "verify@0", "stream@0", "parallax@0", "profile@0"} <= set(lock["stages"])
    assert json.loads((root / "stream" / "stream.json").read_text())["identical"] == {"reference": True, "xnnpack": True}
    assert (root / "profiles" / "coral-usb-emulated.json").is_file()  # tiny-solo's class (no deployment serves it)
    # nothing changed: a second repro runs no stage
    out = run(str(bindir / "dvc"), "repro")
    assert "didn't change" in out or "up to date" in out
    # versioned artifacts go to a DVC remote on the S3-protocol server (dvc-s3, endpoint URL) and come back
    run(str(bindir / "dvc"), "remote", "add", "-d", "store", "s3://edgeplan/dvc-remote")
    run(str(bindir / "dvc"), "remote", "modify", "store", "endpointurl", s3_server)
    run(str(bindir / "dvc"), "push")
    want = _tree(root)
    shutil.rmtree(root)
    shutil.rmtree(work / ".dvc" / "cache")
    run(str(bindir / "dvc"), "pull")
    got = _tree(root)
    assert got == want and len(got) > 10
    # the flow on the same model version makes the same artifacts (byte for byte, but for the profiles and the
    # Parallax plans, both measured on this host),
    # records them against the same stages and pushes them to the S3 remote: repro then has nothing to do
    deterministic = {k: v for k, v in want.items() if k.parts[0] not in ("profiles", "parallax")}
    # (and publishes to a store on the S3 server, from which the device check pulls over S3)
    flow_env = {**env, "PREFECT_HOME": str(work / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "AWS_ENDPOINT_URL": s3_server}
    flow_env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "run", "zoo:tiny_cnn", "--name", "tiny", "--version",
                           "1", "--refresh", "--store", "s3://edgeplan/flow-store", "--summary-json", "s.json"],
                          cwd=work, env=flow_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((work / "s.json").read_text())
    assert {t["task"] for t in summary["tasks"] if not t["cached"]} >= {"build", "profile", "version"}
    s3 = boto3.client("s3", endpoint_url=s3_server)
    latest = json.loads(s3.get_object(Bucket="edgeplan", Key="flow-store/deployments/tiny-solo/latest")["Body"].read())
    assert latest["revision"] == 1
    check = summary["device_check"]  # pulled from S3 by the runtime, served, answered
    assert check and all(r["requests"] > 0 and r["failed"] == 0 and r["measured_ms"] > 0 for r in check), check
    got = _tree(root)
    assert {k: v for k, v in got.items() if k.parts[0] not in ("profiles", "parallax")} == deterministic
    assert set(got) == set(want)
    out = run(str(bindir / "dvc"), "status")
    assert "changed" not in out, out  # the flow's outputs are what dvc.lock records
    out = run(str(bindir / "dvc"), "status", "--cloud")
    assert "new" not in out and "missing" not in out, out  # and they are on the S3 remote
