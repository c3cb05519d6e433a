"""Content-addressed cache keys for the tasks."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from edgeplan import childlog
from edgeplan.artifacts import code_digest

_FILE_HASHES: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    """sha256 of a file, memoised on (path, size, mtime) for this process."""
    st = path.stat()
    memo = (str(path), st.st_size, st.st_mtime_ns)
    if memo not in _FILE_HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _FILE_HASHES[memo] = h.hexdigest()
    return _FILE_HASHES[memo]


def tree_digest(paths: Iterable[Path]) -> str:
    """Over files and directories (every file under them, by relative name, but a directory's ``logs/``: what the
    converters printed, ``edgeplan/childlog``, is no input); a missing path counts as such."""
    h = hashlib.sha256()
    for p in sorted(Path(x) for x in paths):
        if p.is_dir():
            for f in sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")
                            and q.relative_to(p).parts[0] != childlog.DIR):
                h.update(f"{f.relative_to(p)}\0{file_digest(f)}\n".encode())
        elif p.is_file():
            h.update(f"{p.name}\0{file_digest(p)}\n".encode())
        else:
            h.update(f"{p}\0missing\n".encode())
    return h.hexdigest()


def pick(params: dict, keys: Iterable[str]):
    """The values of dotted keys ("quantize.calibration", "fleet") of params, for hashing."""
    out = {}
    for key in keys:
        value = params
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out[key] = value
    return out


def content_key(files: Callable[[dict], Iterable[Path]], params_keys: Callable[[dict], Iterable[str]] | Iterable[str],
                code: Iterable[str], scalars: Iterable[str] = ()):
    """A Prefect ``cache_key_fn``: ``files(parameters)`` are hashed by content, ``params_keys`` (or a function
    of the task's parameters giving them) picked from its ``params`` argument, ``scalars`` are task
    parameters taken as they are, ``code`` the edgeplan modules it runs."""
    code = tuple(code)

    def key(context, parameters: dict) -> str:
        keys = params_keys(parameters) if callable(params_keys) else params_keys
        doc = {
            "task": context.task.name if context is not None else "",
            "files": tree_digest(files(parameters)),
            "params": pick(parameters.get("params") or {}, keys),
            "scalars": {s: str(parameters.get(s)) for s in scalars},
            "code": code_digest(code),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()

    return key


def abs_path(p) -> Path:
    return Path(os.path.abspath(p))
