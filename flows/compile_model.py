"""compile-model: a new model version -> verified segments and profiles -> for every deployment serving it:
plan -> signed bundle -> a new published revision. Nothing that failed verify is published."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow

from flows.common import (
    Ledger,
    absolute,
    deployments_serving,
    device_classes,
    load_params,
    report,
)
from tasks import deployment as dep_tasks
from tasks import model as model_tasks


@flow(name="compile-model")
def compile_model(source: str, name: str, version: str, root: str = "artifacts", params_file: str | None = None,
                  store: str | None = None, key: str | None = None, input_shape: list[int] | None = None,
                  refresh: bool = False) -> dict:
    started = time.time()
    source, root, store, key = absolute(source), absolute(root), absolute(store), absolute(key)
    params = load_params(params_file)
    ledger = Ledger(refresh)
    model_dir = ledger.run(model_tasks.ingest, source, name, version, root, input_shape, params)
    ledger.run(model_tasks.build, model_dir, params)
    ledger.run(model_tasks.verify, model_dir, params)
    params, served = deployments_serving(params, name, version, root)
    ledger.map(model_tasks.profile, [(model_dir, dc, params) for dc in device_classes(params, served)])
    ledger.run(model_tasks.version, model_dir, params)  # DVC: the model version's artifacts, pushed
    plans = dict(zip(served, ledger.map(dep_tasks.plan, [(root, d, params) for d in served])))
    published = dict(zip(served, ledger.map(dep_tasks.publish, [(root, d, params, store, key) for d in served])))
    return {**report(ledger, name, version, model_dir, plans, published), "flow_started": started,
            "flow_seconds": time.time() - started}


@flow(name="compile-submitted")
def compile_submitted(name: str, version: str, store: str, root: str = "artifacts", params_file: str | None = None,
                      key: str | None = None) -> dict:
    """What `compile-on-new-version` runs on an ``edgeplan.model.submitted`` event: the submitted model from
    the store, then compile-model (publishing to the same store)."""
    from edgeplan.store import open_store
    from edgeplan.submit import fetch

    path = fetch(open_store(absolute(store)), name, version, Path(absolute(root)) / ".submitted")
    return compile_model(str(path), name, version, root=root, params_file=params_file, store=store, key=key)
