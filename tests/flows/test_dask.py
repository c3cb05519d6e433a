"""`edgeplan run --dask ADDRESS` without a model: the compile-models flow builds params.yaml's models, its
tasks on a Dask cluster (a LocalCluster with 2 workers, started here) through prefect-dask's DaskTaskRunner,
every process reporting to one real Prefect server."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml
from distributed import LocalCluster


def test_run_on_a_dask_cluster(tmp_path, prefect_server, monkeypatch):
    _, env = prefect_server
    env = {**env, "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "results")}  # results shared with the workers
    for k in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH"):
        monkeypatch.setenv(k, env[k])  # the workers inherit them
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "profile": {"repeats": 10, "span_s": 0.5, "budget_s": 1.0}, "orchestration": {"conversion_slots": 2},
        "models": [{"name": "tiny", "version": "1", "source": "zoo:tiny_cnn"},
                   {"name": "small", "version": "1", "source": "zoo:tiny_cnn"}]}))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        runs = []
        for _ in range(2):  # cold, then warm from the cache the workers share
            proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "run", "--dask", cluster.scheduler_address,
                                   "--summary-json", "s.json"],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, proc.stderr[-4000:]
            runs.append(json.loads((tmp_path / "s.json").read_text()))
        prefixes = set(cluster.scheduler.task_prefixes)  # what the Dask scheduler ran
    assert {"ingest", "build", "verify", "parallax", "profile", "plan", "publish"} <= {p.split("-")[0] for p in prefixes}, prefixes
    assert [r["deployment"] for r in runs[0]["published"]] == ["tiny-solo", "small-solo"]
    assert {r["revision"] for r in runs[0]["published"]} == {1} and runs[0]["cache_hits"] == 0
    assert runs[1]["cache_hits"] == len(runs[1]["tasks"]) == 20  # 10 stages x 2 models, all from the cache
    for name in ("tiny", "small"):
        assert (tmp_path / "artifacts" / name / "1" / "verify.json").is_file()

