"""compile-model: a new model version -> verified segments and profiles -> for every deployment serving it:
plan -> signed bundle -> a new published revision. Nothing that failed verify is published."""
from __future__ import annotations

import time

from prefect import flow

from flows.common import Ledger, deployments_serving, device_classes, load_params, report
from tasks import deployment as dep_tasks
from tasks import model as model_tasks


@flow(name="compile-model")
def compile_model(source: str, name: str, version: str, root: str = "artifacts", params_file: str | None = None,
                  store: str | None = None, key: str | None = None, input_shape: list[int] | None = None,
                  refresh: bool = False) -> dict:
    started = time.time()
    params = load_params(params_file)
    ledger = Ledger(refresh)
    model_dir = ledger.run(model_tasks.ingest, source, name, version, root, input_shape, params)
    ledger.run(model_tasks.build, model_dir, params)
    ledger.run(model_tasks.verify, model_dir, params)
    params, served = deployments_serving(params, name, version, root)
    for device_class in device_classes(params, served):
        ledger.run(model_tasks.profile, model_dir, device_class, params)
    plans, published = {}, {}
    for d in served:
        plans[d] = ledger.run(dep_tasks.plan, root, d, params)
        published[d] = ledger.run(dep_tasks.publish, root, d, params, store, key)
    return {**report(ledger, name, version, model_dir, plans, published), "flow_started": started,
            "flow_seconds": time.time() - started}
