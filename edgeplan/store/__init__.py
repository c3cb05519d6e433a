"""The object store: one key space under a root (DESIGN.md "Store and bundles"), two backends.

``open_store("path" | "file:///path" | "s3://bucket/prefix")``. Blobs are written with If-None-Match
(``put(..., if_absent=True)``), so writing the same content twice is a no-op and a key is never replaced
behind a reader's back. Standard library only here; the S3 backend imports boto3 when it is used (the
device runtime installs it only for s3:// stores).
"""
from __future__ import annotations

import os

from edgeplan.store.base import Store
from edgeplan.store.local import LocalStore

# The reliability harness's fault hook (bench/reliability.py, store/faults.py): with this set to N, the process
# SIGKILLs itself just before its Nth step (a store call or a marked step of a pull; N = 1, 2, ...).
KILL_AT_ENV = "EDGEPLAN_KILL_AT"
TRACE_ENV = "EDGEPLAN_FAULT_TRACE"  # with this set to FILE, each step appends its label there


def open_store(uri: str, **options) -> Store:
    """A store from its URI: a local path or ``file://`` URI, or ``s3://bucket[/prefix]`` (options:
    ``endpoint_url``, ``retries``, ``timeout_s``; else the standard AWS configuration chain, with
    ``AWS_ENDPOINT_URL`` for an S3-compatible server)."""
    text = str(uri)
    if text.startswith("s3://"):
        from edgeplan.store.s3 import S3Store

        store = S3Store.from_uri(text, **options)
    else:
        if text.startswith("file://"):
            text = text[len("file://"):]
        elif "://" in text:
            from edgeplan.errors import StoreError

            raise StoreError(f"store {uri!r}: unknown scheme; use a path, file:///path or s3://bucket/prefix")
        store = LocalStore(text)
    if os.environ.get(KILL_AT_ENV) or os.environ.get(TRACE_ENV):
        from edgeplan.store.faults import KillAt

        return KillAt(store)
    return store


__all__ = ["LocalStore", "Store", "open_store"]
