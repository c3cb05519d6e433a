"""``edgeplan profile diff A B``: the segments whose latency moved by more than a threshold between two
profiles (drift: a new runtime, a new host, thermal trouble, a changed model)."""
from __future__ import annotations

from dataclasses import dataclass

from edgeplan.errors import ProfileError
from edgeplan.profile.schema import Profile


@dataclass(frozen=True)
class Change:
    point: int
    role: str
    metric: str  # "tpu_ms" or "cpu_ms@<threads>"
    before_ms: float | None
    after_ms: float | None
    rel_change: float | None  # (after - before) / before; None when a side is missing or failed
    note: str = ""


def diff(a: Profile, b: Profile, threshold: float, *, allow_other_model: bool = False) -> list[Change]:
    """Changes beyond ``threshold`` (relative) from ``a`` to ``b``, plus segments present or ok on one side only."""
    if a.device_class != b.device_class:
        raise ProfileError(f"profiles of different device classes: {a.device_class!r} and {b.device_class!r}")
    if a.model_sha256 != b.model_sha256 and not allow_other_model:
        raise ProfileError(f"profiles of different models ({a.model} {a.model_sha256[:12]}…, "
                           f"{b.model} {b.model_sha256[:12]}…); pass --other-model to compare anyway")
    out: list[Change] = []
    keys = sorted({s.key for s in a.segments} | {s.key for s in b.segments})
    for point, role in keys:
        sa, sb = a.segment(point, role), b.segment(point, role)
        for metric, va, vb in _metrics(sa, sb):
            if va is None and vb is None:
                continue
            if va is None or vb is None:
                note = f"{'only in B' if va is None else 'only in A'}" + _status(sa, sb)
                out.append(Change(point, role, metric, va, vb, None, note))
                continue
            rel = (vb - va) / va if va > 0 else float("inf")
            if abs(rel) > threshold:
                out.append(Change(point, role, metric, va, vb, rel, _status(sa, sb).lstrip("; ")))
    return out + _load_capacity(a, b, threshold)


def _load_capacity(a: Profile, b: Profile, threshold: float) -> list[Change]:
    """FlashMem's measured streaming layers (role ``stream``, point -1): their summed time alone and beside the
    fastest loader, which set the C_l (per layer, the many sub-millisecond layers would drift on noise alone);
    a profile with load capacity against one without is a change too."""
    la, lb = a.load_capacity, b.load_capacity
    if la is None and lb is None:
        return []
    if la is None or lb is None or len(la.layers) != len(lb.layers):
        note = ("load capacity only in B" if la is None else "load capacity only in A" if lb is None
                else f"load capacity of {len(la.layers)} layers in A, {len(lb.layers)} in B")
        return [Change(-1, "stream", "load_capacity", None, None, None, note)]
    out = []
    for metric, pick in (("alone_ms", lambda x: x.alone_ms), ("loaded_ms", lambda x: x.beside_read_ms[-1])):
        va, vb = sum(map(pick, la.layers)), sum(map(pick, lb.layers))
        rel = (vb - va) / va if va > 0 else float("inf")
        if abs(rel) > threshold:
            out.append(Change(-1, "stream", metric, va, vb, rel, f"{len(la.layers)} streaming layers"))
    return out


def _status(sa, sb) -> str:
    bits = [f"{side}: {s.status}" for side, s in (("A", sa), ("B", sb)) if s is not None and s.status != "ok"]
    return ("; " + ", ".join(bits)) if bits else ""


def _metrics(sa, sb):
    def tpu(s):
        return s.tpu.tpu_ms if s is not None and s.status == "ok" and s.tpu is not None else None

    def cpu(s, n):
        return s.cpu_ms(n) if s is not None and s.status == "ok" else None

    yield "tpu_ms", tpu(sa), tpu(sb)
    threads = sorted({t.threads for s in (sa, sb) if s is not None for t in s.cpu})
    for n in threads:
        yield f"cpu_ms@{n}", cpu(sa, n), cpu(sb, n)
