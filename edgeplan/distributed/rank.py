"""One MPI rank of a multi-device split (AutoDiCE §III-D, Fig. 2's code blocks): numpy, ai-edge-litert and
mpi4py only (the ``mpi`` extra).

    mpirun ... python -m mpi4py -m edgeplan.distributed.rank SPLIT_DIR --frames 100

Each rank loads its stages (``tables.json``: files under ``int8/``, sha256 checked; tensor names, shapes and
dtypes checked against the interpreters) into LiteRT with one thread per slot, and all ranks compare the sha256 of
``tables.json`` first: a rank on another revision stops the job before any frame. A rank posts an Irecv for every
buffer it receives one frame ahead (``--ahead``: the data of frame f + 1 moves while frame f runs), runs its
stages in order as their inputs arrive and Isends what others read; a frame's sends may still be in flight while
the next frame runs (frames pipeline across ranks, at most ``--window`` frames in flight: a window smaller than
the chain of ranks leaves ranks idle, measured 22 vs 29 frames/s over 8 ranks; a rank's own sends at most
``--send-window`` frames back). Waiting is Test + sleep with a
deadline per buffer (a spinning Waitall starves a neighbour on a shared core). Rank 0, the head, feeds the frames
(``--inputs`` .npy, else seeded random int8) and collects the output; it prints one ``EDGEPLAN-MPI-SUMMARY
{json}`` line with every rank's times. Any failure prints one ``EDGEPLAN-RANK-ERROR {json}`` line naming rank,
host, stage and frame, then aborts the job.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import socket
import sys
import time
from pathlib import Path

import numpy as np

from edgeplan.distributed.rows import Rows, keep

ERROR = "EDGEPLAN-RANK-ERROR"
SUMMARY = "EDGEPLAN-MPI-SUMMARY"
MAX_BUFFER_BYTES = 1 << 31  # one tensor between ranks; a larger one in tables.json is refused before allocating
_STAGE_FILE = re.compile(r"^int8/s\d{1,6}\.tflite$")
_DTYPES = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32, "FLOAT32": np.float32}


class RankError(Exception):
    pass


# ------------------------------------------------------------------------------------------------ tables
def load_tables(d: Path, size: int) -> tuple[dict, str]:
    """tables.json, validated as untrusted input (it names files and sizes); returns it and its sha256."""
    raw = (d / "tables.json").read_bytes()
    return parse_tables(raw, size), hashlib.sha256(raw).hexdigest()


def parse_tables(raw: bytes, size: int | None = None) -> dict:
    """tables.json's bytes validated (the job's ``size`` ranks, when given; pull checks a bundle's before
    fetching what its ranks name). Raises RankError naming the field."""
    try:
        t = json.loads(raw)
        ranks, stages, buffers = t["ranks"], t["stages"], t["buffers"]
        size = len(ranks) if size is None else size
        if len(ranks) != size:
            raise RankError(f"tables.json has {len(ranks)} ranks, the job {size}: launch with its rankfile")
        if type(t["head"]) is not int or not 0 <= t["head"] < size:
            raise RankError(f"tables.json: head {t['head']!r} is not one of its {size} ranks")
        for r, x in enumerate(ranks):
            if x["rank"] != r or not isinstance(x["device"], str) or not isinstance(x["host"], str) \
                    or not all(isinstance(k, int) and 0 <= k < len(stages) for k in x["stages"]):
                raise RankError(f"tables.json rank {r}: bad rank, device, host or stages")
        for k, s in enumerate(stages):
            if s["index"] != k or not 0 <= s["rank"] < size or not _STAGE_FILE.match(s["int8"]):
                raise RankError(f"tables.json stage {k}: bad index, rank or file {s.get('int8')!r}")
            if not (isinstance(s["int8_sha256"], str) and len(s["int8_sha256"]) == 64):
                raise RankError(f"tables.json stage {k}: no sha256")
        for name, b in buffers.items():
            if not (0 <= b["sender"] < size and all(0 <= r < size for r in b["receivers"])
                    and b["dtype"] in _DTYPES and all(isinstance(x, int) and 0 < x < 1 << 31 for x in b["shape"])
                    and isinstance(b["tag"], int) and 0 <= b["tag"] < 32767):
                raise RankError(f"tables.json buffer {name!r}: bad sender, receivers, dtype, shape or tag")
            size_bytes = math.prod(b["shape"]) * np.dtype(_DTYPES[b["dtype"]]).itemsize
            if size_bytes != b.get("nbytes") or size_bytes > MAX_BUFFER_BYTES:
                raise RankError(f"tables.json buffer {name!r}: shape {b['shape']} is {size_bytes} bytes, its nbytes "
                                f"says {b.get('nbytes')!r} (at most {MAX_BUFFER_BYTES} allowed)")
        for side in ("input", "output"):
            if t[side]["dtype"] not in _DTYPES or not all(isinstance(x, int) and x > 0 for x in t[side]["shape"]):
                raise RankError(f"tables.json {side}: bad dtype or shape")
        if "axis" in t:
            _check_tiles(t)
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise RankError(f"tables.json is malformed ({type(e).__name__}: {e})") from None
    return t


def _rows(r, where: str) -> None:
    if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and 0 <= r[0] < r[1] < 1 << 24):
        raise RankError(f"tables.json {where}: bad rows {r!r}")


def _check_tiles(t: dict) -> None:
    """A spatial split's extra fields (``surgery/spatial``): rows are ordered ints, shapes match them."""
    axis = t["axis"]
    if axis not in (1, 2):
        raise RankError(f"tables.json: axis {axis!r} is neither 1 (H) nor 2 (W)")
    for name, b in t["buffers"].items():
        if "rows" in b:
            _rows(b["rows"], f"buffer {name!r}")
            if not isinstance(b["tensor"], str) or b["shape"][axis] != b["rows"][1] - b["rows"][0]:
                raise RankError(f"tables.json buffer {name!r}: {b['shape']} is not rows {b['rows']} of a tensor")
    for s in t["stages"]:
        tile = s.get("tile")
        if tile is None:
            continue
        for name, x in tile["inputs"].items():
            _rows(x["rows"], f"stage {s['index']} input {name!r}")
            if x["shape"][axis] != x["rows"][1] - x["rows"][0] or not all(isinstance(v, int) and v > 0
                                                                         for v in x["shape"]):
                raise RankError(f"tables.json stage {s['index']} input {name!r}: shape {x['shape']} is not its rows")
        for name, o in tile["outputs"].items():
            _rows(o["keep"], f"stage {s['index']} output {name!r}")
            if not (isinstance(o["offset"], int) and o["offset"] <= o["keep"][0]
                    and o["keep"][1] - o["offset"] <= o["shape"][axis]):
                raise RankError(f"tables.json stage {s['index']} output {name!r}: rows {o['keep']} are not in the "
                                f"tile's {o['shape'][axis]} rows from {o['offset']}")


