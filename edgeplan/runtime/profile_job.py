"""``edgeplan-runtime profile JOB_URI``: a fleet profiling job (``jobs/<id>/job.json``) run on the device
itself, so a device without Prefect takes part in fleet reprofiling. The active revision's CPU suffixes
are timed here with the library profiler (``edgeplan.profile.cpu``: interleaved rounds with a speed probe,
scaled to the job's reference probe as the pipeline does); the Edge TPU side of each profile is the bundle's
(EMULATED where the bundle's is); drift against the bundle's profile; the result uploaded to
``jobs/<id>/result/<device-id>.json`` in the same format as the pipeline's profile-job.
numpy, ai-edge-litert and the standard library only."""
from __future__ import annotations

import json
import socket
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from edgeplan.errors import EdgeplanError
from edgeplan.profile import cpu
from edgeplan.profile.diff import diff
from edgeplan.profile.schema import CpuTiming, Host, Profile, median_at
from edgeplan.runtime.model import segment_paths
from edgeplan.runtime.pull import active


def split_job_uri(uri: str) -> tuple[str, str]:
    """``<store root>/jobs/<id>/job.json`` -> (store root, key)."""
    root, sep, rest = uri.rpartition("/jobs/")
    if not sep or not rest.endswith("/job.json") or rest.count("/") != 1:
        raise EdgeplanError(f"{uri!r}: not a job URI (<store root>/jobs/<id>/job.json)")
    return root or ".", f"jobs/{rest}"


def remeasure(old: Profile, rev_dir: Path, entry, settings: cpu.Settings, reference: dict) -> Profile:
    """``old`` with every suffix's CPU timings measured again on this machine."""
    suffixes = [(i, segment_paths(rev_dir, entry, s.point)[1]) for i, s in enumerate(old.segments)
                if s.role == "suffix" and s.status == "ok"]
    with cpu.Profiler(settings) as profiler:
        found, probe_m = profiler.measure_many([str(p) for _, p in suffixes], list(old.threads))
    probe = tuple(CpuTiming.from_samples(n, v) for n, v in sorted(probe_m.samples_ms.items())) if probe_m else ()
    scale = {}
    for n in old.threads:
        ref, now = reference.get(str(n), reference.get(n)), median_at(probe, n)
        scale[n] = ref / now if ref and now else 1.0
    segs = list(old.segments)
    for (i, _), m in zip(suffixes, found):
        segs[i] = replace(segs[i], status=m.status, error=m.error, cpu=tuple(
            CpuTiming.from_samples(n, m.samples_ms[n], scale=scale[n]) for n in old.threads if n in m.samples_ms))
    return replace(old, host=Host(**cpu.host()), created=datetime.now(UTC).isoformat(timespec="seconds"),
                   settings=dict(settings.__dict__), segments=tuple(segs), probe=probe)


def run_job(job_uri: str, dest: Path, trusted: dict, device_id: str | None = None) -> dict:
    from edgeplan.store import open_store

    root, key = split_job_uri(job_uri)
    store = open_store(root)
    job = json.loads(store.get(key))
    found = active(dest)
    if found is None:
        raise EdgeplanError(f"{dest}: no active revision to profile (run `edgeplan-runtime pull` first)")
    rev_dir, manifest = found
    if manifest.device_class != job["device_class"]:
        raise EdgeplanError(f"job {job['id']} is for device class {job['device_class']!r}; this device runs "
                            f"{manifest.deployment} for {manifest.device_class!r}")
    entries = {(e.name, e.version): e for e in manifest.models}
    wanted = [(m["name"], str(m["version"])) for m in job["models"]]
    held = [w for w in wanted if w in entries]
    if not held:
        raise EdgeplanError(f"job {job['id']} profiles {', '.join(f'{n}:{v}' for n, v in wanted)}; the active "
                            f"revision ({manifest.deployment} {manifest.revision}) has none of them")
    settings = cpu.Settings.from_params(job["settings"])
    threshold = float(job["settings"].get("drift_threshold", 0.10))
    device_id = device_id or socket.gethostname()
    profiles, drift = {}, {}
    for name, version in held:
        entry = entries[name, version]
        old = Profile.from_json(json.loads((rev_dir / entry.profile).read_text()))
        new = remeasure(old, rev_dir, entry, settings, job.get("reference_probe_ms") or {})
        profiles[name] = new.to_json()
        changes = [asdict(c) for c in diff(old, new, threshold)]
        if changes:
            drift[f"{name}:{version}"] = changes
    result = {"job": job["id"], "device_id": device_id, "profiles": profiles, "drift": drift,
              "revision": manifest.revision, "skipped": [f"{n}:{v}" for n, v in wanted if (n, v) not in entries]}
    out = f"jobs/{job['id']}/result/{device_id}.json"
    store.put(out, json.dumps(result, default=str).encode())
    return {**result, "key": out}
