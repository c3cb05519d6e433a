"""XNNPACK weight cache: a measured lead for FlashMem's §4.4 on the CPU (not used by the runtime yet).

FlashMem's streamed requests pay XNNPACK's weight packing at every segment build (CPU work that holds the GIL).
LiteRT's ``CompiledModel`` API takes an XNNPACK weight-cache file (``CpuOptions(xnnpack_weight_cache_path=FILE)``):
the first build packs into it, later builds map it. This measures, on the FlashMem bench's own plans (every segment
of ResNet50V2, DenseNet201, InceptionV3 and VGG19 as ``plan_flashmem`` cut them), what a streamed request would get
from caches made beforehand. Configurations, each in a fresh process, cold (the page cache of every file it reads
dropped first), the model's segments read, built, invoked once on seeded inputs and dropped one after another,
interleaved rounds, medians:

- ``interpreter``: LiteRT's ``Interpreter`` on XNNPACK, what the streaming runtime builds;
- ``cached``: ``CompiledModel`` from the segment with its weight-cache file (made beforehand in another process),
  the cache file read through the page cache first (as the runtime's readers would read it ahead; counted as read
  time), so the build maps warm pages — left to the build's page faults, cold, it took longer than packing;
- ``cached-zeroed``: the same with the segment's weight buffers zeroed: the cache is keyed by buffer, not content,
  so a segment could travel as a flatbuffer plus its packed weights — and a cache miss would pack the zeros
  silently, so this is a lead only where the cache is made and checked where it runs.

Then, in the same process, the same builds again (warm) beside a Python thread that counts, at the runtime's 1 ms
switch interval: its count per second against its idle rate is the share of the GIL the builds leave
(``gil_share``: the runtime's readers and compute thread need it between native calls), and the builds' time
beside it (``build_ms_beside_python``) what a busy Python thread costs them.

Keys (ratios are fractions): build_ms_ratio / zeroed_build_ms_ratio: geometric means over the models of the
median summed build ms, cached (zeroed) / interpreter; total_ms_ratio: read + build + first invoke, cached /
interpreter; cache_bytes_ratio: cache files' bytes / segments' bytes; identical: 1 if every segment's outputs in
both cached configurations equal the interpreter's; gil_share: median per configuration. Nothing EMULATED.

Needs the FlashMem bench's work directory (``bench/flashmem.py`` makes it: compiled models and plans); a run
without flags prepares what is missing the same way (``flashmem.prepare`` and ``plan``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import child_json, machine, publish, pyplot  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIGS = ("interpreter", "cached", "cached-zeroed")


def segments_of(work: Path, zoo: str) -> list[Path]:
    """The FlashMem bench's plan of ``zoo`` (made if missing), its segments in order."""
    import flashmem as fm

    from edgeplan.pipeline import params as params_mod
    from edgeplan.plan.flashmem.plan import FlashMemPlan

    plan_path = work / "artifacts" / "deployments" / f"bench-{zoo}" / "plans" / "flashmem.json"
    if not plan_path.is_file():
        d = fm.prepare(work, zoo)
        m_peak, _ = fm.budget(d, params_mod.load(None)["flashmem"], 0.25)
        _, plan_path, _ = fm.plan(work, f"bench-{zoo}", zoo, m_peak)
    (mp,) = FlashMemPlan.load(plan_path).models
    return [plan_path.parent.parent / s.file for s in mp.segments]


