"""`edgeplan run` end to end on its local Prefect server (a real `prefect server start`, started by the first
run and reused by the others, stopped at the end), a local store and a generated key: cold run, warm run from
the cache, a planner parameter change, a conflicting model, a wrong key, and a run killed mid-build that a
rerun resumes; the run's report (no unactionable warnings, headers not cut in a log, EMULATED only where an
emulated figure enters, the runtime's latency beside the client's)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

FAST_PROFILE = {"repeats": 10, "span_s": 0.5, "budget_s": 1.0}


def run_env(cwd: Path) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(cwd / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "EDGEPLAN_PREFECT_SERVER": "local"}
    env.pop("PREFECT_API_URL", None)
    return env


def edgeplan(cwd: Path, *args, timeout=900):
    env = run_env(cwd)
    return subprocess.run([sys.executable, "-m", "edgeplan.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def flat(text: str) -> str:
    """The CLI's text with rich's line wrapping undone (it wraps at 80 columns without a terminal)."""
    return " ".join(text.split())


def ran_tasks(out: str) -> dict:
    """task -> 'cached' | state, from the run's summary table."""
    found = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 3 and cells[0] in ("ingest", "build", "verify", "stream", "profile", "version", "plan", "publish",
                                            "plan_spatial", "plan_autodice"):
            found[cells[0]] = cells[1]
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    (d / "params.yaml").write_text(yaml.safe_dump({"profile": FAST_PROFILE}))
    yield d
    stop_server(d)


def stop_server(d: Path) -> None:
    """`edgeplan server stop`, then the server and its record are gone."""
    record = d / ".edgeplan" / "prefect" / "server.json"
    pid = json.loads(record.read_text())["pid"] if record.exists() else None
    stopped = edgeplan(d, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    home = str(d / ".edgeplan" / "prefect")
    deadline = time.time() + 30
    while home in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout and time.time() < deadline:
        time.sleep(0.5)
    assert home not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert pid is None or not record.exists()  # the supervisor and its server are gone, and so is the record


def test_cold_then_warm_then_plan_change(workdir):
    cold = edgeplan(workdir, "run", "zoo:tiny_cnn", "--name", "tiny", "--version", "1")
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert set(ran_tasks(cold.stdout).values()) == {"Completed"}, cold.stdout
    assert "published tiny-solo revision 1" in flat(cold.stdout) and "development key" in flat(cold.stdout)
    store = workdir / ".edgeplan" / "store"
    latest = json.loads((store / "deployments" / "tiny-solo" / "latest").read_text())
    assert latest["revision"] == 1
    # the report: a local server was started for this run; no warning a user cannot act on; headers whole in a
    # log; EMULATED only on a plan whose point puts a prefix on the (emulated) Edge TPU
    assert "starting a local Prefect server" in flat(cold.stdout)
    assert "Timeout of" not in cold.stderr and "Timeout of" not in cold.stdout
    assert "…" not in cold.stdout, cold.stdout
    assert "runtime ms" in cold.stdout and "client ms" in cold.stdout
    plan_rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in cold.stdout.splitlines()
                 if line.startswith("│ tiny-solo") and "tiny:1" in line]
    assert plan_rows, cold.stdout
    for row in plan_rows:
        point = int(row[2].split("/")[0])
        assert ("EMULATED" in row[-1]) == (point > 0) and ("CPU" in row[-1]) == (row[2].split("/")[0] != row[2].split("/")[1])
    server = json.loads((workdir / ".edgeplan" / "prefect" / "server.json").read_text())
    # the model version is versioned with DVC (no repository here: one without git) and pushed to the
    # local DVC remote
    assert (workdir / "artifacts" / "tiny" / "1.dvc").is_file()
    assert any((workdir / ".edgeplan" / "dvc-remote").rglob("*"))
    # the same model version again: everything from the cache, nothing published
    warm = edgeplan(workdir, "run", "zoo:tiny_cnn", "--name", "tiny", "--version", "1")
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert set(ran_tasks(warm.stdout).values()) == {"cached"}, warm.stdout
    assert "starting a local Prefect server" not in flat(warm.stdout)  # the same server, reused
    assert json.loads((workdir / ".edgeplan" / "prefect" / "server.json").read_text()) == server
    status = edgeplan(workdir, "server", "status")
    assert status.returncode == 0 and server["url"] in flat(status.stdout)
    # one planner parameter changed: only plan and publish run, and publish makes revision 2
    (workdir / "params.yaml").write_text(yaml.safe_dump({"profile": FAST_PROFILE,
                                                         "plan": {"rate_factors": [0.5, 1.0, 2.0, 4.0]}}))
    try:
        changed = edgeplan(workdir, "run", "zoo:tiny_cnn", "--name", "tiny", "--version", "1")
    finally:
        (workdir / "params.yaml").write_text(yaml.safe_dump({"profile": FAST_PROFILE}))
    assert changed.returncode == 0, changed.stderr[-3000:]
    states = ran_tasks(changed.stdout)
    assert [t for t, s in states.items() if s != "cached"] == ["plan", "publish"], changed.stdout
    assert "revision 2" in flat(changed.stdout)


