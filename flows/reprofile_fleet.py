"""reprofile-fleet: a profiling job per device class -> drift -> re-plan the deployments of drifted classes
-> republish only those whose plan changed."""
from __future__ import annotations

import time

from prefect import flow

from flows.common import Ledger, absolute, load_params, plan_differs, read_plan, report, served_models
from tasks import deployment as dep_tasks
from tasks import fleet as fleet_tasks


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
    drifts = ledger.map(fleet_tasks.profile_job, [(job, store, root, params) for job in jobs])
    drifted = {job["device_class"] for job, drift in zip(jobs, drifts) if drift}
    idle = {x.split(":")[0] for x in skipped}
    deps = [d["name"] for d in params["deployments"] if d["device_class"] in drifted and d["name"] not in idle]
    before = {d: read_plan(root, d) for d in deps}
    plans = dict(zip(deps, ledger.map(dep_tasks.plan, [(root, d, params) for d in deps])))
    changed = [d for d in deps if plan_differs(before[d], plans[d])]
    published = dict(zip(changed, ledger.map(dep_tasks.publish, [(root, d, params, store, key) for d in changed])))
    summary = report(ledger, "fleet", "reprofile", root, plans, published)
    return {**summary, "jobs": [j["id"] for j in jobs], "drift": dict(zip([j["device_class"] for j in jobs], drifts)),
            "replanned": deps, "skipped": skipped, "plan_changed": changed, "flow_started": started,
            "flow_seconds": time.time() - started}
