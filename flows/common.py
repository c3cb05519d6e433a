"""What the flows share: params, which deployments a model serves, running tasks with a record of cache
hits, and the run's report (Prefect artifacts; the CLI prints the same)."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact

def load_params(params_file: str | None) -> dict:
    """params.yaml with its local paths made absolute (tasks may run on Dask workers in another directory)."""
    from edgeplan.pipeline import params as params_mod

    params = params_mod.load(params_file)
    pub = params["publish"]
    if "://" not in str(pub["store"]):
        pub["store"] = str(Path(pub["store"]).resolve())
    pub["trusted_keys"] = [str(Path(p).resolve()) for p in pub["trusted_keys"]]
    return params


def absolute(path: str | None) -> str | None:
    """A local path made absolute; URIs, zoo names and None as they are."""
    if path is None or "://" in str(path) or str(path).startswith("zoo:"):
        return path
    return str(Path(path).resolve())


@dataclass
class Ledger:
    """Runs tasks and records, per task run, whether it came from the cache and how long it took."""

    refresh: bool = False
    rows: list = field(default_factory=list)
    stage_seconds: dict = field(default_factory=dict)  # tasks waited for together ("a+b") -> wall time
    _pending: list = field(default_factory=list)
    _t0: float = 0.0

    def run(self, task, *args):
        return self.map(task, [args])[0]

    def map(self, task, calls: list[tuple]) -> list:
        """Submit every call to the flow's task runner at once (threads by default; Dask workers with
        --dask), wait for all, record each, and return the results in order (raising the first failure)."""
        self.submit(task, calls)
        return self.gather()

    def submit(self, task, calls: list[tuple], after: list | None = None) -> list:
        """Submit without waiting; call ``i`` waits for ``after[i]`` (a future) when given. A future may be
        an argument (its result is passed). ``gather`` waits for everything submitted."""
        if not self._pending:
            self._t0 = time.perf_counter()
        runner = task.with_options(refresh_cache=self.refresh or None)
        futures = [runner.submit(*args, wait_for=[after[i]] if after else None) for i, args in enumerate(calls)]
        self._pending += [(task.name, args, f) for args, f in zip(calls, futures)]
        return futures

    def gather(self) -> list:
        """Wait for every submitted call, record each (in submission order), and return the results
        (raising the first failure)."""
        pending, self._pending = self._pending, []
        states = []
        for name, args, future in pending:
            future.wait()
            state = future.state
            states.append(state)
            shown = [a.result() if hasattr(a, "result") and a.state.is_completed() else a for a in args[:3]]
            self.rows.append({"task": name, "cached": state.name == "Cached", "state": state.name,
                              "seconds": round(time.perf_counter() - self._t0, 3),
                              "args": " ".join(str(a) for a in shown if isinstance(a, str))})
        group = "+".join(dict.fromkeys(name for name, _, _ in pending))
        self.stage_seconds[group] = round(self.stage_seconds.get(group, 0.0) + time.perf_counter() - self._t0, 3)
        return [s.result() for s in states]

    @property
    def hits(self) -> int:
        return sum(r["cached"] for r in self.rows)

    def ran(self) -> list[str]:
        return [r["task"] for r in self.rows if not r["cached"]]


def served_models(params: dict, root: str) -> tuple[dict, dict[str, list[dict]], list[str]]:
    """The deployments to reprofile: those of params.yaml whose models are built, and those planned before
    (``<root>/deployments/*/plans/swapless.json``, e.g. a model's automatic one-model deployment), every
    model's version explicit. Returns (params with exactly those deployments, per device class the models
    they serve as {name, version}, the deployments skipped with the reason). Skipped deployments stay in
    params (the fleet registry names them) but are not profiled or planned."""
    from edgeplan.errors import PlanError
    from edgeplan.pipeline.planning import resolve_version
    from edgeplan.plan.swapless.plan import SwapLessPlan

    params = copy.deepcopy(params)
    deployments, skipped = [], []
    for d in params["deployments"]:
        try:
            versions = [resolve_version(Path(root), m["name"], str(m.get("version", "latest"))) for m in d["models"]]
        except PlanError as e:
            skipped.append(f"{d['name']}: {e}")
            continue
        for m, v in zip(d["models"], versions):
            m["version"] = v
        deployments.append(d)
    known = {d["name"] for d in deployments} | {s.split(":")[0] for s in skipped}
    for path in sorted(Path(root).glob("deployments/*/plans/swapless.json")):
        plan = SwapLessPlan.load(path)
        if plan.deployment not in known:
            deployments.append({"name": plan.deployment, "device_class": plan.device_class,
                                "models": [{"name": m.name, "version": m.version, "rate": m.rate} for m in plan.models]})
    params["deployments"] += [d for d in deployments if d not in params["deployments"]]
    by_class: dict[str, list[dict]] = {}
    for d in deployments:
        for m in d["models"]:
            entry = {"name": m["name"], "version": m["version"]}
            if entry not in by_class.setdefault(d["device_class"], []):
                by_class[d["device_class"]].append(entry)
    return params, by_class, skipped


def read_plan(root: str, name: str):
    """The deployment's current SwapLess plan, None before the first."""
    from edgeplan.plan.swapless.plan import SwapLessPlan

    path = Path(root) / "deployments" / name / "plans" / "swapless.json"
    return SwapLessPlan.load(path) if path.is_file() else None


def plan_differs(old, new) -> bool:
    """Whether a re-plan changed what a device would run: chosen points and cores, the regime table, the
    preload set (not the predicted latencies, which move with every profile)."""
    if old is None:
        return True

    def what(p):
        return ([(m.name, m.version, m.point, m.cores) for m in p.models],
                [(r.points, r.cores) for r in p.regimes], [(x.model, x.point) for x in p.preload])

    return what(old) != what(new)


def report(ledger: Ledger, name: str, version: str, model_dir: str, plans: dict, published: dict) -> dict:
    """The run's summary as Prefect artifacts (a table of task runs, a markdown page) and as a dict."""
    from edgeplan.plan.swapless.plan import figure_sources

    plan_rows = []
    for dep, p in plans.items():
        for m in p.models:
            plan_rows.append({"deployment": dep, "model": m.name, "version": m.version, "point": m.point,
                              "of": m.last_point, "cores": m.cores,
                              "predicted_ms": round(m.predicted_latency_ms, 3), "tpu": p.tpu_source,
                              "figures": figure_sources(m.point, m.last_point, p.tpu_source)})
    publish_runs = [r for r in ledger.rows if r["task"] == "publish"][-len(published):] if published else []
    pub_rows = [{"deployment": dep, "revision": r.revision, "new_revision": r.new_revision and not run["cached"],
                 "from_cache": run["cached"], "blobs": r.blobs, "uploaded_blobs": 0 if run["cached"] else r.uploaded_blobs,
                 "uploaded_bytes": 0 if run["cached"] else r.uploaded_bytes,
                 "devices": ", ".join(r.devices)} for (dep, r), run in zip(published.items(), publish_runs)]
    summary = {"model": name, "version": version, "artifacts": model_dir, "tasks": ledger.rows,
               "cache_hits": ledger.hits, "ran": ledger.ran(), "stage_seconds": ledger.stage_seconds, "plans": plan_rows,
               "published": pub_rows}
    create_table_artifact(key="task-runs", table=ledger.rows, description=f"{name} {version}: task runs "
                          f"({ledger.hits} from the cache)")
    lines = [f"# compile-model: {name} {version}", "", f"artifacts: `{model_dir}`; {ledger.hits} of "
             f"{len(ledger.rows)} task runs from the cache; ran: {', '.join(ledger.ran()) or 'nothing'}", "",
             "| deployment | model | point | cores | predicted ms | from |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['deployment']} | {r['model']}:{r['version']} | {r['point']}/{r['of']} | {r['cores']} | "
              f"{r['predicted_ms']} | {r['figures']} |" for r in plan_rows]
    lines += ["", "| deployment | revision | new | blobs | uploaded bytes | devices |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['deployment']} | {r['revision']} | {r['new_revision']} | {r['blobs']} | {r['uploaded_bytes']:,} | "
              f"{r['devices']} |" for r in pub_rows]
    create_markdown_artifact(key="compile-model-report", markdown="\n".join(lines))
    return summary