def make_caches(segments: list[Path], out: Path) -> tuple[list[Path], list[Path]]:
    """Per segment, its XNNPACK weight-cache file and a copy with its weight buffers zeroed, under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    caches = [out / f"{s.stem}.xnnpack_cache" for s in segments]
    zeroed = [out / f"{s.stem}.zeroed.tflite" for s in segments]
    for s, c, z in zip(segments, caches, zeroed):
        c.unlink(missing_ok=True)
        z.write_bytes(_zeroed(s.read_bytes()))
    code = ("import sys, json\nsys.path.insert(0, sys.argv[1])\nfrom weight_cache import _compiled\n"
            "for s, c in json.loads(sys.argv[2]):\n    _compiled(open(s, 'rb').read(), c)\n")
    res = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent),
                          json.dumps([[str(s), str(c)] for s, c in zip(segments, caches)])],
                         capture_output=True, text=True)
    missing = [c.name for c in caches if not c.is_file() or c.stat().st_size == 0]
    if res.returncode != 0 or missing:
        raise RuntimeError(f"making the weight caches failed (exit {res.returncode}; missing {missing[:3]}): "
                           f"{(res.stderr.strip().splitlines() or [''])[-1]}")
    return caches, zeroed


def _zeroed(blob: bytes) -> bytes:
    """``blob`` with every constant buffer above 4 KiB zeroed (dropped instead, the model fails to run)."""
    import flatbuffers
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(bytearray(blob), 0)
    for b in m.buffers or []:
        if b.data is not None and len(b.data) > 4096:
            b.data = np.zeros(len(b.data), np.uint8)
    builder = flatbuffers.Builder(len(blob) + 4096)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _compiled(blob: bytes, cache: str):
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.options import CpuOptions, Options

    return CompiledModel.from_buffer(blob, options=Options(cpu_options=CpuOptions(
        num_threads=1, xnnpack_weight_cache_path=cache)))


# ---------------------------------------------------------------------------------------------- one child
class _Counter:
    """A Python thread counting in a loop: its rate while native code runs, against idle, is the GIL it leaves."""

    def __init__(self):
        self.n, self.stop = 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop:
            self.n += 1

    def rate(self, seconds: float) -> float:
        n0, t0 = self.n, time.perf_counter()
        time.sleep(seconds)
        return (self.n - n0) / (time.perf_counter() - t0)


def child(spec: dict) -> dict:
    import hashlib

    import numpy as np

    from edgeplan.quantize import litert
    from edgeplan.runtime.fifo import drop_cache

    config, segs, caches = spec["config"], spec["segments"], spec["caches"]
    files = spec["zeroed"] if config == "cached-zeroed" else segs
    drop_cache(files + (caches if config != "interpreter" else []))
    first = Path(segs[0]).read_bytes()  # one-time costs, as the runtime pays them before its first request
    litert.interpreter(first, deterministic=False) if config == "interpreter" else _compiled(first, "")

    def build(k: int, blob: bytes):
        return litert.interpreter(blob, deterministic=False) if config == "interpreter" else _compiled(blob, caches[k])

    read_ms = build_ms = invoke_ms = 0.0
    digests, blobs = [], []
    for k, path in enumerate(files):  # cold, nothing else running: what a request's segments cost
        t = time.perf_counter()
        blob = Path(path).read_bytes()
        if config != "interpreter":  # read ahead as the runtime's readers would: the build then maps warm pages
            _read_through(caches[k])
        read_ms += (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        it = build(k, blob)
        build_ms += (time.perf_counter() - t) * 1e3
        out = _run(it, config == "interpreter", np.random.default_rng(k))
        invoke_ms += out.pop("_ms")
        digests.append({n: hashlib.sha256(v.tobytes()).hexdigest() for n, v in sorted(out.items())})
        blobs.append(blob)
        del it
    # then the same builds (warm) beside a Python thread that counts, at the runtime's 1 ms switch interval: the
    # share of its idle rate it keeps is the GIL the builds leave; the builds' time beside it, what a build costs
    # the runtime's compute and reader threads' Python work costs the build
    sys.setswitchinterval(0.001)
    counter = _Counter()
    counter.thread.start()
    idle = counter.rate(0.05)
    n0, t = counter.n, time.perf_counter()
    for k, blob in enumerate(blobs):
        build(k, blob)
    beside = time.perf_counter() - t
    counted = counter.n - n0
    counter.stop = True
    return {"read_ms": read_ms, "build_ms": build_ms, "invoke_ms": invoke_ms, "gil_share": counted / beside / idle,
            "build_ms_beside_python": beside * 1e3, "digests": digests}


def _read_through(path: str, block: int = 1 << 20) -> None:
    """``path`` read once into the page cache (nothing kept)."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(block)
        while f.readinto(buf):
            pass


def _run(it, interpreter: bool, rng) -> dict:
    """One invoke on seeded inputs (by input name, so both APIs get the same): outputs by name, and ``_ms``."""
    import numpy as np

    def value(shape, name):
        return np.random.default_rng([int(rng.integers(1 << 30)), len(name)]).integers(
            -128, 128, shape, dtype=np.int8)

    if interpreter:
        inputs = sorted(it.get_input_details(), key=lambda d: d["name"])
        for d in inputs:
            it.set_tensor(d["index"], value(d["shape"], d["name"]))
        t = time.perf_counter()
        it.invoke()
        ms = (time.perf_counter() - t) * 1e3
        return {"_ms": ms, **{d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}}
    key = next(iter(it.get_signature_list()))
    ins, outs = it.get_input_tensor_details(key), it.get_output_tensor_details(key)
    in_bufs = {n: it.create_input_buffer_by_name(key, n) for n in ins}
    out_bufs = {n: it.create_output_buffer_by_name(key, n) for n in outs}
    for n in sorted(ins):
        in_bufs[n].write(value(ins[n]["shape"], n))
    t = time.perf_counter()
    it.run_by_name(key, in_bufs, out_bufs)
    ms = (time.perf_counter() - t) * 1e3
    return {"_ms": ms, **{n: out_bufs[n].read(math.prod(outs[n]["shape"]), np.dtype(outs[n]["dtype"])).reshape(
        outs[n]["shape"]) for n in outs}}


