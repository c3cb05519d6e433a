"""compile-model: a new model version -> verified segments and profiles -> for every deployment serving it:
plan -> signed bundle -> a new published revision. Nothing that failed verify is published.
compile-models: the same for several model versions at once (by default params.yaml's ``models``, what
``dvc repro`` builds), every stage fanned out over the models on the flow's task runner."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow

from edgeplan.pipeline.planning import (conv_speed_pairs, deployments_serving, device_classes, split_classes,
                                        split_deployments)
from flows.common import Ledger, absolute, load_params, report
from tasks import deployment as dep_tasks
from tasks import model as model_tasks


def _compile(models: list[dict], root: str, params_file: str | None, store: str | None, key: str | None,
             refresh: bool) -> dict:
    """The stages for ``models`` ({source, name, version, input_shape?}): ingest -> build -> verify chained per
    model and submitted for all at once (conversions run in parallel up to the task runner's workers and the
    machine's conversion slots); then profiles, one at a time per machine after every conversion (timings are
    not shared with other work), Parallax's measured plans first; then DVC, plans and publishing."""
    started = time.time()
    root, store, key = absolute(root), absolute(store), absolute(key)
    params = load_params(params_file)
    ledger = Ledger(refresh)
    # one chain per model (ingest -> build -> verify), all submitted at once: a free worker takes the next
    # ready step of any model (no barrier between stages)
    ingested = ledger.submit(model_tasks.ingest, [(absolute(m["source"]), m["name"], str(m["version"]), root,
                                                   m.get("input_shape"), params) for m in models])
    built = ledger.submit(model_tasks.build, [(f, params) for f in ingested])
    verified = ledger.submit(model_tasks.verify, [(f, params) for f in ingested], after=built)
    verified = ledger.submit(model_tasks.accuracy, [(f, params) for f in ingested], after=verified)
    ledger.submit(model_tasks.stream, [(f, params) for f in ingested], after=verified)
    dirs = ledger.gather()[: len(models)]
    served: list[str] = []
    for m in models:
        params, names = deployments_serving(params, m["name"], str(m["version"]), root)
        served += [n for n in names if n not in served]
    classes = device_classes(params, served)
    split = split_classes(params, served)
    conv = conv_speed_pairs(params, split)
    ledger.map(model_tasks.parallax, [(d, params) for d in dirs])  # measured here: beside the profiles
    ledger.map(model_tasks.profile, [(d, dc, params, (m["name"], dc) in conv)
                                     for m, d in zip(models, dirs) for dc in classes])
    ledger.map(model_tasks.version, [(d, params) for d in dirs])  # DVC: each version's artifacts, pushed
    plans = dict(zip(served, ledger.map(dep_tasks.plan, [(root, d, params) for d in served])))
    made, splits = [], split_deployments(params, served)
    for planner, make in (("spatial", dep_tasks.plan_spatial), ("autodice", dep_tasks.plan_autodice)):
        names = [d for d, s in splits.items() if s == planner]
        made += ledger.map(make, [(root, d, params) for d in names]) if names else []
    published = dict(zip(served, ledger.map(dep_tasks.publish, [(root, d, params, store, key) for d in served])))
    name = models[0]["name"] if len(models) == 1 else ", ".join(m["name"] for m in models)
    version = str(models[0]["version"]) if len(models) == 1 else ", ".join(str(m["version"]) for m in models)
    return {**report(ledger, name, version, dirs[0] if len(dirs) == 1 else root, plans, published),
            "splits": [r for r in made if r], "flow_started": started, "flow_seconds": time.time() - started}


@flow(name="compile-model")
def compile_model(source: str, name: str, version: str, root: str = "artifacts", params_file: str | None = None,
                  store: str | None = None, key: str | None = None, input_shape: list[int] | None = None,
                  refresh: bool = False) -> dict:
    return _compile([{"source": source, "name": name, "version": version, "input_shape": input_shape}], root,
                    params_file, store, key, refresh)


@flow(name="compile-models")
def compile_models(models: list[dict] | None = None, root: str = "artifacts", params_file: str | None = None,
                   store: str | None = None, key: str | None = None, refresh: bool = False) -> dict:
    """Every model of ``models`` (default: params.yaml ``models``: name, version, source)."""
    from edgeplan.errors import EdgeplanError

    models = models if models is not None else load_params(params_file).get("models") or []
    if not models:
        raise EdgeplanError("compile-models: no models given and params.yaml lists none under `models`")
    return _compile(models, root, params_file, store, key, refresh)


@flow(name="compile-submitted")
def compile_submitted(name: str, version: str, store: str, root: str = "artifacts", params_file: str | None = None,
                      key: str | None = None) -> dict:
    """What `compile-on-new-version` runs on an ``edgeplan.model.submitted`` event: the submitted model from
    the store, then compile-model (publishing to the same store)."""
    from edgeplan.store import open_store
    from edgeplan.submit import fetch

    path = fetch(open_store(absolute(store)), name, version, Path(absolute(root)) / ".submitted")
    return compile_model(str(path), name, version, root=root, params_file=params_file, store=store, key=key)