def _array(spec: dict) -> np.ndarray:
    return np.empty(spec["shape"], _DTYPES[spec["dtype"]])


class Stage:
    def __init__(self, d: Path, s: dict, threads: int, tables: dict, builtin: bool = False):
        """``builtin``: LiteRT's builtin kernels instead of its default (XNNPACK), as the bundle's self-tests were
        computed; XNNPACK may round an int8 op otherwise."""
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        data = (d / s["int8"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != s["int8_sha256"]:
            raise RankError(f"{s['int8']}: sha256 differs from tables.json")
        self.index = s["index"]
        self.tile = s.get("tile")
        self.it = Interpreter(model_content=data, num_threads=threads, experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin else OpResolverType.AUTO))
        if self.tile is not None:  # a tile of a spatial split: its input is the tile's rows plus halo
            for x in self.it.get_input_details():
                if x["name"] in self.tile["inputs"]:
                    self.it.resize_tensor_input(x["index"], self.tile["inputs"][x["name"]]["shape"])
        self.it.allocate_tensors()
        self.inputs = {x["name"]: x["index"] for x in self.it.get_input_details()}
        self.outputs = {x["name"]: x["index"] for x in self.it.get_output_details()}
        if sorted(self.inputs) != sorted(s["inputs"]) or sorted(self.outputs) != sorted(s["outputs"]):
            raise RankError(f"{s['int8']}: its tensors are not those tables.json names")
        known = {**tables["buffers"], tables["input"]["name"]: tables["input"]}
        if self.tile is not None:
            known = {**known, **self.tile["inputs"], **self.tile["outputs"]}
        for x in self.it.get_input_details() + self.it.get_output_details():
            spec = known.get(x["name"])
            if spec is not None and (list(x["shape"]) != spec["shape"]
                                     or ("dtype" in spec and x["dtype"] != _DTYPES[spec["dtype"]])):
                raise RankError(f"{s['int8']}: tensor {x['name']!r} is {list(x['shape'])} {x['dtype'].__name__}, "
                                f"tables.json says {spec['shape']} {spec.get('dtype', '')}")


# ------------------------------------------------------------------------------------------------ running
class Rank:
    def __init__(self, comm, d: Path, deadline_s: float, sleep_s: float = 5e-5, max_sleep_s: float = 1e-3,
                 fault: str | None = None, builtin: bool = False, ahead: int = 1, progress_s: float = 2e-3):
        from concurrent.futures import ThreadPoolExecutor

        self.comm, self.d, self.fault = comm, d, fault
        self.max_sleep_s = max_sleep_s
        self.progress_s = progress_s
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="invoke")
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.host = socket.gethostname()
        self.deadline_s, self.sleep_s = deadline_s, sleep_s
        self.where = {"stage": None, "frame": None}
        self.tables, self.revision = self.load_tables(d)
        revisions = comm.allgather(self.revision)
        if len(set(revisions)) > 1:
            others = [r for r, v in enumerate(revisions) if v != self.revision]
            raise RankError(f"ranks {others} run another revision of the split (tables.json sha256 "
                            f"{revisions[others[0]][:12]} vs {self.revision[:12]} here): refusing mixed revisions")
        me = self.tables["ranks"][self.rank]
        base = _status()  # the process before any model: interpreter, numpy, LiteRT, Open MPI
        self.base_rss_bytes = base["VmRSS"]
        self.base_anon_bytes, self.base_file_bytes = base["RssAnon"], base["RssFile"]
        self.stages = [self.stage(s, max(1, len(me["slots"])), builtin)
                       for s in self.tables["stages"] if s["rank"] == self.rank]
        self.peak_anon_bytes = self.file_bytes = 0
        self.sample_memory()
        self.recv = {n: b for n, b in self.tables["buffers"].items() if self.rank in b["receivers"]}
        self.sends_of: dict[str, list[dict]] = {}  # tensor -> the buffers this rank sends of it (whole or rows)
        for n, b in self.tables["buffers"].items():
            if b["sender"] == self.rank:
                self.sends_of.setdefault(b.get("tensor", n), []).append(b)
        self.axis = self.tables.get("axis")  # a spatial split: tensors travel as row bands along this axis
        self.busy_s = self.wait_s = self.invoke_cpu_s = 0.0
        self.ahead = ahead
        self.posted: dict[int, dict] = {}  # frame -> its receives posted: name -> (request, buffer, sender)
        self.sent_bytes = 0

    def sample_memory(self) -> None:
        """Note the private (anonymous) resident memory now, keeping its largest sample, and the file-backed pages
        (code of the libraries loaded, LiteRT's paged in by the first interpreter: shared by the processes of a
        host, yet in each one's RSS)."""
        now = _status()
        self.peak_anon_bytes = max(self.peak_anon_bytes, now["RssAnon"])
        self.file_bytes = now["RssFile"]

    def load_tables(self, d: Path) -> tuple[dict, str]:
        """The split's tables and the revision every rank must share (a float rank, bench side, reads them as
        float tensors)."""
        return load_tables(d, self.size)

    def stage(self, s: dict, threads: int, builtin: bool) -> Stage:
        return Stage(self.d, s, threads, self.tables, builtin)

    def _run(self, st: Stage, live: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Invoke on the worker thread (LiteRT releases the GIL) while this thread drives MPI's progress: with no
        MPI call during a stage, a large message in flight (rendezvous over TCP) would not move until it ends."""
        for name, ix in st.inputs.items():
            st.it.set_tensor(ix, live[name])
        job = self.worker.submit(self._invoke, st.it)
        while True:
            try:
                job.result(timeout=self.progress_s)
                break
            except TimeoutError:
                self.comm.Iprobe()
        return {name: st.it.get_tensor(ix).copy() for name, ix in st.outputs.items()}

    def _invoke(self, it) -> None:
        c0 = time.thread_time()
        it.invoke()
        self.invoke_cpu_s += time.thread_time() - c0

    def _wait(self, req, what: str) -> None:
        """Test + sleep until ``req`` completes or the deadline passes (a process failure raises from ``Test``
        and is named in ``main`` from ULFM's list of failed ranks)."""
        t0 = time.perf_counter()
        end = t0 + self.deadline_s
        nap = self.sleep_s
        while not req.Test():
            if time.perf_counter() > end:
                raise RankError(f"waited {self.deadline_s:g} s for {what}")
            time.sleep(nap)
            nap = min(nap * 2, self.max_sleep_s)  # back off: polling burns a quota-limited host's CPU
        self.wait_s += time.perf_counter() - t0

    def _post(self, f: int) -> None:
        """Post the receives of frame ``f`` once: a frame's are posted while the frames before it still run, so a
        sender's data (a rendezvous over TCP, beyond the eager limit) moves during this rank's stages instead of
        after them."""
        from mpi4py import MPI

        if f in self.posted:
            return
        reqs = {}
        for name, b in self.recv.items():
            buf = _array(b)
            reqs[name] = (self.comm.Irecv([buf, MPI.BYTE], source=b["sender"], tag=b["tag"]), buf, b["sender"])
        self.posted[f] = reqs

    def frame(self, f: int, x: np.ndarray | None, pending: list, frames: int) -> np.ndarray | None:
        from mpi4py import MPI

        self.where["frame"] = f
        for g in range(f, min(f + 1 + self.ahead, frames)):
            self._post(g)
        reqs = self.posted.pop(f)
        live: dict[str, np.ndarray] = {}
        rows = Rows(self.axis) if self.axis else None

        def publish(values: dict[str, np.ndarray], kept: dict | None = None) -> None:
            for name, v in values.items():
                if kept and name in kept:  # a tile's output: only the rows it got right are held
                    rows.add(name, kept[name]["keep"][0], keep(v, kept[name], self.axis))
                else:
                    live[name] = v
                    if rows is not None:
                        rows.add(name, 0, v)
                for b in self.sends_of.get(name, []):
                    data = rows.take(name, *b["rows"]) if "rows" in b else v
                    self.sent_bytes += data.nbytes * len(b["receivers"])
                    for dst in b["receivers"]:
                        pending.append((f, self.comm.Isend([data, MPI.BYTE], dest=dst, tag=b["tag"]), data, dst))

        def arrive(tensor: str) -> None:
            """Wait for every band of ``tensor`` sent to this rank and hold it."""
            for name in [n for n in reqs if self.recv[n].get("tensor") == tensor]:
                req, buf, src = reqs.pop(name)
                self._wait(req, f"rows {self.recv[name]['rows']} of {tensor!r} from rank {src}")
                rows.add(tensor, self.recv[name]["rows"][0], buf)

        if x is not None:
            publish({self.tables["input"]["name"]: x})
        for st in self.stages:
            self.where["stage"] = st.index
            given: dict[str, np.ndarray] = {}
            for name in st.inputs:
                if st.tile is not None and name in st.tile["inputs"]:
                    arrive(name)
                    given[name] = rows.take(name, *st.tile["inputs"][name]["rows"])
                    continue
                if name not in live:
                    req, buf, src = reqs.pop(name)
                    self._wait(req, f"buffer {name!r} from rank {src}")
                    live[name] = buf
                given[name] = live[name]
            if st is self.stages[0]:
                _fault(self.fault, self.rank, f)
            t0 = time.perf_counter()
            out = self._run(st, given)
            self.busy_s += time.perf_counter() - t0
            publish(out, st.tile["outputs"] if st.tile is not None else None)
        self.where["stage"] = None
        result = None
        if self.rank == self.tables["head"]:
            name = self.tables["output"]["name"]
            if name not in live and rows is not None:  # a spatial region that ends at the output: assembled here
                arrive(name)
                live[name] = rows.take(name, 0, self.tables["output"]["shape"][self.axis])
            # the output made elsewhere is collected later (``collect``): waiting for it here would stop the head
            # from feeding frame f + 1 until frame f left the last rank, and nothing would pipeline
            if name in live:
                result = (live[name], None)
            else:
                req, buf, _ = reqs.pop(name)
                result = (buf, req)
        for name, (req, buf, src) in reqs.items():  # buffers this rank receives but no stage of it read
            self._wait(req, f"buffer {name!r} from rank {src}")
        return result

    def collect(self, outs: list, upto: int, done: list, t0: float) -> None:
        """Wait for the head's outputs of every frame up to ``upto``, and take those already in without waiting
        (each one's completion time recorded when the head sees it)."""
        src = self.tables["output"].get("rank", self.rank)
        while len(done) < len(outs):
            f = len(done)
            buf, req = outs[f]
            if f > upto and req is not None and not req.Test():
                break
            if req is not None:
                self.where["frame"] = f
                self._wait(req, f"the output of frame {f} from rank {src}")
            done.append(time.perf_counter() - t0)

    def drain(self, pending: list, keep_frames_after: int) -> None:
        while pending and pending[0][0] <= keep_frames_after:
            f, req, _, dst = pending.pop(0)
            self._wait(req, f"rank {dst} to receive frame {f}'s data")


def _inputs(tables: dict, path: str | None, frames: int, seed: int) -> np.ndarray:
    spec = tables["input"]
    dt = _DTYPES[spec["dtype"]]
    if path:
        xs = np.load(path, allow_pickle=False)
        if xs.dtype != dt or list(xs.shape[1:]) != spec["shape"] or not len(xs):
            raise RankError(f"{path}: expected frames of {spec['shape']} {spec['dtype']}, got {list(xs.shape)} {xs.dtype}")
        return xs
    from edgeplan.quantize.litert import random_value

    n = min(frames, 16)  # frames cycle through these (a long run needs no memory per frame)
    return random_value((n, *spec["shape"]), dt, np.random.default_rng(seed))


def _status() -> dict[str, int]:
    """This process's resident set now, bytes: all of it (VmRSS), its private anonymous memory (RssAnon) and its
    file-backed pages (RssFile); zeros off Linux."""
    out = dict.fromkeys(("VmRSS", "RssAnon", "RssFile"), 0)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in out:
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def _peak_rss() -> int:
    """This rank's peak resident set (VmHWM), bytes."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _failed_ranks(comm, e: Exception) -> list[int]:
    """The ranks ULFM reports failed, when ``e`` is MPI's process-failure error."""
    from mpi4py import MPI

    if not (isinstance(e, MPI.Exception) and e.Get_error_class() == MPI.ERR_PROC_FAILED):
        return []
    try:
        g = comm.Get_failed()
        return [r for r in MPI.Group.Translate_ranks(g, list(range(g.Get_size())), comm.Get_group())
                if r != MPI.UNDEFINED]
    except MPI.Exception:
        return []


def _fault(spec: str | None, rank: int, frame: int) -> None:
    """``--fault RANK:FRAME:raise|exit|kill|hang``: make one rank fail on purpose at a frame (how a deployment
    fails is tested with it): raise an exception, exit without a word, be killed (SIGKILL), or stop answering."""
    if not spec:
        return
    r, f, kind = spec.split(":")
    if int(r) == rank and int(f) == frame:
        import os
        import signal

        if kind == "exit":
            os._exit(3)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            time.sleep(3600)
        raise RankError(f"fault injected (--fault {spec})")


def steady_fps(ended: list[float], skip: int) -> float | None:
    """Frames per second after the first ``skip`` (the pipeline filling), from the times a rank finished its part
    of each frame (at least one interval is kept); None for a single frame. The rank that sends the output
    measures the pipeline's exit: the head sees outputs only between its own stages."""
    skip = min(skip, len(ended) - 2)
    if skip < 0 or ended[-1] <= ended[skip]:
        return None
    return (len(ended) - 1 - skip) / (ended[-1] - ended[skip])


def _on_this_host(template: str) -> Path:
    """A path template of the ranks' options with ``{hostname}`` replaced by this host's name."""
    return Path(template.replace("{hostname}", socket.gethostname()))


def _differ(got: np.ndarray, path: str) -> list[int]:
    """The frames whose output is not exactly the expected one (shape and values)."""
    want = np.load(path, allow_pickle=False)
    return [k for k, y in enumerate(got) if k >= len(want) or y.shape != want[k].shape or not np.array_equal(y, want[k])]


def _roll_back(me: Rank, split_dir: Path, template: str) -> dict | None:
    """This device's pull destination back to its previous revision, when the revision the ranks ran is still its
    active one; done by the device's lowest rank only (a device may hold several). What was done, or why not."""
    from edgeplan.errors import EdgeplanError
    from edgeplan.runtime.pull import rollback

    device = me.tables["ranks"][me.rank]["device"]
    if min(r["rank"] for r in me.tables["ranks"] if r["device"] == device) != me.rank:
        return None
    dest = _on_this_host(template)
    done = {"device": device, "dest": str(dest)}
    if (dest / "current").resolve() not in split_dir.resolve().parents:
        return {**done, "error": "the revision run is not the active one there; left as it is"}
    try:
        was, now = rollback(dest)
    except EdgeplanError as e:
        return {**done, "error": str(e)}
    return {**done, "from": was.revision, "to": now.revision}


def main(argv: list[str] | None = None, rank_type: type[Rank] = Rank) -> int:
    """A rank's life; ``rank_type`` runs the stages (bench/float_rank.py runs the float sub-models)."""
    from mpi4py import MPI

    p = argparse.ArgumentParser(prog="edgeplan.distributed.rank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("split_dir", help="a split (tables.json, int8/), the same on every host")
    p.add_argument("--frames", type=int, default=10, help="frames to run (default 10)")
    p.add_argument("--inputs", help="head: an .npy of int8 frames, cycled (default: 16 seeded random ones)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="head: write the outputs here (.npy)")
    p.add_argument("--deadline", type=float, default=30.0, help="seconds a rank waits for one buffer (default 30)")
    p.add_argument("--window", type=int, help="frames in flight: the head feeds frame f once frame f - WINDOW came out, "
                   "and a rank's sends of a frame WINDOW back must be done (default: twice the ranks, at least 4; "
                   "fewer than the ranks of a chain leaves ranks idle)")
    p.add_argument("--rank-dir", help="where this host keeps the split when not at SPLIT_DIR; {hostname} is replaced "
                   "by the host's name (emulated hosts sharing one filesystem, each with its own pulled revision)")
    p.add_argument("--builtin-kernels", action="store_true", help="LiteRT's builtin kernels instead of XNNPACK (the "
                   "kernels the bundle's self-tests were computed with)")
    p.add_argument("--expected", help="head: an .npy of the outputs the frames must give exactly (self-tests); the "
                   "verdict goes to every rank")
    p.add_argument("--rollback-dest", help="with --expected: where this host pulled the revision ({hostname} is "
                   "replaced); when an output differs, every device rolls back there to its previous revision")
    p.add_argument("--ahead", type=int, default=1, help="frames ahead whose receives are posted (default 1): their "
                   "data moves while this rank still runs the frame before")
    p.add_argument("--send-window", type=int, help="a rank runs frame f once its sends of frame f - SEND_WINDOW are "
                   "done (default: AHEAD + 2, a receiver posting AHEAD frames ahead; each rank then holds at most that "
                   "many frames of its outputs: a fast first rank had held a whole window's, DenseNet-121's head "
                   "peaked at 90 MB, with 3 at 77 MB, at the same throughput)")
    p.add_argument("--fault", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    split_dir = _on_this_host(args.rank_dir) if args.rank_dir else Path(args.split_dir)
    comm = MPI.COMM_WORLD
    comm.Set_errhandler(MPI.ERRORS_RETURN)  # a lost peer raises here (and is named), not aborts inside MPI
    me: Rank | None = None
    try:
        me = rank_type(comm, split_dir, args.deadline, fault=args.fault, builtin=args.builtin_kernels, ahead=args.ahead)
        head = me.rank == me.tables["head"]
        xs = _inputs(me.tables, args.inputs, args.frames, args.seed) if head else None
        frames = args.frames
        window = max(4, 2 * me.size) if args.window is None else args.window
        sends = min(window, args.ahead + 2 if args.send_window is None else args.send_window)
        comm.Barrier()
        t0 = time.perf_counter()
        c0 = time.process_time()
        outs, pending, done, ended = [], [], [], []
        for f in range(frames):
            y = me.frame(f, xs[f % len(xs)] if head else None, pending, frames)
            ended.append(time.perf_counter() - t0)
            if f & (f + 1) == 0:  # after frames 1, 2, 4, 8, ... (reading /proc costs ~20 us)
                me.sample_memory()
            if head:
                outs.append(y)
                me.collect(outs, f - window, done, t0)
            me.drain(pending, f - sends)
        if head:
            me.collect(outs, frames, done, t0)
        me.drain(pending, frames)
        wall = time.perf_counter() - t0
        me.sample_memory()
        stats = {"rank": me.rank, "host": me.host, "wall_s": wall, "busy_s": me.busy_s, "wait_s": me.wait_s,
                 "cpu_s": time.process_time() - c0, "invoke_cpu_s": me.invoke_cpu_s, "stages": [s.index for s in me.stages],
                 "peak_rss_bytes": _peak_rss(), "base_rss_bytes": me.base_rss_bytes, "sent_bytes": me.sent_bytes,
                 "peak_anon_bytes": me.peak_anon_bytes, "base_anon_bytes": me.base_anon_bytes,
                 "file_bytes": me.file_bytes, "base_file_bytes": me.base_file_bytes,
                 "steady_fps": steady_fps(ended, skip=me.size)}
        if args.expected:  # a self-test: the head's verdict to every rank, each device rolling back on a failure
            differ = _differ(np.stack([buf for buf, _ in outs]), args.expected) if head else None
            differ = comm.bcast(differ, root=me.tables["head"])
            stats["selftest_differs"] = differ
            if differ and args.rollback_dest:
                stats["rolled_back"] = _roll_back(me, split_dir, args.rollback_dest)
        every = comm.gather(stats, root=me.tables["head"])
        if head:
            if args.out:
                np.save(args.out, np.stack([buf for buf, _ in outs]))
            out_rank = me.tables["output"].get("rank", me.rank)
            summary = {"frames": frames, "wall_s": wall, "fps": frames / wall if wall else None, "frame_done_s": done,
                       "steady_fps": every[out_rank]["steady_fps"], "revision": me.revision, "ranks": every}
            print(f"{SUMMARY} {json.dumps(summary)}", flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - every failure is reported in one line, then the job is aborted
        where = dict(me.where) if me is not None else {"stage": None, "frame": None}
        rank = comm.Get_rank()
        lost = _failed_ranks(comm, e)
        if lost and me is not None:  # ULFM: name the process that failed, whichever MPI call noticed it
            k = lost[0]
            e = RankError(f"lost rank {k} ({me.tables['ranks'][k]['host']}) while working: MPI_ERR_PROC_FAILED")
        print(f"{ERROR} " + json.dumps({"rank": rank, "host": socket.gethostname(), **where,
                                        "error": f"{type(e).__name__}: {e}" if not isinstance(e, RankError) else str(e)}),
              file=sys.stderr, flush=True)
        if isinstance(e, RankError) and str(e).startswith("waited "):
            # a deadline says only whom this rank waited on; the ranks waiting further up the chain report within
            # about one deadline, and an abort now would kill them first (the launcher ends the job after that)
            time.sleep(args.deadline)
        comm.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