def run_child(spec: dict) -> dict:
    return child_json(__file__, spec, spec["config"])


# ---------------------------------------------------------------------------------------------- the run
def main() -> int:
    import flashmem as fm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "flashmem",
                    help="the FlashMem bench's work directory (default: .edgeplan/bench/flashmem)")
    ap.add_argument("--models", default=",".join(fm.MODELS), help="comma-separated, of " + ", ".join(fm.MODELS))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (fresh processes, medians)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    wanted = [m for m in args.models.split(",") if m]
    unknown = [m for m in wanted if m not in fm.MODELS]
    if unknown:
        ap.error(f"--models: {', '.join(unknown)} unknown; choose from {', '.join(fm.MODELS)}")
    result: dict = {"machine": machine(), "rounds": args.rounds, "cold": True, "emulated": False, "models": {}}
    for name in wanted:
        zoo = fm.MODELS[name]
        segs = segments_of(args.work, zoo)
        caches, zeroed = make_caches(segs, args.work / "weight_cache" / zoo)
        spec = {"segments": [str(s) for s in segs], "caches": [str(c) for c in caches],
                "zeroed": [str(z) for z in zeroed]}
        runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
        order = random.Random(len(result["models"]))
        for r in range(args.rounds):
            keys = list(CONFIGS)
            order.shuffle(keys)
            for c in keys:
                runs[c].append(run_child({**spec, "config": c}))
            fm.log(f"  {name}: round {r + 1}/{args.rounds}")
        med = {c: {k: statistics.median(x[k] for x in runs[c]) for k in ("read_ms", "build_ms", "invoke_ms",
                                                                          "gil_share", "build_ms_beside_python")}
               for c in CONFIGS}
        want = runs["interpreter"][0]["digests"]
        same = all(x["digests"] == want for c in CONFIGS for x in runs[c])
        total = {c: med[c]["read_ms"] + med[c]["build_ms"] + med[c]["invoke_ms"] for c in CONFIGS}
        result["models"][name] = {
            "segments": len(segs), "segment_bytes": sum(s.stat().st_size for s in segs),
            "cache_bytes": sum(c.stat().st_size for c in caches), "configs": med, "total_ms": total,
            "build_ms_ratio": med["cached"]["build_ms"] / med["interpreter"]["build_ms"],
            "zeroed_build_ms_ratio": med["cached-zeroed"]["build_ms"] / med["interpreter"]["build_ms"],
            "total_ms_ratio": total["cached"] / total["interpreter"], "identical": same}
        fm.log(f"{name}: build {med['interpreter']['build_ms']:.1f} ms -> cached {med['cached']['build_ms']:.1f}, "
               f"zeroed {med['cached-zeroed']['build_ms']:.1f}; identical {same}")
    models = result["models"]
    if models:
        for key in ("build_ms_ratio", "zeroed_build_ms_ratio", "total_ms_ratio"):
            result[key] = fm.geomean([m[key] for m in models.values()])
        result["cache_bytes_ratio"] = (sum(m["cache_bytes"] for m in models.values())
                                       / sum(m["segment_bytes"] for m in models.values()))
        result["identical"] = int(all(m["identical"] for m in models.values()))
        result["gil_share"] = {c: statistics.median(m["configs"][c]["gil_share"] for m in models.values())
                               for c in CONFIGS}
    publish("weight_cache", result, plot, ("build_ms_ratio", "zeroed_build_ms_ratio", "total_ms_ratio",
                                           "cache_bytes_ratio", "identical"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    models = result["models"]
    names = list(models)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(CONFIGS)
    for k, c in enumerate(CONFIGS):
        xs = [i + k * width for i in range(len(names))]
        axes[0].bar(xs, [models[n]["configs"][c]["build_ms"] for n in names], width, label=c)
        axes[1].bar(xs, [models[n]["total_ms"][c] for n in names], width, label=c)
    for ax, title in zip(axes, ("summed segment builds (ms, cold)", "read + build + first invoke (ms, cold)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("XNNPACK weight cache on the FlashMem plans' segments (medians, fresh processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
