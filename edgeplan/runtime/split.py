"""A multi-device split travelling in a bundle (``plans["spatial"]``: ADaPS tiles; ``plans["autodice"]``: AutoDiCE
stages of consecutive layers; either run as MPI ranks): which of its blobs a device fetches, and the check a device
runs on its share before the revision becomes current.

A split's files are ``deployments/<name>/<dir>/`` (``PLANNERS``): ``tables.json``, ``rankfile``, ``hostfile``, the
planner's summary (``spatial.json``, ``split.json``) and one ``int8/s<k>.tflite`` per stage. ``tables.json`` is a
signed blob (the manifest holds its sha256) and names the device of every rank; it is read and validated before
anything else is fetched. A device holds the split's common files and the stages of its own ranks, never another
rank's. The head (the device of rank 0, where frames enter and leave) also holds the rest of the revision (models,
self-tests, plans); a device of another rank holds the split only. ``share.json`` in the revision directory records
what this device holds.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeplan.errors import BundleVerificationError


@dataclass(frozen=True)
class Kind:
    """Where a planner's split lives in the revision: ``deployments/<name>/<dir>/``, beside its plan
    ``deployments/<name>/plans/<planner>.json``; ``summary`` is its own file of the split, ``record`` the key of the
    plan naming the split's tables by sha256."""

    dir: str
    summary: str
    record: str


# planners whose plan is a split run as MPI ranks (a deployment runs at most one)
PLANNERS = {"spatial": Kind("spatial", "spatial.json", "tiles"), "autodice": Kind("multidevice", "split.json", "split")}
SHARE_FILE = "share.json"
COMMON = ("tables.json", "rankfile", "hostfile")


@dataclass(frozen=True)
class Share:
    """What of a split one device holds."""

    planner: str
    dir: str  # the split's directory inside the revision (a blob-name prefix)
    device: str | None  # None: every rank (a pull by deployment, not by device)
    ranks: tuple[int, ...]
    head: bool  # holds rank 0: the rest of the revision too, and starts the job
    stages: dict  # every stage file of the split (relative to ``dir``) -> the rank that runs it

    def wants(self, name: str) -> bool:
        """Whether blob ``name`` is this device's: outside the split only for the head; of the split, its common
        files and the stages of its own ranks."""
        if not name.startswith(self.dir + "/"):
            return self.head
        rank = self.stages.get(name[len(self.dir) + 1:])
        return rank is None or rank in self.ranks


def found(manifest) -> tuple[str, str] | None:
    """(planner, split directory) of the revision's split, None without one."""
    for planner, kind in PLANNERS.items():
        if planner in manifest.plans:
            return planner, f"deployments/{manifest.deployment}/{kind.dir}"
    return None


def tables_of(raw: bytes, manifest, planner: str, split_dir: str) -> dict:
    """The split's tables.json validated as untrusted input, every stage it names a blob of the revision with the
    stage's sha256 (a stage file the manifest does not list, or lists with other bytes, is refused)."""
    from edgeplan.distributed.rank import RankError, parse_tables

    where = f"{manifest.deployment} revision {manifest.revision}: {split_dir}/tables.json"
    try:
        tables = parse_tables(raw)
    except RankError as e:
        raise BundleVerificationError(f"{where}: {e}; refused") from None
    blobs = {b.name: b for b in manifest.blobs}
    for s in tables["stages"]:
        ref = blobs.get(f"{split_dir}/{s['int8']}")
        if ref is None or ref.sha256 != s["int8_sha256"]:
            raise BundleVerificationError(f"{where}: stage {s['index']}'s {s['int8']} is not a blob of the revision "
                                          "with the sha256 the tables give; refused")
    for name in (*COMMON, PLANNERS[planner].summary):
        if f"{split_dir}/{name}" not in blobs:
            raise BundleVerificationError(f"{where}: the revision has no {split_dir}/{name}; refused")
    return tables


def share_of(planner: str, split_dir: str, tables: dict, device_id: str | None) -> Share:
    """This device's share: the ranks the tables give ``device_id`` (every rank when None). A device with no rank
    gets an empty share (the caller refuses it)."""
    ranks = [r["rank"] for r in tables["ranks"] if device_id is None or r["device"] == device_id]
    return Share(planner, split_dir, device_id, tuple(ranks), tables["head"] in ranks,
                 {s["int8"]: s["rank"] for s in tables["stages"]})


def write(rev_dir: Path, share: Share) -> None:
    (Path(rev_dir) / SHARE_FILE).write_text(json.dumps(asdict(share), indent=2))


def read(rev_dir: Path) -> Share | None:
    """This device's share of the revision's split (written at pull), None for a revision without one."""
    path = Path(rev_dir) / SHARE_FILE
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    return Share(d["planner"], d["dir"], d["device"], tuple(d["ranks"]), d["head"], d["stages"])


def check(rev_dir: Path, share: Share) -> None:
    """Every stage of this device's ranks loads as its rank loads it (sha256, tensor names, shapes and dtypes
    against tables.json, a tile's input resized to its rows): raises RankError naming the stage."""
    from edgeplan.distributed.rank import Stage, parse_tables

    d = Path(rev_dir) / share.dir
    tables = parse_tables((d / "tables.json").read_bytes())
    for s in tables["stages"]:
        if s["rank"] in share.ranks:
            Stage(d, s, 1, tables, builtin=True)


def head_dir(dest: Path) -> tuple[Path, Path, Share]:
    """(revision directory, split directory, share) of the active revision of a pull destination, which must hold
    the split's head (rank 0 starts the job)."""
    from edgeplan.errors import EdgeplanError
    from edgeplan.runtime.pull import active

    found_ = active(dest)
    if found_ is None:
        raise EdgeplanError(f"{dest}: nothing pulled yet (`edgeplan-runtime pull`)")
    rev_dir, manifest = found_
    share = read(rev_dir)
    if share is None:
        raise EdgeplanError(f"{dest}: {manifest.deployment} revision {manifest.revision} has no multi-device split")
    if not share.head:
        raise EdgeplanError(f"{dest}: this device holds ranks {list(share.ranks)} of the split, not its head (rank 0); "
                            "start the job on the head")
    return rev_dir, rev_dir / share.dir, share


def selftests(rev_dir: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The revision's self-tests as the split's frames: (int8 inputs stacked, the whole int8 model's expected
    outputs stacked, their input blob names)."""
    from edgeplan.runtime.model import quantize_input
    from edgeplan.runtime.pull import read_manifest

    (entry,) = read_manifest(rev_dir).models  # a split serves one model (the planner refuses more)
    xs = [quantize_input(np.load(rev_dir / t.input, allow_pickle=False), entry.input) for t in entry.selftests]
    want = [np.load(rev_dir / t.expected, allow_pickle=False) for t in entry.selftests]
    return np.stack(xs), np.stack(want), [t.input for t in entry.selftests]
