"""Pulling a deployment revision onto a device: resolve, verify (signatures, then every name, size and type:
``bundle/validate``), fetch (resumable, delta), assemble in a staging directory, health-check there, then
activate atomically. A revision that fails anything, of any kind, never becomes ``current``.

Layout under DEST::

    blobs/sha256/<hex>              every blob held (content-addressed: a new revision fetches only new ones)
    revisions/<deployment>/<rev>/   manifest.json, latest (the signed bytes), and the bundle's files by name
                                    (hard links into blobs/)
    current -> revisions/...        the active revision (a symlink swapped atomically by rename)
    previous -> revisions/...       the one before it (rollback target)
    state.json                      the highest revision activated per deployment (anti-rollback)

numpy, ai-edge-litert, cryptography and the standard library only (boto3 for s3:// stores).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeplan.bundle import keys, validate
from edgeplan.bundle.manifest import Manifest, blob_key, canonical
from edgeplan.bundle.publish import read_latest, retrying
from edgeplan.errors import BundleVerificationError, EdgeplanError, StoreKeyNotFound
from edgeplan.runtime import split
from edgeplan.store.faults import step


class PullRefused(BundleVerificationError):
    """A revision the device must not activate: older than the active one, for another device class, or
    compiled by the emulated compiler for a device with a real Edge TPU."""


class HealthCheckFailed(EdgeplanError):
    """A pulled revision's self-tests did not give their expected outputs, or could not run (not activated)."""


@dataclass(frozen=True)
class PullResult:
    deployment: str
    revision: int
    previous: int | None
    activated: bool  # False: that revision was already active
    blobs: int
    fetched_blobs: int  # distinct contents fetched (held blobs are not fetched again)
    fetched_bytes: int  # bytes transferred (a resumed download counts only what it fetched)
    path: Path


def device_record(store, device_id: str, trusted: dict) -> dict:
    """``devices/<id>.json`` with its signature checked: {device_id, deployment, device_class, key_id}."""
    validate.component(device_id, "--device-id", "device id")
    key = f"devices/{device_id}.json"
    where = f"{store.uri}/{key}"
    try:
        doc = json.loads(retrying(f"read {key}", lambda: store.get(key)))
    except StoreKeyNotFound:
        raise EdgeplanError(f"{store.uri}: no {key}; is the device {device_id!r} in the fleet registry, and its "
                            "deployment published?") from None
    except (ValueError, RecursionError) as e:
        raise BundleVerificationError(f"{where}: not a device record ({e})") from None
    if not isinstance(doc, dict):
        raise BundleVerificationError(f"{where}: not a device record (a JSON {type(doc).__name__})")
    signature = doc.pop("signature", "")
    keys.verify(trusted, doc.get("key_id", ""), canonical(doc), signature, where)
    validate.device(doc, where)
    if doc["device_id"] != device_id:
        raise BundleVerificationError(f"{where}: is the record of device {doc['device_id']!r}; refused")
    return doc


def detect_accelerator() -> str:
    """``edgetpu-usb`` when the libedgetpu delegate loads (a real Edge TPU), else ``none``.
    EDGEPLAN_ACCELERATOR overrides (what a device's provisioning would pin)."""
    forced = os.environ.get("EDGEPLAN_ACCELERATOR")
    if forced:
        return forced
    import ctypes

    try:
        ctypes.CDLL("libedgetpu.so.1")  # absent: no Edge TPU runtime (and no delegate noise on stderr)
    except OSError:
        return "none"
    try:
        from ai_edge_litert.interpreter import load_delegate

        load_delegate("libedgetpu.so.1")  # fails without an attached Edge TPU
        return "edgetpu-usb"
    except (ValueError, OSError, ImportError):
        return "none"


def _state(dest: Path) -> dict:
    path = dest / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {"highest": {}}


