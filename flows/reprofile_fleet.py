"""reprofile-fleet: a profiling job per device class -> drift -> re-plan the deployments of drifted classes
-> republish only those whose plan changed. A job runs as the class's ``profile-job`` deployment on the
class's work pool when the server has one (`edgeplan deploy`), else here."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow

from flows.common import Ledger, absolute, load_params, plan_differs, read_plan, report, served_models
from tasks import deployment as dep_tasks
from tasks import fleet as fleet_tasks
from tasks import model as model_tasks


@flow(name="profile-job")
def profile_job(job_id: str, store: str, root: str = "artifacts", params_file: str | None = None) -> dict:
    """One fleet profiling job (``jobs/<id>/job.json`` in the store), as its device class's work pool runs
    it: the library profiler on this machine, the result uploaded to ``jobs/<id>/result/``; the drift."""
    store, root = absolute(store), absolute(root)
    return fleet_tasks.profile_job(fleet_tasks.read_job(store, job_id), store, root, load_params(params_file))


@flow(name="reprofile-fleet")
def reprofile_fleet(root: str = "artifacts", params_file: str | None = None, store: str | None = None,
                    key: str | None = None) -> dict:
    started = time.time()
    root, store, key = absolute(root), absolute(store), absolute(key)
    params = load_params(params_file)
    store = store or params["publish"]["store"]
    ledger = Ledger()
    params, by_class, skipped = served_models(params, root)
    jobs = [fleet_tasks.write_job(store, dc, models, params) for dc, models in by_class.items()]
    pooled = [j for j in jobs if fleet_tasks.class_deployment(j["device_class"])]
    here = [j for j in jobs if j not in pooled]
    ledger.map(fleet_tasks.profile_job, [(job, store, root, params) for job in here])
    if pooled:
        t0 = time.perf_counter()
        for (run_name, state), job in zip(fleet_tasks.run_on_pools(pooled, store, root, params_file), pooled):
            ledger.rows.append({"task": "profile-job", "cached": False, "state": state, "seconds":
                                round(time.perf_counter() - t0, 3), "args": f"{job['device_class']} {run_name}"})
    drifts = [fleet_tasks.collect(store, job, root) for job in jobs]
    drifted = {job["device_class"] for job, drift in zip(jobs, drifts) if drift}
    models = sorted({m for drift in drifts for m in drift})  # name:version with a new profile: versioned in DVC
    ledger.map(model_tasks.version, [(str(Path(root, *m.split(":", 1))), params) for m in models])
    idle = {x.split(":")[0] for x in skipped}
    deps = [d["name"] for d in params["deployments"] if d["device_class"] in drifted and d["name"] not in idle]
    before = {d: read_plan(root, d) for d in deps}
    plans = dict(zip(deps, ledger.map(dep_tasks.plan, [(root, d, params) for d in deps])))
    changed = [d for d in deps if plan_differs(before[d], plans[d])]
    published = dict(zip(changed, ledger.map(dep_tasks.publish, [(root, d, params, store, key) for d in changed])))
    summary = report(ledger, "fleet", "reprofile", root, plans, published)
    return {**summary, "jobs": [j["id"] for j in jobs], "drift": dict(zip([j["device_class"] for j in jobs], drifts)),
            "versioned": models, "replanned": deps, "skipped": skipped, "plan_changed": changed, "flow_started": started,
            "flow_seconds": time.time() - started}
