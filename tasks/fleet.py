"""Fleet reprofiling as tasks: a profiling job (spec and results in the store, DESIGN.md keys) and drift."""
from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE


def write_job(store_uri: str, device_class: str, models: list[dict], params: dict) -> dict:
    """``jobs/<id>/job.json``: what to profile (model artifacts by name and version) on a device class."""
    from edgeplan.store import open_store

    job = {"id": f"{time.strftime('%Y%m%dT%H%M%S')}-{device_class}-{uuid.uuid4().hex[:6]}",
           "device_class": device_class, "models": models, "settings": params["profile"],
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    open_store(store_uri).put(f"jobs/{job['id']}/job.json", json.dumps(job, indent=2).encode(), if_absent=True)
    return job


@task(name="profile-job", cache_policy=NO_CACHE, timeout_seconds=7200, retries=1, retry_delay_seconds=10)
def profile_job(job: dict, store_uri: str, root: str, params: dict) -> dict:
    """Run a profiling job with the library profiler (what the device runtime's `profile` command will do on
    a device), upload each new profile to ``jobs/<id>/result/<device-id>.json``, and report drift against
    the profile in use: {model: [changes]}. A model without drift keeps its old profile file (plans and
    bundles stay as they are); a drifted one gets the new file."""
    from edgeplan.profile import cpu, fleet, run
    from edgeplan.profile.diff import diff
    from edgeplan.profile.schema import Profile
    from edgeplan.store import open_store

    dc = fleet.load(params, {d["name"] for d in params["deployments"]}).device_class(job["device_class"])
    device_id = f"profiler@{socket.gethostname()}"
    store = open_store(store_uri)
    drift, results = {}, {}
    for m in job["models"]:
        d = Path(root) / m["name"] / m["version"]
        current = d / "profiles" / f"{dc.name}.json"
        before = current.read_bytes() if current.is_file() else None
        new = run.profile(d, dc, cpu.Settings.from_params(job["settings"]))
        results[m["name"]] = new.to_json()
        changes = [asdict(c) for c in diff(Profile.from_json(json.loads(before)), new,
                                           params["profile"]["drift_threshold"])] \
            if before is not None else ["no profile before"]
        if changes:
            drift[f"{m['name']}:{m['version']}"] = changes
        elif before is not None:
            current.write_bytes(before)  # within the threshold: the profile in use stays
    store.put(f"jobs/{job['id']}/result/{device_id}.json", json.dumps(
        {"job": job["id"], "device_id": device_id, "profiles": results, "drift": drift}, default=str).encode())
    return drift
