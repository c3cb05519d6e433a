"""Campaign 3 of bench/reliability.py: bundle fuzzing. What a device reads from a store — the device record,
``latest``, the manifest, the blobs — mutated, one mutation per trial, and served from a local store to an
``edgeplan-runtime pull --device-id`` process (forked from the harness: ``_faults.Forked``) into a device
directory that is empty ("first") or holds revision 1 active ("next").

Mutations (seeded): bytes (a bit flipped, truncated, emptied, garbage appended, the object deleted or replaced
by another object's bytes) of any of those objects; fields of the three records (a value replaced by one of
the wrong type or out of its domain: names with ``..``, absolute paths, NUL, right-to-left marks, 5,000
characters; sizes -1, 2**63, 10**30, one byte off; NaN, infinities; a key deleted; a list entry duplicated or
dropped; a container replaced), either left with the old signature or *re-signed* with the trusted key (a
careless or compromised publisher: the signature proves who wrote a record, not that it is sane; the manifest
re-signed gets a re-signed ``latest`` naming it); signatures and key ids altered.

Promise, judged with plain reads and ``cryptography``: no mutated content becomes active (after the pull the
active revision is revision 1, untouched, or nothing; or revision 2 exactly as published — a "next" device
already holds the blobs revision 1 shares and never reads the store's copy); a refusal is exactly one line on
stderr, not a traceback and not "failed unexpectedly"; nothing is written outside the device directory.
"""
from __future__ import annotations

import base64
import copy
import json
import os
import random
import shutil
import sys
from hashlib import sha256
from pathlib import Path

from _faults import DEPLOYMENT, DEVICE, Forked, record
from _pull_kills import Setup, judge, untidy

NAMES = ["../../../../../../outside/NAME", "/tmp/edgeplan-fuzz-absolute", "", "a/../../b", "x\x00y", ".hidden",
         "models/", "\u202eexe.tflite", "n" * 5000, "dir//file", "ok/./x"]
WRONG_TYPES = [None, True, -1, 2**63, 10**30, 1.5, "7", [], {}, [1, 2], {"a": 1}]
INTS = [-1, 0, 2**63, 10**30, 1.5, float("nan"), "2", None, True]
FLOATS = [-1.0, 0.0, float("inf"), float("-inf"), float("nan"), 1e308, "0.1", None]
LISTS = [[], [-1], [10**12, 10**12, 10**12], ["a"], [[1]], None, "x", {}]
NAME_KEYS = {"name", "plan", "profile", "input", "expected"}
IDENT_KEYS = {"deployment", "device_class", "device_id", "version"}
FREE_KEYS = {"created", "code_version", "content_sha256", "media_type"}  # free-form: any string is acceptable