def test_conflicting_model_and_wrong_key_are_refused(workdir):
    other = edgeplan(workdir, "run", "zoo:light_squeezenet", "--name", "tiny", "--version", "1")
    assert other.returncode == 2 and "already exists" in flat(other.stderr) and "new version" in flat(other.stderr)
    from edgeplan.bundle import keys

    _, stranger, _ = keys.generate(workdir / "stranger")
    wrong = edgeplan(workdir, "run", "zoo:tiny_cnn", "--name", "tiny", "--version", "9", "--key", str(stranger))
    assert wrong.returncode == 2 and "do not trust" in flat(wrong.stderr)
    assert not (workdir / "artifacts" / "tiny" / "9").exists()  # refused before anything ran


def test_killed_mid_build_resumes(workdir):
    env = run_env(workdir)
    proc = subprocess.Popen([sys.executable, "-m", "edgeplan.cli", "run", "zoo:tiny_cnn", "--name", "tiny",
                             "--version", "2"], cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    model_json = workdir / "artifacts" / "tiny" / "2" / "model.json"
    deadline = time.time() + 300
    while not model_json.exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # inside the build (its int8 conversion takes ~10 s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (workdir / "artifacts" / "tiny" / "2" / "verify.json").exists()
    again = edgeplan(workdir, "run", "zoo:tiny_cnn", "--name", "tiny", "--version", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    states = ran_tasks(again.stdout)
    assert states["ingest"] == "cached" and states["build"] == "Completed", again.stdout
    assert json.loads((workdir / "artifacts" / "tiny" / "2" / "verify.json").read_text())["ok"]


def test_submit_event_runs_the_deployment(tmp_path, prefect_server):
    """`edgeplan submit` against a real Prefect server: the compile-on-new-version deployment (deployed from
    prefect.yaml) is triggered by the event and run by a real process worker; the bundle is published."""
    repo = Path(__file__).resolve().parents[2]
    _, env = prefect_server
    work = tmp_path / "work"
    work.mkdir()
    (work / "params.yaml").write_text(yaml.safe_dump({"profile": FAST_PROFILE}))
    env = {**env, "EDGEPLAN_WORKDIR": str(work), "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "results")}
    prefect = Path(sys.executable).with_name("prefect")

    def sh(*cmd, cwd=repo, timeout=300):
        proc = subprocess.run([str(x) for x in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, (cmd, proc.stdout[-3000:], proc.stderr[-3000:])
        return proc.stdout

    (work / "params.yaml").write_text(yaml.safe_dump({"profile": FAST_PROFILE,
                                                     "orchestration": {"reprofile_cron": "17 4 * * *"}}))
    out = sh(sys.executable, "-m", "edgeplan.cli", "deploy", cwd=work)
    assert "17 4 * * *" in " ".join(out.split())
    inspect = sh(prefect, "deployment", "inspect", "reprofile-fleet/reprofile-fleet")
    assert "17 4 * * *" in inspect
    assert edgeplan_env(work, env, "run", "--help").returncode == 0  # the CLI works from the work directory
    # a dev key for the worker's publish, then the submission
    sh(sys.executable, "-m", "edgeplan.cli", "keys", "generate", cwd=work)
    sh(sys.executable, "-m", "edgeplan.cli", "submit", "zoo:tiny_cnn", "--name", "tiny", "--version", "1", cwd=work)
    assert (work / ".edgeplan" / "store" / "models" / "tiny" / "1" / "model.onnx").is_file()
    env["PREFECT_WORKER_QUERY_SECONDS"] = "2"
    workers = [subprocess.Popen([str(prefect), "worker", "start", "--pool", pool], cwd=work, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
               for pool in ("edgeplan-compile", "coral-usb-emulated")]
    latest = work / ".edgeplan" / "store" / "deployments" / "tiny-solo" / "latest"
    try:
        deadline = time.time() + 600
        while not latest.exists() and time.time() < deadline:
            time.sleep(2)
        assert latest.exists(), "the deployment did not publish within 10 minutes"
        assert json.loads(latest.read_text())["revision"] == 1
        assert json.loads((work / "artifacts" / "tiny" / "1" / "verify.json").read_text())["ok"]
        # reprofile-fleet (run by the compile pool's worker) hands the class's profiling job to the
        # profile-job/coral-usb-emulated deployment, which the class pool's worker runs
        slow_down(work / "artifacts" / "tiny" / "1" / "profiles" / "coral-usb-emulated.json")
        sh(prefect, "deployment", "run", "reprofile-fleet/reprofile-fleet", "--watch", timeout=600)
    finally:
        stop_groups(workers)
    runs = flow_runs(env)
    job_runs = [r for r in runs if r["deployment"] == "profile-job/coral-usb-emulated"]
    assert [r["state"] for r in job_runs] == ["COMPLETED"] and job_runs[0]["pool"] == "coral-usb-emulated", runs
    assert job_runs[0]["parent"] is not None  # a child of the reprofile-fleet run
    results = list((work / ".edgeplan" / "store" / "jobs").glob("*/result/*.json"))
    assert len(results) == 1 and json.loads(results[0].read_text())["drift"]  # the 3x slower profile drifted
    assert json.loads(latest.read_text())["revision"] >= 1


def stop_groups(procs: list, grace_s: float = 60.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``grace_s`` in all. A Prefect process worker
    told to stop waits for its flow-run subprocesses (Prefect's own shutdown, not edgeplan's); on a loaded host
    (stop 77's CI) one took longer than 60 s, which failed a test whose runs had all completed."""
    for p in procs:
        os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def slow_down(profile: Path, factor: float = 3.0) -> None:
    """Make a profile say the CPU was ``factor`` times slower than it is (a job on it then sees drift)."""
    data = json.loads(profile.read_text())
    for seg in data["segments"]:
        for t in seg.get("cpu") or []:
            t["median_ms"] *= factor
    profile.write_text(json.dumps(data))


def flow_runs(env: dict) -> list[dict]:
    """Every flow run on the server: deployment (flow/deployment), state type, work pool, parent task run."""
    script = """
import asyncio, json
from prefect.client.orchestration import get_client
async def main():
    async with get_client() as c:
        out = []
        for r in await c.read_flow_runs():
            dep = await c.read_deployment(r.deployment_id) if r.deployment_id else None
            flow = await c.read_flow(r.flow_id)
            out.append({"deployment": f"{flow.name}/{dep.name}" if dep else None, "state": r.state_type.value,
                        "pool": r.work_pool_name, "parent": str(r.parent_task_run_id) if r.parent_task_run_id else None})
        print(json.dumps(out))
asyncio.run(main())
"""
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def edgeplan_env(cwd: Path, env: dict, *args):
    return subprocess.run([sys.executable, "-m", "edgeplan.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_reprofile_fleet(workdir):
    """After test_cold_then_warm...: a fleet profiling job per device class; a profile made to look 3x slower
    than now drifts, its deployment is re-planned, and republished only if the plan changed."""
    import subprocess as sp

    # what the deployment was planned with (the version it serves: 2 after the killed-build test) is far from
    # what the CPU does now
    plan = json.loads((workdir / "artifacts" / "deployments" / "tiny-solo" / "plans" / "swapless.json").read_text())
    served = plan["models"][0]["version"]
    slow_down(workdir / "artifacts" / "tiny" / served / "profiles" / "coral-usb-emulated.json")
    script = ("import json, sys; from flows.reprofile_fleet import reprofile_fleet; "
              "print('SUMMARY' + json.dumps(reprofile_fleet(root='artifacts'), default=str))")
    env = {**os.environ, "PREFECT_HOME": str(workdir / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = sp.run([sys.executable, "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.split("SUMMARY", 1)[1])
    assert summary["drift"]["coral-usb-emulated"], summary  # the 3x is seen as drift
    store = workdir / ".edgeplan" / "store"
    assert (store / "jobs" / summary["jobs"][0] / "job.json").is_file()
    assert list((store / "jobs" / summary["jobs"][0] / "result").glob("*.json"))
    assert "tiny-solo" in summary["replanned"] and summary["versioned"] == [f"tiny:{served}"]  # the new profile in DVC
    assert [r["deployment"] for r in summary["published"]] == summary["plan_changed"]
    # the job measured load capacity too, so the re-plan kept a FlashMem plan (it was dropped when it did not)
    profile = json.loads((workdir / "artifacts" / "tiny" / served / "profiles" / "coral-usb-emulated.json").read_text())
    assert profile["load_capacity"] is not None
    assert (workdir / "artifacts" / "deployments" / "tiny-solo" / "plans" / "flashmem.json").is_file()


def test_a_split_deployment_is_planned_and_published_with_its_tiles(tmp_path):
    """`split: spatial`: the model's profiles on both devices' classes measure conv speeds, plan_spatial cuts and
    verifies the tiles, and the revision carries them; a rerun takes all of it from the cache. Then `split:
    autodice`: plan_autodice explores and splits the model into layers, and the next revision carries that split
    instead."""
    from edgeplan.pipeline import params as params_mod

    coral = params_mod.load(None)["fleet"]["device_classes"]["coral-usb-emulated"]
    net = {"net_bytes_per_s": 1.25e6, "arch": "cpu"}
    fleet = {"device_classes": {"head": {**coral, **net},
                                "helper": {**{k: v for k, v in coral.items() if k != "cpu_probe_ms"}, **net,
                                           "accelerator": {"kind": "none"}}},
             "devices": [{"id": "dev-a", "device_class": "head", "deployment": "chain-split", "work_pool": "head"},
                         {"id": "dev-b", "device_class": "helper", "deployment": "chain-split", "work_pool": "helper"}]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "profile": FAST_PROFILE, "spatial": {"threshold": 0.15, "dims": ["H"], "verify_samples": 1}, "fleet": fleet,
        "deployments": [{"name": "chain-split", "device_class": "head", "split": "spatial",
                         "models": [{"name": "chain", "version": "latest", "rate": 1.0}]}]}))
    try:
        cold = edgeplan(tmp_path, "run", "zoo:spatial_chain", "--name", "chain", "--version", "1")
        assert cold.returncode == 0, cold.stderr[-3000:]
        assert ran_tasks(cold.stdout)["plan_spatial"] == "Completed", cold.stdout
        assert "Spatial splits (ADaPS)" in flat(cold.stdout) and "dev-a" in cold.stdout, cold.stdout
        for cls in ("head", "helper"):
            profile = json.loads((tmp_path / "artifacts" / "chain" / "1" / "profiles" / f"{cls}.json").read_text())
            assert profile["conv_speed"]["s_per_mac"] > 0
        plan = json.loads((tmp_path / "artifacts" / "deployments" / "chain-split" / "plans" / "spatial.json").read_text())
        assert [d["id"] for d in plan["devices"]] == ["dev-a", "dev-b"] and min(plan["tiles"]["identical"].values()) == 1
        store = tmp_path / ".edgeplan" / "store" / "deployments" / "chain-split"
        manifest = json.loads((store / "1" / "manifest.json").read_text())
        assert manifest["plans"]["spatial"] == "deployments/chain-split/plans/spatial.json"
        tables = json.loads((tmp_path / "artifacts" / "deployments" / "chain-split" / "spatial" / "tables.json").read_text())
        names = {b["name"] for b in manifest["blobs"]}
        assert {f"deployments/chain-split/spatial/{s['int8']}" for s in tables["stages"]} <= names
        warm = edgeplan(tmp_path, "run", "zoo:spatial_chain", "--name", "chain", "--version", "1")
        assert warm.returncode == 0, warm.stderr[-3000:]
        assert set(ran_tasks(warm.stdout).values()) == {"cached"}, warm.stdout
        # the same deployment split by AutoDiCE instead (the memory objective spreads it over both devices)
        doc = yaml.safe_load((tmp_path / "params.yaml").read_text())
        doc["deployments"][0]["split"] = "autodice"
        doc["multidevice"] = {"objective": "memory", "population": 20, "generations": 10, "repeats": 3}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc))
        layered = edgeplan(tmp_path, "run", "zoo:spatial_chain", "--name", "chain", "--version", "1")
        assert layered.returncode == 0, layered.stderr[-3000:]
        ran = ran_tasks(layered.stdout)
        assert ran["plan_autodice"] == "Completed" and "plan_spatial" not in ran, layered.stdout
        assert "Layer splits (AutoDiCE)" in flat(layered.stdout), layered.stdout
        plans = tmp_path / "artifacts" / "deployments" / "chain-split" / "plans"
        assert not (plans / "spatial.json").exists() and (plans / "autodice.png").is_file()
        manifest = json.loads((store / "2" / "manifest.json").read_text())
        assert manifest["plans"]["autodice"] == "deployments/chain-split/plans/autodice.json"
        assert "spatial" not in manifest["plans"]
        tables = json.loads((tmp_path / "artifacts" / "deployments" / "chain-split" / "multidevice" / "tables.json").read_text())
        names = {b["name"] for b in manifest["blobs"]}
        assert len(tables["ranks"]) == 2 and {r["device"] for r in tables["ranks"]} == {"dev-a", "dev-b"}
        assert {f"deployments/chain-split/multidevice/{s['int8']}" for s in tables["stages"]} <= names
        assert not any(n.startswith("deployments/chain-split/spatial/") or "/float/" in n for n in names)
    finally:
        stop_server(tmp_path)