def _write_state(dest: Path, state: dict) -> None:
    tmp = dest / "state.json.tmp"
    step("write state.json.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    step("rename state.json")
    tmp.replace(dest / "state.json")


def _link(dest: Path, name: str, target: Path) -> None:
    """Point ``dest/name`` at ``target`` atomically (a new symlink renamed over the old one)."""
    tmp = dest / f".{name}.{os.getpid()}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    step(f"symlink {name}")
    tmp.symlink_to(os.path.relpath(target, dest))
    step(f"rename {name}")
    tmp.replace(dest / name)


def read_manifest(rev_dir: Path) -> Manifest:
    """The manifest of a pulled revision directory (verified when it was pulled)."""
    return Manifest.from_json(json.loads((Path(rev_dir) / "manifest.json").read_text()))


def active(dest: Path) -> tuple[Path, Manifest] | None:
    """The active revision's directory and manifest, None before a pull."""
    link = Path(dest) / "current"
    if not link.is_symlink():
        return None
    path = link.resolve()
    return path, read_manifest(path)


def pull(store, dest: Path, trusted: dict, **options) -> PullResult:
    """Fetch and activate the latest revision of the device's deployment (see the module docstring); options:
    device_id, deployment, device_class, allow_older, accelerator, health_check, progress. Raises (and leaves the
    active revision as it was) on anything that fails verification, and on a full disk or an unwritable
    ``dest`` with one line (EdgeplanError) that says so."""
    dest = Path(dest)
    try:
        return _pull(store, dest, trusted, **options)
    except OSError as e:  # a full disk, a read-only or vanished dest: the active revision stays
        try:
            held = active(dest)
        except (OSError, ValueError, EdgeplanError):
            held = None
        still = f"revision {held[1].revision} of {held[1].deployment} stays active" if held else "nothing is active"
        hint = "; free space and pull again (what was fetched is kept)" if e.errno in (errno.ENOSPC,
                                                                                        errno.EDQUOT) else ""
        raise EdgeplanError(f"{e.filename or dest}: {e.strerror or e} while pulling; {still}{hint}") from None


def _pull(store, dest: Path, trusted: dict, *, device_id: str | None = None, deployment: str | None = None,
          device_class: str | None = None, allow_older: bool = False, accelerator: str | None = None,
          health_check: bool = True, progress=None) -> PullResult:
    if not trusted:
        raise BundleVerificationError("no trusted public keys: a device verifies every revision it runs "
                                      "(--trusted DIR or FILE.pub)")
    if device_id is not None:
        record = device_record(store, device_id, trusted)
        if deployment is not None and deployment != record["deployment"]:
            raise PullRefused(f"device {device_id} is assigned {record['deployment']!r}, not {deployment!r}")
        deployment = record["deployment"]
        device_class = device_class or record["device_class"]
    if deployment is None:
        raise EdgeplanError("pull needs --device-id or --deployment")
    found = read_latest(store, deployment, trusted)
    if found is None:
        raise EdgeplanError(f"{store.uri}: deployment {deployment!r} has no published revision")
    latest, manifest = found
    dest.mkdir(parents=True, exist_ok=True)
    share = _share(store, dest, manifest, device_id, progress)
    refs = list(manifest.blobs) if share is None else [b for b in manifest.blobs if share.wants(b.name)]
    if device_class is not None and manifest.device_class != device_class and share is None:
        raise PullRefused(f"{deployment} revision {manifest.revision} is built for device class "
                          f"{manifest.device_class!r}; this device is {device_class!r}")
    accelerator = accelerator or detect_accelerator()
    if accelerator == "edgetpu-usb" and manifest.compiler == "emulated":
        raise PullRefused(f"{deployment} revision {manifest.revision}: its Edge TPU prefixes were made by the "
                          "emulated compiler; this device has a real Edge TPU and runs only edgetpu_compiler output")
    current = active(dest)
    state = _state(dest)
    highest = state["highest"].get(deployment, 0)
    if manifest.revision < highest and not allow_older:
        raise PullRefused(f"{store.uri}: {deployment} latest is revision {manifest.revision}, older than revision "
                          f"{highest} this device already ran (replay or rollback of the store); refused "
                          "(`edgeplan-runtime rollback` or pull --allow-older to go back on purpose)")
    if current is not None and current[1].deployment == deployment and current[1].revision == manifest.revision:
        return PullResult(deployment, manifest.revision, manifest.revision, False, len(refs), 0, 0, current[0])
    return _activate(store, dest, latest, manifest, refs, share, current, state, health_check, progress)


def _activate(store, dest: Path, latest, manifest: Manifest, refs, share, current, state: dict, health_check: bool,
              progress) -> PullResult:
    """Fetch ``refs``, assemble and health-check the revision in staging, record it in the state (the
    anti-rollback floor never lags the active revision), then make it ``current``."""
    deployment = manifest.deployment
    fetched, moved = 0, 0
    for ref in {b.sha256: b for b in refs}.values():  # equal files are one blob
        path = dest / blob_key(ref.sha256)
        held = path.is_file()
        n = retrying(f"fetch {ref.name}", lambda ref=ref, path=path: store.download(
            blob_key(ref.sha256), path, sha256=ref.sha256, size=ref.size, progress=progress))
        fetched += 1 if n or not held else 0  # a held blob whose bytes went bad is fetched again
        moved += n
    rev_dir = dest / "revisions" / deployment / str(manifest.revision)
    staging = _assemble(dest, rev_dir, latest, manifest, refs)
    if share is not None:
        split.write(staging, share)
    if health_check:
        step("health check")
        try:
            check(staging, manifest, share)
        except Exception as e:  # of any type: nothing unchecked becomes current
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(e, HealthCheckFailed):
                raise
            raise HealthCheckFailed(f"{deployment} revision {manifest.revision}: the health check failed "
                                    f"({type(e).__name__}: {e}); not activated") from None
    if rev_dir.exists():  # the same revision pulled before (e.g. the rollback target): replaced whole
        old = rev_dir.with_name(f".{manifest.revision}.old")
        shutil.rmtree(old, ignore_errors=True)
        step("move the old revision directory aside")
        rev_dir.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    step("rename staging")
    staging.rename(rev_dir)
    state["highest"][deployment] = max(state["highest"].get(deployment, 0), manifest.revision)
    state.setdefault("history", []).append({"deployment": deployment, "revision": manifest.revision,
                                            "activated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    _write_state(dest, state)
    previous = current[0] if current is not None else None
    if previous is not None:
        _link(dest, "previous", previous)
    _link(dest, "current", rev_dir)
    return PullResult(deployment, manifest.revision, current[1].revision if current else None, True,
                      len(refs), fetched, moved, rev_dir)


def _share(store, dest: Path, manifest: Manifest, device_id: str | None, progress) -> split.Share | None:
    """This device's share of the revision's split (its tables.json fetched and validated first), None without a
    split. Refused: a device the split gives no rank (its plan was made for other devices)."""
    where = split.found(manifest)
    if where is None:
        return None
    planner, split_dir = where
    ref = manifest.blob(f"{split_dir}/tables.json")
    path = dest / blob_key(ref.sha256)
    retrying(f"fetch {ref.name}", lambda: store.download(blob_key(ref.sha256), path, sha256=ref.sha256,
                                                         size=ref.size, progress=progress))
    tables = split.tables_of(path.read_bytes(), manifest, planner, split_dir)
    share = split.share_of(planner, split_dir, tables, device_id)
    if not share.ranks:
        devices = ", ".join(dict.fromkeys(r["device"] for r in tables["ranks"]))
        raise PullRefused(f"{manifest.deployment} revision {manifest.revision} runs its model split over {devices}; "
                          f"device {device_id} has no rank in it (plan the split again with the registry's devices)")
    return share


def _assemble(dest: Path, rev_dir: Path, latest, manifest: Manifest, refs) -> Path:
    """The revision's files held (``refs``) as hard links to the blobs, in a staging directory beside ``rev_dir``
    (names were validated with the manifest: each stays inside it)."""
    staging = rev_dir.with_name(f".{manifest.revision}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    try:
        for ref in refs:
            target = staging / ref.name
            target.parent.mkdir(parents=True, exist_ok=True)
            step(f"link {ref.name}")
            os.link(dest / blob_key(ref.sha256), target)
        step("write manifest.json")
        (staging / "manifest.json").write_text(json.dumps(manifest.to_json(), indent=2))
        step("write latest")
        (staging / "latest").write_bytes(latest.encoded())
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise EdgeplanError(f"{staging}: cannot assemble revision {manifest.revision} ({e}); the active revision "
                            "stays") from None
    return staging


def rollback(dest: Path) -> tuple[Manifest, Manifest]:
    """Make the previous revision active again (and the active one previous): (from, to) manifests."""
    dest = Path(dest)
    current, prev_link = active(dest), dest / "previous"
    if current is None or not prev_link.is_symlink():
        raise EdgeplanError(f"{dest}: no previous revision to roll back to")
    prev = prev_link.resolve()
    _link(dest, "previous", current[0])
    _link(dest, "current", prev)
    return current[1], read_manifest(prev)


def check(rev_dir: Path, manifest: Manifest, share: split.Share | None = None) -> None:
    """The health check: every model's self-test inputs through the planned point's prefix -> suffix chain
    (int8, on the CPU, reference kernels) give exactly the expected outputs; the all-CPU and all-TPU chains
    too. Raises HealthCheckFailed naming the model and point. A device holding a split's ranks loads each of
    their stages as its rank would; one that is not the split's head holds (and checks) nothing else."""
    from edgeplan.distributed.rank import RankError

    where = f"{manifest.deployment} revision {manifest.revision}"
    if share is not None:
        try:
            split.check(rev_dir, share)
        except (RankError, ValueError, RuntimeError) as e:
            raise HealthCheckFailed(f"{where}: rank {list(share.ranks)}'s stages of the split do not load: {e}; "
                                    "not activated") from None
        if not share.head:
            return
    _check_models(rev_dir, manifest, where)
    _check_streamed(rev_dir, manifest, where)
    _check_parallel(rev_dir, manifest, where)


def _check_models(rev_dir: Path, manifest: Manifest, where: str) -> None:
    from edgeplan.quantize import litert
    from edgeplan.runtime.model import load_plan, quantize_input, segment_paths

    plan = load_plan(rev_dir, manifest)
    for entry in manifest.models:
        planned = {m.name: m.point for m in plan.models}.get(entry.name, 0)
        for point in sorted({0, planned, entry.points} & set(manifest.points_carried(entry))):
            prefix, suffix = segment_paths(rev_dir, entry, point)
            chain = [litert.interpreter(p.read_bytes(), deterministic=True) for p in (prefix, suffix) if p]
            for t in entry.selftests:
                x = np.load(rev_dir / t.input, allow_pickle=False)
                want = np.load(rev_dir / t.expected, allow_pickle=False)
                try:
                    y = quantize_input(x, entry.input)
                    for it in chain:
                        y = litert.run(it, y)
                except (ValueError, RuntimeError) as e:
                    raise HealthCheckFailed(f"{where}: {entry.name} at point {point} does not run: {e}") from None
                if y.shape != want.shape or not np.array_equal(y, want):
                    diff = int(np.sum(y != want)) if y.shape == want.shape else "shape"
                    raise HealthCheckFailed(f"{where}: {entry.name} at point {point}: self-test {t.input} gives "
                                            f"another output than the bundle expects ({diff} elements differ); "
                                            "not activated")


def _check_parallel(rev_dir: Path, manifest: Manifest, where: str) -> None:
    """Every suffix the Parallax plan runs branch-parallel (reference kernels, the planned workers) gives every
    self-test's expected output after its point's int8 prefix."""
    from edgeplan.quantize import litert
    from edgeplan.runtime import parallel
    from edgeplan.runtime.model import quantize_input, segment_paths

    entries = {e.name: e for e in manifest.models}
    for name, points in parallel.load_plans(rev_dir, manifest).items():
        entry = entries[name]
        for point, plan in points.items():
            prefix, _ = segment_paths(rev_dir, entry, point)
            head = litert.interpreter(prefix.read_bytes(), deterministic=True) if prefix else None
            try:
                run = parallel.SuffixRunner(plan, parallel.interpreter_for(True))
                for t in entry.selftests:
                    y = quantize_input(np.load(rev_dir / t.input, allow_pickle=False), entry.input)
                    y = run(litert.run(head, y) if head is not None else y)
                    if not np.array_equal(y, np.load(rev_dir / t.expected, allow_pickle=False)):
                        raise HealthCheckFailed(f"{where}: {name} at point {point} run branch-parallel as its "
                                                f"Parallax plan says: self-test {t.input} gives another output "
                                                "than the bundle expects; not activated")
            except (ValueError, RuntimeError, KeyError, parallel.ParallelError) as e:
                raise HealthCheckFailed(f"{where}: {name} at point {point} does not run branch-parallel: "
                                        f"{e}") from None


def _check_streamed(rev_dir: Path, manifest: Manifest, where: str) -> None:
    """The FlashMem plan's segments, streamed as planned, give every self-test's expected output."""
    from functools import partial

    from edgeplan.quantize import litert
    from edgeplan.runtime import stream
    from edgeplan.runtime.model import quantize_input

    entries = {e.name: e for e in manifest.models}
    for name, (m, segs) in stream.load_plans(rev_dir, manifest).items():
        entry = entries[name]
        same = partial(litert.interpreter, deterministic=True)  # the kernels the expected outputs were made with
        streamer = stream.Streamer(segs, stream.schedule(segs, "plan", m.plan), same, unpacked=same)
        first = segs[0].inputs
        for t in entry.selftests:
            x = quantize_input(np.load(rev_dir / t.input, allow_pickle=False), entry.input)
            want = np.load(rev_dir / t.expected, allow_pickle=False)
            if len(first) != 1:
                raise HealthCheckFailed(f"{where}: {name}'s first streamed segment takes {len(first)} inputs")
            out, _ = streamer.run({first[0]: x})
            (y,) = out.values() if len(out) == 1 else (None,)
            if y is None or y.shape != want.shape or not np.array_equal(y, want):
                raise HealthCheckFailed(f"{where}: {name} streamed as its FlashMem plan says: self-test {t.input} "
                                        "gives another output than the bundle expects; not activated")
