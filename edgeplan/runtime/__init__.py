"""The thin device runtime (DESIGN.md "Runtime"): pull and verify signed revisions (``pull``), serve them
(``engine.Runtime``, ``server``), load-test them (``loadgen``), profile on the device (``profile_job``).
Imports numpy, ai-edge-litert, cryptography and the standard library only (boto3 for s3:// stores).

The serving engine's names are imported when first used: a pull on a device of 0.2 core does not pay for its
imports (0.18 s of CPU here, about 1 s of the pull's wall time there)."""
from __future__ import annotations

from edgeplan.runtime.pull import (
    HealthCheckFailed,
    PullRefused,
    PullResult,
    active,
    pull,
    rollback,
)

__all__ = ["HealthCheckFailed", "Overloaded", "PullRefused", "PullResult", "Runtime", "active", "pull", "rollback"]


def __getattr__(name: str):
    if name in ("Overloaded", "Runtime"):
        from edgeplan.runtime import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
