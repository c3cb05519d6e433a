"""`edgeplan-runtime profile JOB_URI`: a fleet profiling job run on the device (no Prefect), its result in
the store in the format reprofile-fleet collects."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgeplan.profile.schema import Profile
from edgeplan.runtime import active, pull
from edgeplan.store import open_store


def test_device_runs_a_profiling_job(published, tmp_path):
    from tasks import fleet as fleet_tasks

    dest = tmp_path / "dev"
    pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    params = json.loads(json.dumps(published.params))
    params["profile"].update({"repeats": 10, "span_s": 0.3, "budget_s": 1.0})
    job = fleet_tasks.write_job(published.store_uri, "coral-usb-emulated", [{"name": "tiny_cnn", "version": "1"}],
                                params)
    uri = f"{published.store_uri}/jobs/{job['id']}/job.json"
    env = {**os.environ, "EDGEPLAN_TRUSTED_KEYS": str(published.trusted_dir)}
    proc = subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", "profile", uri, "--dir", str(dest),
                           "--device-id", "edge-7"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((Path(published.store_uri) / "jobs" / job["id"] / "result" / "edge-7.json").read_text())
    new = Profile.from_json(result["profiles"]["tiny_cnn"])
    rev_dir, manifest = active(dest)
    old = Profile.from_json(json.loads((rev_dir / manifest.models[0].profile).read_text()))
    suffixes = [s for s in new.segments if s.role == "suffix"]
    assert suffixes and all(s.status == "ok" and s.cpu_ms(1) > 0 for s in suffixes)
    assert new.created >= old.created and new.settings["repeats"] == 10  # measured now, with the job's settings
    assert [s.tpu for s in new.segments if s.role == "prefix"] == [s.tpu for s in old.segments if s.role == "prefix"]
    # reprofile-fleet reads it like a result of its own profile-job
    root = tmp_path / "artifacts"
    drift = fleet_tasks.collect(published.store_uri, job, str(root))
    assert drift == result["drift"]
    for model in drift:  # a drifted profile is written where the planner reads it
        assert (root / "tiny_cnn" / "1" / "profiles" / "coral-usb-emulated.json").is_file(), model
    # a job for models this device does not run is refused
    other = fleet_tasks.write_job(published.store_uri, "coral-usb-emulated", [{"name": "nope", "version": "9"}], params)
    bad = subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", "profile",
                          f"{published.store_uri}/jobs/{other['id']}/job.json", "--dir", str(dest)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "has none of them" in bad.stderr
