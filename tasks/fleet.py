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

from tasks.slots import slot


def read_job(store_uri: str, job_id: str) -> dict:
    from edgeplan.store import open_store

    return json.loads(open_store(store_uri).get(f"jobs/{job_id}/job.json"))


def write_job(store_uri: str, device_class: str, models: list[dict], params: dict) -> dict:
    """``jobs/<id>/job.json``: what to profile (model artifacts by name and version) on a device class, the
    profiler settings, and the class's reference probe (devices scale their times to it, as the pipeline does)."""
    from edgeplan.store import open_store

    from edgeplan.profile import fleet

    dc = fleet.load(params, {d["name"] for d in params["deployments"]}).device_class(device_class)
    job = {"id": f"{time.strftime('%Y%m%dT%H%M%S')}-{device_class}-{uuid.uuid4().hex[:6]}",
           "device_class": device_class, "models": models, "settings": params["profile"],
           "reference_probe_ms": {str(k): v for k, v in (dc.cpu_probe_ms or {}).items()},
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    open_store(store_uri).put(f"jobs/{job['id']}/job.json", json.dumps(job, indent=2).encode(), if_absent=True)
    return job


@task(name="profile-job", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=10)
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
        with slot("profile", 1):  # one profile at a time per machine
            new = run.profile(d, dc, cpu.Settings.from_params(job["settings"]),
                              capacity_rounds=int(params["flashmem"]["capacity_rounds"]))
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


def class_deployment(device_class: str) -> str | None:
    """``profile-job/<device class>`` when the Prefect server has that deployment (`edgeplan deploy` makes
    one per class, on the class's work pool), else None (the job runs here, e.g. on the ephemeral server)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    name = f"profile-job/{device_class}"
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
        return name
    except ObjectNotFound:
        return None


def run_on_pools(jobs: list[dict], store_uri: str, root: str, params_file: str | None, timeout_s: float = 7200,
                 poll_s: float = 2.0) -> list[tuple[str, str]]:
    """Start each job as a run of its class's ``profile-job`` deployment (its work pool's workers pick it
    up), all at once, and wait for them: [(flow run name, final state name)] in job order; raises when one
    did not complete."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from edgeplan.errors import EdgeplanError

    runs = [run_deployment(class_deployment(j["device_class"]), timeout=0,
                           parameters={"job_id": j["id"], "store": store_uri, "root": root, "params_file": params_file})
            for j in jobs]
    deadline = time.time() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = [client.read_flow_run(r.id) for r in runs]
            if all(r.state is not None and r.state.is_final() for r in runs) or time.time() > deadline:
                break
            time.sleep(poll_s)
    for j, r in zip(jobs, runs):
        if r.state is None or not r.state.is_completed():
            raise EdgeplanError(f"profiling job {j['id']} (flow run {r.name} of profile-job/{j['device_class']}) "
                                f"ended {r.state.name if r.state else 'without a state'}; see its logs in Prefect")
    return [(r.name, r.state.name) for r in runs]


def collect(store_uri: str, job: dict, root: str) -> dict:
    """A job's drift from its results in the store; each drifted model's new profile written where the plan
    reads it (the job may have run on another machine)."""
    from edgeplan.artifacts import write_json_atomic
    from edgeplan.store import open_store

    store = open_store(store_uri)
    drift: dict = {}
    for key in store.list(f"jobs/{job['id']}/result/"):
        result = json.loads(store.get(key))
        for model, changes in result["drift"].items():
            drift.setdefault(model, []).extend(changes)
            name, version = model.split(":", 1)
            write_json_atomic(Path(root) / name / version / "profiles" / f"{job['device_class']}.json",
                              result["profiles"][name])
    return drift
