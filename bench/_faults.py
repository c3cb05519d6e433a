"""What the reliability campaigns (bench/reliability.py) share: the deployment they publish and pull (compiled,
profiled and planned by the CLI in child processes), the signature judge (``cryptography`` itself over the
canonical JSON, never edgeplan's reading code), and forked publishers."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EDGEPLAN = [sys.executable, "-m", "edgeplan.cli"]
DEPLOYMENT = "solo"
CLASS = "coral-usb-emulated"
DEVICE = "edge-7"


# ---------------------------------------------------------------------------------------------- the deployment
def _run(cmd: list[str], env: dict) -> None:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd[3:6])} failed: {' | '.join(tail)}")


def _params(models: list[str]) -> dict:
    from edgeplan.pipeline import params as params_mod

    p = params_mod.load(None)
    p["deployments"] = [{"name": DEPLOYMENT, "device_class": CLASS,
                         "models": [{"name": m, "version": "1", "rate": 20.0} for m in models]}]
    p["fleet"]["devices"] = [{"id": DEVICE, "device_class": CLASS, "deployment": DEPLOYMENT, "work_pool": CLASS}]
    return p


def bundles(work: Path) -> tuple[dict, dict]:
    """Bundles A and B of deployment ``solo`` (compiled, profiled and planned by the CLI in child processes, so
    that this process, which forks the publishers, never imports TensorFlow), and the params of B."""
    import yaml

    from edgeplan.bundle.build import build

    arts = work / "artifacts"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    for zoo in ("tiny_cnn", "spatial_chain"):
        d = arts / zoo / "1"
        if not (d / "verify.json").is_file():
            _run([*EDGEPLAN, "compile", f"zoo:{zoo}", "--name", zoo, "--version", "1", "--out", str(arts)], env)
        if not (d / "profiles" / f"{CLASS}.json").is_file():
            _run([*EDGEPLAN, "profile", "run", str(d), "--device-class", CLASS, "--repeats", "3", "--budget-s", "1"],
                 env)
    out = {}
    for label, models in (("A", ["tiny_cnn"]), ("B", ["tiny_cnn", "spatial_chain"])):
        p = _params(models)
        path = work / f"params_{label}.yaml"
        path.write_text(yaml.safe_dump(p))
        _run([*EDGEPLAN, "--params", str(path), "plan", "swapless", "--deployment", DEPLOYMENT, "--out", str(arts)],
             env)
        out[label] = build(arts, DEPLOYMENT, p)
    return out, _params(["tiny_cnn", "spatial_chain"])



# ---------------------------------------------------------------------------------------------- signatures
def signed(doc: dict, public) -> bool:
    """The ed25519 signature over the canonical JSON (sorted keys, no whitespace) of ``doc`` without it."""
    from cryptography.exceptions import InvalidSignature

    rest = {k: v for k, v in doc.items() if k != "signature"}
    payload = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    try:
        public.verify(base64.b64decode(doc["signature"]), payload)
    except (InvalidSignature, KeyError, ValueError, TypeError):
        return False
    return True


# ---------------------------------------------------------------------------------------------- the publisher
def publisher(uri: str, endpoint: str | None, bundle, key_path: Path, params: dict, kill_at: int | None,
              report: Path) -> int:
    """Fork a publisher of ``bundle`` to ``uri``; its pid. It writes its result (and its store calls) to
    ``report`` when it finishes."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing of the parent's store clients, its own store
        from edgeplan.bundle import keys
        from edgeplan.bundle.publish import publish as publish_bundle
        from edgeplan.profile import fleet
        from edgeplan.store import KILL_AT_ENV, faults, open_store

        if kill_at is not None:
            os.environ[KILL_AT_ENV] = str(kill_at)

        store = open_store(uri, **({"endpoint_url": endpoint} if endpoint else {}))
        devices = [d for d in fleet.load(params, {DEPLOYMENT}).devices if d.deployment == DEPLOYMENT]
        r = publish_bundle(store, bundle, keys.load_signing_key(key_path), devices=devices)
        report.write_text(json.dumps({"revision": r.revision, "uploaded_bytes": r.uploaded_bytes,
                                      "calls": faults.calls()}))
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 (a forked child must never return into the harness) say why, go
        report.write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        os._exit(1)


