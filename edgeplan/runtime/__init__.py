"""The thin device runtime (DESIGN.md "Runtime"): pull and verify signed revisions (``pull``), serve them
(``engine.Runtime``, ``server``), load-test them (``loadgen``), profile on the device (``profile_job``).
Imports numpy, ai-edge-litert, cryptography and the standard library only (boto3 for s3:// stores)."""
from __future__ import annotations

from edgeplan.runtime.engine import Overloaded, Runtime
from edgeplan.runtime.pull import (
    HealthCheckFailed,
    PullRefused,
    PullResult,
    active,
    pull,
    rollback,
)

__all__ = ["HealthCheckFailed", "Overloaded", "PullRefused", "PullResult", "Runtime", "active", "pull", "rollback"]