def _leaves(doc, path=()):
    """(path, value) of every node below the root."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield (*path, k), v
        yield from _leaves(v, (*path, k))


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _invalid(path, value, rng: random.Random):
    """A replacement for ``value`` at ``path`` that no careful publisher writes (None: leave it)."""
    key = next((k for k in reversed(path) if isinstance(k, str)), "")
    if key in FREE_KEYS and isinstance(value, str):
        return rng.choice([v for v in WRONG_TYPES if not isinstance(v, str)])
    if key in NAME_KEYS or (len(path) >= 2 and path[-2] == "plans"):
        return rng.choice(NAMES + WRONG_TYPES[:4])
    if key in IDENT_KEYS or key == "key_id":
        return rng.choice(NAMES[:6] + [" solo", "SOLO\u0000", 17, None, ["solo"]])
    if key in ("sha256", "manifest_sha256", "model_sha256"):
        return rng.choice(["zz" * 32, "", value[:-1], value.upper() + "0", 0, None])
    if key == "size" and isinstance(value, int):
        return rng.choice([value + 1, value - 1, -1, 0, 2**63, 10**30, "1", None])
    if isinstance(value, bool) or value is None:
        return rng.choice(WRONG_TYPES)
    if isinstance(value, int):
        return rng.choice([v for v in INTS if v != value])
    if isinstance(value, float):
        return rng.choice(FLOATS)
    if isinstance(value, str):
        return rng.choice([v for v in WRONG_TYPES if not isinstance(v, str)] + ["\udcff", "\u202e" + value])
    if isinstance(value, list):
        return rng.choice(LISTS)
    return rng.choice([None, [], "x", 3, {}])


def _dumps(doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                                               "surrogatepass")


def _sign(doc: dict, private) -> dict:
    """``doc`` re-signed with the trusted key (the canonical JSON of the rest, as the publisher signs)."""
    rest = {k: v for k, v in doc.items() if k != "signature"}
    return {**rest, "signature": base64.b64encode(private.sign(_dumps(rest))).decode()}


class Fuzzer:
    """Mutations of the published store: each applied to a fresh copy of it."""

    def __init__(self, store: Path, private, rng: random.Random):
        self.store, self.private, self.rng = store, private, rng
        self.keys = {"device": f"devices/{DEVICE}.json", "latest": f"deployments/{DEPLOYMENT}/latest",
                     "manifest": f"deployments/{DEPLOYMENT}/2/manifest.json"}
        self.manifest = json.loads((store / self.keys["manifest"]).read_bytes())
        self.blobs = sorted({b["sha256"] for b in self.manifest["blobs"]})

    def mutate(self, root: Path) -> dict:
        """Apply one random mutation to the store copy at ``root``; what it was."""
        rng = self.rng
        target = rng.choice(["device", "latest", "manifest", "manifest", "blob", "blob"])
        key = self.keys[target] if target != "blob" else f"blobs/sha256/{rng.choice(self.blobs)}"
        how = "bytes" if target == "blob" else rng.choice(["bytes", "field", "field-signed", "field-signed",
                                                            "signature"])
        path = root / key
        data = path.read_bytes()
        desc = {"target": target, "key": key, "how": how}
        if how == "bytes":
            kind = rng.choice(["flip", "truncate", "empty", "append", "delete", "swap"])
            desc["kind"] = kind
            if kind == "flip":
                i = rng.randrange(len(data))
                data = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
                desc["offset"] = i
            elif kind == "truncate":
                data = data[:rng.randrange(len(data))]
            elif kind == "empty":
                data = b""
            elif kind == "append":
                data += rng.randbytes(rng.choice([1, 7, 4096]))
            elif kind == "swap":
                other = root / f"blobs/sha256/{rng.choice([b for b in self.blobs if b not in key])}"
                data = other.read_bytes()
            _replace(path, None if kind == "delete" else data)
            return desc
        doc = json.loads(data)
        if how == "signature":
            kind = rng.choice(["flip", "empty", "type", "other", "key_id"])
            desc["kind"] = kind
            if kind == "flip":
                sig = bytearray(base64.b64decode(doc["signature"]))
                sig[rng.randrange(len(sig))] ^= 1 << rng.randrange(8)
                doc["signature"] = base64.b64encode(bytes(sig)).decode()
            elif kind == "empty":
                doc["signature"] = ""
            elif kind == "type":
                doc["signature"] = rng.choice([None, 5, ["x"], {"s": 1}])
            elif kind == "other":
                doc["signature"] = json.loads((root / self.keys[rng.choice(
                    [t for t in ("device", "latest", "manifest") if t != target])]).read_bytes())["signature"]
            else:
                doc["key_id"] = rng.choice(["ed25519:0000000000000000", "", None, 3, "../../x"])
            _replace(path, _dumps(doc))
            return desc
        doc = self._field(doc, desc)
        if how == "field-signed":
            doc = _sign(doc, self.private)
        data = _dumps(doc)
        _replace(path, data)
        if how == "field-signed" and target == "manifest":  # a latest, re-signed, that names it
            latest = json.loads((root / self.keys["latest"]).read_bytes())
            latest["manifest_sha256"] = sha256(data).hexdigest()
            _replace(root / self.keys["latest"], _dumps(_sign(latest, self.private)))
        return desc

    def _field(self, doc: dict, desc: dict) -> dict:
        rng = self.rng
        doc = copy.deepcopy(doc)
        nodes = [(p, v) for p, v in _leaves(doc) if p[-1] != "signature"]
        path, value = rng.choice(nodes)
        parent = _get(doc, path[:-1])
        kind = rng.choice(["replace", "replace", "replace", "delete", "dup"])
        if kind == "dup" and not isinstance(value, list | dict) and isinstance(parent, list):
            kind = "replace"
        desc.update(kind=kind, path=[str(p) for p in path])
        if kind == "delete":
            if isinstance(parent, list):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        elif kind == "dup":
            if isinstance(value, list) and value:
                value.append(copy.deepcopy(rng.choice(value)))
            elif isinstance(parent, list):
                parent.append(copy.deepcopy(value))
            else:
                parent[path[-1]] = [value, value]
        else:
            new = _invalid(path, value, rng)
            parent[path[-1]] = new
            desc["value"] = repr(new)[:80]
        return doc


def _replace(path: Path, data: bytes | None) -> None:
    """A new file (the store copy shares the pristine store's inodes: never write in place)."""
    path.unlink()
    if data is not None:
        path.write_bytes(data)


def _files(root: Path, skip: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if skip not in p.parents and p != skip}


def run_fuzz(s: Setup, pristine_manifest: dict, private, mutations: int, seed: int, work: Path) -> dict:
    """``mutations`` trials: copy the store (hard links), mutate it, pull into a fresh device directory, judge."""
    rng = random.Random(seed)
    fuzzer = Fuzzer(Path(s.store), private, rng)
    box = work / "fuzz"  # what is written outside the device directory is looked for here
    rows, violations = [], []
    for i in range(mutations):
        shutil.rmtree(box, ignore_errors=True)
        box.mkdir(parents=True)
        store, dest = box / "a" / "b" / "store", box / "a" / "b" / "c" / "d" / "device"
        shutil.copytree(s.store, store, copy_function=_hardlink)
        kind = rng.choice(["first", "next"])
        if kind == "next":
            shutil.copytree(s.template, dest, symlinks=True)
        else:
            dest.mkdir(parents=True)
        desc = fuzzer.mutate(store)
        before = _files(box, dest)
        proc = Forked(["pull", str(store), "--device-id", DEVICE, "--dest", str(dest), "--trusted", str(s.trusted),
                       "--retries", "0"], s.env, s.logs, "fuzz")
        rc, err = proc.wait(300), proc.stderr()
        rev, manifest, wrong = judge(dest, s.public)
        broke = [f"after the pull: {w}" for w in wrong]
        accepted = rev == 2 and manifest != pristine_manifest
        if accepted:
            broke.append("mutated content is active")
        elif rev not in ({None, 2} if kind == "first" else {1, 2}):
            broke.append(f"current names {rev}")
        untidy_ = untidy(err) if rc != 0 else []
        broke += [f"the refusal: {w}" for w in untidy_]
        if rc != 0 and not err.strip():
            broke.append("refused without a word")
        if rc not in (0, 1):
            broke.append(f"exit {rc}")
        outside = sorted(_files(box, dest) - before)
        if outside:
            broke.append(f"written outside the device directory: {outside[:3]}")
        row = {"trial": i, "seed": seed, "device": kind, **desc, "exit": rc, "message": err.strip()[:300],
               "activated": rev == 2, "accepted": accepted, "traceback": "Traceback" in err,
               "unexpected": "unexpectedly" in err, "violations": broke}
        record(rows, violations, row, "bundle fuzzing, mutations", mutations)
    print(file=sys.stderr)
    shutil.rmtree(box, ignore_errors=True)
    by = {}
    for r in rows:
        k = f"{r['target']}/{r['how']}"
        by.setdefault(k, {"mutations": 0, "refused": 0, "violations": 0})
        by[k]["mutations"] += 1
        by[k]["refused"] += r["exit"] != 0
        by[k]["violations"] += bool(r["violations"])
    return {"mutations": len(rows), "accepted": sum(r["accepted"] for r in rows),
            "tracebacks": sum(r["traceback"] for r in rows), "unexpected": sum(r["unexpected"] for r in rows),
            "refused": sum(r["exit"] != 0 for r in rows), "activated_as_published": sum(r["activated"] and not
                                                                                      r["accepted"] for r in rows),
            "violations": len(violations), "by_target": by, "violated": violations, "rows": rows}


def _hardlink(src, dst):
    os.link(src, dst)
