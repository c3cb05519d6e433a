"""The deployment stages as tasks: plan (SwapLess) and publish (bundle, sign, upload)."""
from __future__ import annotations

from pathlib import Path

from prefect import task

from tasks.cache import content_key

PLAN_CODE = ("plan/swapless", "pipeline/planning.py", "profile/schema.py", "profile/fleet.py", "artifacts.py")
PUBLISH_CODE = ("bundle", "store", "cli_store.py", "artifacts.py", "quantize/litert.py", "quantize/calibration.py")


def _models(p: dict) -> list[dict]:
    return next(d for d in p["params"]["deployments"] if d["name"] == p["name"])["models"]


def _plan_inputs(p: dict):
    dep = next(d for d in p["params"]["deployments"] if d["name"] == p["name"])
    root = Path(p["root"])
    return [root / m["name"] / str(m["version"]) / "profiles" / f"{dep['device_class']}.json" for m in dep["models"]] + [
        root / m["name"] / str(m["version"]) / "analysis.json" for m in dep["models"]]


def _plan_params(p: dict):
    dep = next(d for d in p["params"]["deployments"] if d["name"] == p["name"])
    return ["plan", f"fleet.device_classes.{dep['device_class']}"]


@task(name="plan", cache_key_fn=content_key(_plan_inputs, _plan_params, PLAN_CODE, scalars=("root", "name")),
      persist_result=True)
def plan(root: str, name: str, params: dict):
    """deployments/<name>/plans/swapless.json (the deployment's models must name explicit versions)."""
    from edgeplan.pipeline.planning import plan_swapless

    return plan_swapless(Path(root), name, params)[0]


def _publish_inputs(p: dict):
    root = Path(p["root"])
    files = [root / "deployments" / p["name"] / "plans" / "swapless.json"]
    for m in _models(p):
        d = root / m["name"] / str(m["version"])
        files += [d / "segments", d / "profiles", d / "verify.json", d / "model.json", d / "model_int8.tflite"]
    return files


def _store_failure(task, task_run, state) -> bool:
    """Retry on store and network failures only (a wrong key or a failed verify will not get better)."""
    from edgeplan.errors import StoreError

    return isinstance(state.result(raise_on_failure=False), StoreError)


@task(name="publish", cache_key_fn=content_key(_publish_inputs, ["publish", "quantize.calibration", "fleet.devices"],
                                               PUBLISH_CODE, scalars=("root", "name", "store", "key")),
      persist_result=True, retries=3, retry_delay_seconds=[2, 8, 30],
      retry_condition_fn=_store_failure)
def publish(root: str, name: str, params: dict, store: str | None = None, key: str | None = None):
    """Build the bundle and publish it as the next signed revision (none when the content is unchanged).
    Retried with backoff: a rerun uploads only what is missing."""
    from edgeplan.cli_store import publish_deployment

    result, _ = publish_deployment(Path(root), name, params, store, key)
    return result
