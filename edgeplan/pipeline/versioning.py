"""Versioning a model version's artifacts with DVC and pushing them to the DVC remote (the flow's last model
step). The workspace is the directory holding the artifact root; DVC commands in one workspace never run at
once (a lock file); with no DVC repository there, one is made (``--no-scm`` outside git), and with no default
remote, a local one (``.edgeplan/dvc-remote``, in ``.dvc/config.local``, so nothing tracked changes).

A model the workspace's dvc.yaml builds (params.yaml ``models``) is recorded with ``dvc commit`` of its
stages (its outputs are theirs); any other with ``dvc add`` of its directory."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from edgeplan.errors import EdgeplanError

LOCAL_REMOTE = ".edgeplan/dvc-remote"


class VersioningError(EdgeplanError):
    """A DVC command failed; the message has its output."""


@contextmanager
def workspace_lock(ws: Path):
    (ws / ".edgeplan").mkdir(parents=True, exist_ok=True)
    with open(ws / ".edgeplan" / "dvc.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


DVC_TIMEOUT_S = 600.0  # params.yaml orchestration.dvc_timeout_s


def _run(ws: Path, *args: str, timeout_s: float = DVC_TIMEOUT_S) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("dvc")
    try:
        return subprocess.run([str(exe) if exe.exists() else "dvc", *args], cwd=ws, capture_output=True, text=True,
                              check=False, env={**os.environ, "DVC_NO_ANALYTICS": "1"}, timeout=timeout_s)
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        raise VersioningError(f"dvc {' '.join(args)} in {ws} did not finish in {timeout_s:g} s "
                              "(orchestration.dvc_timeout_s): is the DVC remote reachable? Re-run to finish") from None


def _default_remote(ws: Path) -> str:
    """The default remote's name, "" when none is set (``dvc remote default`` then exits non-zero)."""
    proc = _run(ws, "remote", "default")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _dvc(ws: Path, *args: str, timeout_s: float = DVC_TIMEOUT_S) -> str:
    proc = _run(ws, *args, timeout_s=timeout_s)
    if proc.returncode != 0:  # DVC's ERROR lines say why (its -q hides them), else the tail of what it printed
        said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("ERROR")]
        why = " ".join(said) or " ".join((proc.stdout + proc.stderr).split())[-1500:]
        raise VersioningError(f"dvc {' '.join(args)} in {ws} failed (exit {proc.returncode}): {why}")
    return proc.stdout


def version_artifacts(model_dir: Path, params: dict) -> dict:
    """Record ``model_dir`` (``<ws>/<artifacts>/<name>/<version>``) in DVC and push it; what was done."""
    model_dir = Path(model_dir).resolve()
    name, version = model_dir.parent.name, model_dir.name
    ws = model_dir.parents[2]
    limit = float((params.get("orchestration") or {}).get("dvc_timeout_s", DVC_TIMEOUT_S))
    with workspace_lock(ws):
        if not (ws / ".dvc").is_dir():
            _dvc(ws, "init", *([] if (ws / ".git").exists() else ["--no-scm"]), "-q")
        if not _default_remote(ws):
            remote = (ws / LOCAL_REMOTE).resolve()
            remote.mkdir(parents=True, exist_ok=True)
            _dvc(ws, "remote", "add", "--local", "-d", "-f", "edgeplan-local", str(remote))
        listed = [(str(m["name"]), str(m["version"])) for m in params.get("models") or []]
        if (ws / "dvc.yaml").is_file() and (name, version) in listed and model_dir.parent.parent.name == "artifacts":
            i = listed.index((name, version))
            stages = [f"{s}@{i}" for s in ("ingest", "build", "verify", "stream", "parallax", "profile")]
            _dvc(ws, "commit", "-f", *stages, timeout_s=limit)
            how = f"dvc commit {' '.join(stages)}"
        else:
            _dvc(ws, "add", str(model_dir.relative_to(ws)), timeout_s=limit)
            how = f"dvc add {model_dir.relative_to(ws)}"
        _dvc(ws, "push", timeout_s=limit)  # no -q anywhere: it hides the ERROR line of a failure
        remote = _default_remote(ws)
    return {"model": name, "version": version, "workspace": str(ws), "recorded_by": how, "remote": remote}