def wait(pid: int, limit_s: float = 120.0) -> int:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise RuntimeError(f"publisher {pid} did not finish in {limit_s:.0f} s")




def record(rows: list, violations: list, row: dict, what: str, total: int) -> None:
    """Keep a trial's row (and it among the violations when it broke a promise); progress on stderr."""
    rows.append(row)
    if row["violations"]:
        violations.append(row)
    print(f"\r[reliability] {what}: {len(rows)}/{total}, {len(violations)} violations", end="", file=sys.stderr,
          flush=True)


# ---------------------------------------------------------------------------------------------- forked commands
def preload() -> None:
    """Import what ``edgeplan-runtime`` runs (pull, status, serve) once here, so that each forked command starts
    in milliseconds. This process must hold no threads when it forks."""
    import edgeplan.runtime.cli
    import edgeplan.runtime.engine
    import edgeplan.runtime.pull
    import edgeplan.runtime.server  # noqa: F401
    from edgeplan.quantize import litert  # noqa: F401


class Forked:
    """One ``edgeplan-runtime`` command (or another CLI ``module``'s) in its own process, a fork of this one: its
    ``main`` with ``argv`` and ``env``, stdout and stderr to files in ``work``. ``rc`` is its exit status (negative: the
    signal that ended it). A process that holds other threads (a test run that loaded TensorFlow or onnxruntime,
    whose pools may hold a lock at the fork) starts ``python -m edgeplan.runtime.cli`` instead."""

    def __init__(self, argv: list[str], env: dict, work: Path, tag: str = "cmd", module: str = "edgeplan.runtime.cli",
                 cwd: Path | None = None):
        self.out, self.err = work / f"{tag}.stdout", work / f"{tag}.stderr"
        self.t0, self.rc, self.proc = time.perf_counter(), None, None
        for path in (self.out, self.err):  # never read a previous command's output
            path.unlink(missing_ok=True)
        if len(os.listdir("/proc/self/task")) > 1:
            with open(self.out, "wb") as out, open(self.err, "wb") as err:
                self.proc = subprocess.Popen([sys.executable, "-m", module, *argv], env=env, cwd=cwd,
                                             stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            self.pid = self.proc.pid
            return
        self.pid = os.fork()
        if self.pid:
            return
        code = 1
        try:
            for fd, path in ((1, self.out), (2, self.err)):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            # the parent's sys.stdout/err may not write to fds 1 and 2 at all (pytest's capture writes to its own
            # files): the child's write to the files just opened, line by line
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives until os._exit)
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            os.environ.clear()
            os.environ.update(env)
            if cwd is not None:
                os.chdir(cwd)
            import importlib

            code = importlib.import_module(module).main(argv)
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001 (what escapes main is a traceback the judge must see)
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        if self.rc is None and self.proc is not None:
            self.rc = self.proc.poll()
        elif self.rc is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.rc = os.waitstatus_to_exitcode(status)
        return self.rc

    def wait(self, timeout: float = 300.0) -> int:
        end = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > end:
                self.kill()
                raise RuntimeError(f"edgeplan-runtime (pid {self.pid}) did not finish in {timeout:.0f} s")
            time.sleep(0.002)
        self.seconds = time.perf_counter() - self.t0
        return self.rc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)
            self.wait()

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.is_file() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.is_file() else ""


class Popened:
    """``Forked``'s interface over a plain subprocess in its own session (DVC is its own program; ``edgeplan run``
    imports TensorFlow): ``kill`` ends it with every child it started."""

    def __init__(self, argv: list[str], cwd: Path, env: dict, logs: Path, tag: str = "dvc"):
        self.out, self.err = logs / f"{tag}.stdout", logs / f"{tag}.stderr"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True)  # its DVC children are killed with it
        self.t0, self.rc, self.seconds = time.perf_counter(), None, None

    def poll(self) -> int | None:
        self.rc = self.proc.poll()
        if self.rc is not None and self.seconds is None:
            self.seconds = time.perf_counter() - self.t0
        return self.rc

    def wait(self, timeout: float = 300.0) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.poll()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait()

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")
