"""FlashMem benchmark (issue 13): beside the paper's Tables 4, 7, 8 and Figs. 6, 8, 9, on this 2-vCPU host.

Writes bench/results/flashmem.json and flashmem.png. Nothing here is EMULATED: every figure is this
machine's CPU, its page cache and its resident set. A run without flags does everything below: about 25
minutes from nothing (compiling the four Keras models into ``--work``: VGG19 8 min at a 16.5 GB peak), about
12 once they are compiled (reused; the profiles too). A run of some ``--parts`` or ``--models`` only writes
flashmem-partial.json and .png instead (not committed), so the full run's figures stay whole.

Per model (ResNet50V2, DenseNet201, InceptionV3 and VGG19, seeded weights, int8): the pipeline as a user runs
it — ``edgeplan compile``, ``edgeplan stream`` (VGG19's fc1 split), ``edgeplan profile run`` (load capacity
measured), ``plan_flashmem`` at M_peak = max(``--share`` x the all-preloaded footprint the plan predicts, the
smallest budget ``check_budget`` accepts x 1.05). Then each configuration — ``preload`` (the whole int8 model
as one interpreter), ``plan``, ``always-next``, ``same-op-type``, ``eager`` — runs in a fresh process
(``--child``), cold (page cache of its blobs dropped before every request), ``--iterations`` requests, peak
resident set above the process's baseline from VmHWM after clear_refs 5 and a 2-ms sampler; ``--rounds``
rounds, configurations shuffled within each round; medians over rounds.

Keys (ratios and errors are fractions):
- peak_rss_ratio: geometric mean over the models of median peak (plan) / median peak (preload). [Table 8]
- integrated_latency_ratio: geometric mean of median request time (read + build + run, cold), plan / preload.
- always_next_over_plan: VGG19's median request time always-next / plan; same_op_over_plan likewise; every
  model's in ``models``. [Fig. 9] Beside it, always_next_over_read_floor: always-next over the read floor (the
  plan's segments read cold and hashed by the runtime's readers, nothing built or run, interleaved with the
  modes): no plan streams faster than that floor, so always-next / plan cannot exceed this ratio here. And
  always_next_over_eager (VGG19's; every model's in ``models``): always-next over ``eager``, the quickest this runtime
  streams a request (no budget): what always-next / plan reaches with a plan as quick as eager.
- eager_latency_ratio / eager_peak_ratio: geometric means of eager / preload (time; peak): every segment read
  from the request's start and built as soon as read, no plan and no budget — what this runtime does at best for
  time, beside the plan's figures (not a target).
- no_lead_latency_ratio / no_lead_peak_ratio: geometric means of the same model planned without the read lead
  (``flashmem.solve_share`` 1, ``read_lead`` 1: the solver's placement as the runtime carries it out; every
  segment on XNNPACK) / preload, measured in the same interleaved rounds as the plan (not a target).
- xnnpack_only_latency_ratio / xnnpack_only_peak_ratio: the same plan — the same solve, cut and measured
  segments (``plan_flashmem``'s ``variants``) — with every segment on XNNPACK (``flashmem.segment_kernels``
  xnnpack; the plan's own picks the reference kernels for a segment where they measured faster — VGG19's
  fully-connected parts, whose packing costs more than running them) / preload, in the same rounds: the
  plan/preload figures as they were before the kernel choice, beside the headline (not a target); each model's
  ``always_next_over_xnnpack_only`` likewise, and ``unpacked_segments``.
- in_time_latency_ratio / in_time_peak_ratio: the same plan with its reads also moved to when the readers,
  reading in turn at their measured rate, need them to start (``flashmem.read_in_time`` true, ``lead.in_time``;
  off by default) / preload, in the same rounds (not a target); each model's ``always_next_over_in_time``
  likewise.
- fifo_peak_ratio: the four models FIFO, ``--fifo-iterations`` rounds each, peak plan / preload. [Fig. 6]
- tradeoff: ResNet50V2 re-planned over M_peak and lambda, each measured (peak, time). [Fig. 8]
- solver: LC-OPG on real layer lists — DenseNet201's streaming layers (measured capacities) and GPT-Neo
  125M / 1.3B decoders lowered op by op from their published configs (shapes only, capacities by class:
  the median measured C_l of the measured models' layers of that class, ``class_capacity`` with the layers each is
  of) — ``paper`` objective in windows of 100 (DenseNet201 also of 50), per window status and seconds;
  ``resident`` objective as one window over the whole chain. [Table 4] Each row and window: what its layers ask of
  C3 against what they offer (``scarcity``: builds against build shadows, weight KiB against read capacity); and
  DenseNet201's per-layer builds (what the solver places) beside its plan's merged segments' measured builds.
- capacity_mape: XGBoost slowdown model fitted on three models' measured load capacity, predicting the
  fourth's layer times beside a loader and beside a build; mean over the four held-out folds of the MAPE
  of those times. [§4.2] ``no_slowdown_mape``: the same with every layer predicted as fast as alone (the
  baseline the model must beat), and per fold how often the predicted C_l equals the measured one.
- rss_prediction_error: max over the models of |plan's predicted peak - measured plan peak| / measured. The
  prediction counts what each cut segment holds, measured once built by the planner, and the activations the
  runtime keeps between segments (``predicted_from``: "segments"; "layers", the profile's per-layer figures,
  only if that measuring failed), less the loads a segment's invoke is too short to cover (``merge.expected``,
  at ``predicted_read_mb_s``, the readers' cold rate measured by the planner); each model's
  ``rss_prediction_error_ledger`` prices the same plan without that timing.
- identical: 1 if every model's streamed output equals its int8 model's, in every stream mode.
- second_core_free: a two-process probe run (the speed probe alone and two at once): the ratio of their
  medians (about 1 when the second core is free).
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
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import child_json, machine, publish, pyplot, second_core  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EDGEPLAN = [sys.executable, "-m", "edgeplan.cli"]
MODELS = {"ResNet50V2": "resnet50v2_224", "DenseNet201": "densenet201_224", "InceptionV3": "inceptionv3_299",
          "VGG19": "vgg19_224"}
MODES = ("preload", "plan", "always-next", "same-op-type", "eager")
XNNPACK_ONLY = "plan-xnnpack"  # the same plan with every segment on XNNPACK (flashmem.segment_kernels xnnpack)
IN_TIME = "plan-in-time"  # the same plan, its reads also moved to when the readers need them (read_in_time true)
VARIANTS = {XNNPACK_ONLY: {"segment_kernels": "xnnpack"}, IN_TIME: {"read_in_time": True}}
NO_LEAD = "plan-no-lead"  # the solver's placement as it was before the read lead (solve_share 1, read_lead 1)
READ_FLOOR = "read-floor"  # the segments read cold and hashed, nothing else: a streamed request's floor here
CLASS = "coral-usb-emulated"  # its CPU is measured here; nothing of its (emulated) Edge TPU enters
# GPT-Neo published configs (EleutherAI, Hugging Face config.json): layers, hidden, vocabulary, positions
GPT_NEO = {"GPT-Neo-125M": (12, 768, 50257, 2048), "GPT-Neo-1.3B": (24, 2048, 50257, 2048)}


def log(msg: str) -> None:
    print(f"[flashmem {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- pipeline
def prepare(work: Path, zoo: str) -> Path:
    """The model compiled, streamed and profiled (load capacity) in ``work``, as the CLI does it; reused."""
    d = work / "artifacts" / zoo / "1"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    steps = [
        (d / "verify.json", [*EDGEPLAN, "compile", f"zoo:{zoo}", "--name", zoo, "--version", "1",
                             "--out", str(work / "artifacts")]),
        (d / "stream" / "stream.json", [*EDGEPLAN, "stream", str(d)]),
        (d / "profiles" / f"{CLASS}.json", [*EDGEPLAN, "profile", "run", str(d), "--device-class", CLASS,
                                            "--repeats", "3", "--budget-s", "1"]),
    ]
    for done, cmd in steps:
        if done.is_file():
            continue
        log(f"{zoo}: {' '.join(cmd[3:5])}")
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0 or not done.is_file():
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"{zoo}: {' '.join(cmd[3:5])} failed: {' | '.join(tail)}")
    return d


def bench_params(work: Path, deps: dict[str, tuple[str, float | None]]) -> dict:
    """params.yaml with one single-model deployment per entry: name -> (zoo model, lambda or None)."""
    from edgeplan.pipeline import params as params_mod

    p = params_mod.load(None)
    p["deployments"] = [{"name": n, "device_class": CLASS, "models": [{"name": z, "version": "1", "rate": 1.0}]}
                        for n, (z, _) in deps.items()]
    p["fleet"]["devices"] = []
    return p


def problem_of(d: Path, settings: dict, m_peak: int):
    from edgeplan.artifacts import StreamInfo
    from edgeplan.plan.flashmem.deployment import problem
    from edgeplan.profile.schema import Profile

    info = StreamInfo.load(d / "stream" / "stream.json")
    return problem(info, Profile.load(d / "profiles" / f"{CLASS}.json").load_capacity, settings, m_peak)


def ledger_peak(d: Path, settings: dict, mp) -> int:
    """The recorded plan's peak priced by the ledger alone (``merge.shifted`` over what the segments hold), without
    ``merge.expected``'s timing: what the prediction was before it."""
    from edgeplan.plan.flashmem.merge import footprints_of, measured, shifted

    runs = [(s.first_layer, s.last_layer) for s in mp.segments]
    prices = measured(problem_of(d, settings, mp.plan.m_peak), runs, footprints_of(mp.segments))
    return shifted(prices, mp.plan, runs).peak_resident_bytes


def budget(d: Path, settings: dict, share: float) -> tuple[int, int]:
    """(M_peak, the plan's all-preloaded footprint): ``share`` of the footprint, at least what fits."""
    from edgeplan.plan.flashmem.problem import KIB, min_m_peak

    prob = problem_of(d, settings, 1)
    total = sum(prob.full_kib(i) for i in range(prob.n)) * KIB
    return max(int(share * total), int(min_m_peak(prob) * 1.05)), total


def plan(work: Path, dep: str, zoo: str, m_peak: int, lam: float | None = None, variants: dict | None = None,
         **flashmem):
    """The deployment ``dep`` planned at ``m_peak``; ``lam`` and ``flashmem`` override params.yaml's settings,
    ``variants`` as ``plan_flashmem``'s (written beside the plan)."""
    from edgeplan.plan.flashmem.deployment import plan_flashmem

    p = bench_params(work, {dep: (zoo, lam)})
    if lam is not None:
        p["flashmem"]["lambda"] = lam
    p["flashmem"].update(flashmem)
    t0 = time.perf_counter()
    result, path = plan_flashmem(work / "artifacts", dep, p, m_peak=m_peak, variants=variants)
    return result, path, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- measuring
def read_floor(spec: dict) -> dict:
    """The least time any streamed request of the model can take here: its plan's segments, their pages dropped,
    read and hashed by the runtime's reader threads along its read path (``Streamer.read_only``) with no wait for
    a position, nothing built or run. Shaped as a FIFO child's result (one request, its ms)."""
    from edgeplan.plan.flashmem.plan import FlashMemPlan
    from edgeplan.runtime import fifo, stream

    (m,) = spec["models"]
    (mp,) = FlashMemPlan.load(Path(m["plan"])).models
    base = Path(m["plan"]).parent.parent
    segs = [stream.segment_of(base, s) for s in mp.segments]
    streamer = stream.Streamer(segs, stream.schedule(segs, "serial"), lambda data: None)
    fifo.drop_cache([s.path for s in segs])
    return {"peak_bytes": 0, "requests": [{"ms": streamer.read_only() * 1e3, "stall_ms": 0.0}]}


def child(spec: dict) -> dict:
    """One configuration in this fresh process: the FIFO of ``spec['models']``, as ``edgeplan-runtime fifo``."""
    from functools import partial

    if spec["mode"] == READ_FLOOR:
        return read_floor(spec)

    from edgeplan.plan.flashmem.plan import FlashMemPlan
    from edgeplan.quantize import litert
    from edgeplan.runtime import fifo, stream

    stream.return_freed_memory()
    interp = partial(litert.interpreter, deterministic=False)
    jobs = {}
    for m in spec["models"]:
        x = np.load(m["input"], allow_pickle=False)
        if spec["mode"] == "preload":
            jobs[m["name"]] = fifo.preload_job(Path(m["whole"]), m["whole_sha256"], x, interp)
            continue
        fp = FlashMemPlan.load(Path(m["plan"]))
        (mp,) = fp.models
        base = Path(m["plan"]).parent.parent
        segs = [stream.segment_of(base, s) for s in mp.segments]
        jobs[m["name"]] = fifo.streamed_job(segs, spec["mode"], mp.plan, x, interp)
    names = [m["name"] for m in spec["models"]]
    res = fifo.measure(jobs, names, spec["iterations"], spec["mode"], cold=True)
    return {"peak_bytes": res.peak_above_baseline_bytes, "baseline_bytes": res.baseline_bytes,
            "requests": res.requests, "timeline": res.timeline[:: max(1, len(res.timeline) // 400)]}


def run_child(spec: dict) -> dict:
    return child_json(__file__, spec, spec["mode"])


def model_input(d: Path) -> Path:
    """A seeded random int8 input of the model, saved once beside its artifacts."""
    from edgeplan.quantize.tflite_graph import TfliteGraph

    path = d / "bench_input.npy"
    if not path.is_file():
        g = TfliteGraph((d / "model_int8.tflite").read_bytes())
        (i,) = g.inputs
        np.save(path, np.random.default_rng(7).integers(-128, 128, g.tensors[i].shape, dtype=np.int8))
    return path


def entry(d: Path, plan_path: Path | None) -> dict:
    import hashlib

    whole = d / "model_int8.tflite"
    return {"name": d.parent.name, "whole": str(whole), "whole_sha256": hashlib.sha256(whole.read_bytes()).hexdigest(),
            "plan": str(plan_path) if plan_path else None, "input": str(model_input(d))}


def measure_configs(configs: dict[str, dict], rounds: int, seed: int) -> dict[str, list[dict]]:
    """Each spec in a fresh process, ``rounds`` times, shuffled within each round."""
    out: dict[str, list[dict]] = {k: [] for k in configs}
    order = random.Random(seed)
    for r in range(rounds):
        keys = list(configs)
        order.shuffle(keys)
        for k in keys:
            out[k].append(run_child(configs[k]))
        log(f"  round {r + 1}/{rounds}")
    return out


def summary(runs: list[dict]) -> dict:
    peaks = [r["peak_bytes"] for r in runs]
    ms = [statistics.median(q["ms"] for q in r["requests"]) for r in runs]
    stall = [statistics.median(q["stall_ms"] for q in r["requests"]) for r in runs]
    return {"peak_bytes": statistics.median(peaks), "peak_bytes_runs": peaks, "ms": statistics.median(ms),
            "ms_runs": [round(x, 2) for x in ms], "stall_ms": statistics.median(stall)}


def identical(d: Path, plan_path: Path) -> dict[str, bool]:
    """Streamed outputs against the int8 model's, every stream mode (XNNPACK kernels, as the runtime)."""
    from functools import partial

    from edgeplan.plan.flashmem.plan import FlashMemPlan
    from edgeplan.quantize import litert
    from edgeplan.quantize.tflite_graph import TfliteGraph
    from edgeplan.runtime import stream

    (mp,) = FlashMemPlan.load(plan_path).models
    base = plan_path.parent.parent
    segs = [stream.segment_of(base, s) for s in mp.segments]
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    x = {g.tensors[g.inputs[0]].name: np.load(model_input(d))}
    interp = partial(litert.interpreter, deterministic=False)
    want = stream.run_preloaded(d / "model_int8.tflite", x, interp)
    out = {}
    for mode in stream.MODES:
        got, _ = stream.Streamer(segs, stream.schedule(segs, mode, mp.plan), interp, mode).run(x)
        out[mode] = all(np.array_equal(got[k], want[k]) for k in want)
    return out


# ---------------------------------------------------------------------------------------------- Table 4
def gpt_neo_layers(n_layer: int, d: int, vocab: int, positions: int, max_bytes: int) -> list[tuple[str, str, int]]:
    """The decoder lowered op by op (name, op, int8 weight bytes): embeddings, per block LayerNorm (9 ops),
    q/k/v projections (no bias), reshapes/transposes, scores, causal mask, softmax, context, output projection
    + bias, residual, LayerNorm, MLP (fc + bias, gelu_new as 8 ops, proj + bias), residual; final LayerNorm and
    the LM head (tied to the embedding, read again). Biases int32, LayerNorm scale/offset float32. A projection
    above ``max_bytes`` is split along output channels + CONCATENATION, as the stream stage does."""
    out: list[tuple[str, str, int]] = []

    def ln(prefix: str) -> None:
        for k, op in enumerate(("MEAN", "SUB", "MUL", "MEAN", "ADD", "RSQRT", "MUL")):
            out.append((f"{prefix}.{k}", op, 0))
        out.append((f"{prefix}.scale", "MUL", 4 * d))
        out.append((f"{prefix}.offset", "ADD", 4 * d))

    def fc(name: str, n_in: int, n_out: int) -> None:
        parts = math.ceil(n_in * n_out / max_bytes)
        for k in range(parts):
            lo, hi = n_out * k // parts, n_out * (k + 1) // parts
            out.append((f"{name}.{k}" if parts > 1 else name, "FULLY_CONNECTED", n_in * (hi - lo)))
        if parts > 1:
            out.append((f"{name}.concat", "CONCATENATION", 0))

    out += [("wte", "GATHER", vocab * d), ("wpe", "GATHER", positions * d), ("embed.add", "ADD", 0)]
    for b in range(n_layer):
        h = f"h{b}"
        ln(f"{h}.ln_1")
        for proj in "qkv":
            fc(f"{h}.attn.{proj}", d, d)
        for proj in "qkv":
            out += [(f"{h}.attn.{proj}.reshape", "RESHAPE", 0), (f"{h}.attn.{proj}.transpose", "TRANSPOSE", 0)]
        out += [(f"{h}.attn.scores", "BATCH_MATMUL", 0), (f"{h}.attn.mask", "SELECT_V2", 0),
                (f"{h}.attn.softmax", "SOFTMAX", 0), (f"{h}.attn.context", "BATCH_MATMUL", 0),
                (f"{h}.attn.transpose", "TRANSPOSE", 0), (f"{h}.attn.reshape", "RESHAPE", 0)]
        fc(f"{h}.attn.out", d, d)
        out += [(f"{h}.attn.out.bias", "ADD", 4 * d), (f"{h}.residual_1", "ADD", 0)]
        ln(f"{h}.ln_2")
        fc(f"{h}.mlp.fc", d, 4 * d)
        out.append((f"{h}.mlp.fc.bias", "ADD", 16 * d))
        out += [(f"{h}.mlp.gelu.{k}", op, 0) for k, op in enumerate(("POW", "MUL", "ADD", "MUL", "TANH", "ADD",
                                                                       "MUL", "MUL"))]
        fc(f"{h}.mlp.proj", 4 * d, d)
        out += [(f"{h}.mlp.proj.bias", "ADD", 4 * d), (f"{h}.residual_2", "ADD", 0)]
    ln("ln_f")
    fc("lm_head", d, vocab)
    return out


NO_CAPACITY = {"chunks": 0, "build_ms": 0.0}
# the GPT-Neo rows' classes when no model was measured (a run of --models without any): 4 chunks, no shadow
UNMEASURED_CAPACITY = {"elemental": {"chunks": 4, "build_ms": 0.0, "layers": 0},
                       "reusable": {"chunks": 4, "build_ms": 0.0, "layers": 0},
                       "hierarchical": {**NO_CAPACITY, "layers": 0}}


def class_capacity(probs: list) -> dict[str, dict]:
    """Median measured (C_l chunks, build-shadow ms) per op class over the layers of every measured model's problem,
    with how many layers each median is of; a class with no layer takes ``reusable``'s. Pooled: DenseNet201 alone
    has one elemental layer, so its elemental median was one measurement (26-59 chunks on the last hosts)."""
    by: dict[str, list] = {}
    for prob in probs:
        for layer in prob.layers:
            by.setdefault(layer.op_class, []).append(layer)
    med = {c: {"chunks": int(statistics.median(x.capacity_chunks for x in ls)),
               "build_ms": statistics.median(x.capacity_build_ms for x in ls), "layers": len(ls)}
           for c, ls in by.items()}
    fallback = {**med.get("reusable", NO_CAPACITY), "layers": 0}
    caps = {c: med.get(c, fallback) for c in ("elemental", "reusable")}
    caps["hierarchical"] = {**NO_CAPACITY, "layers": len(by.get("hierarchical", ()))}  # 0 % threshold (Table 5)
    return caps


def shape_problem(ops: list[tuple[str, str, int]], caps: dict, settings: dict, objective: str, window: int,
                  share: float):
    from edgeplan.plan.flashmem.problem import KIB, Layer, Problem, min_m_peak
    from edgeplan.profile.capacity import op_class

    layers = tuple(Layer(n, w, 0.0, op_class(op), caps[op_class(op)]["chunks"], caps[op_class(op)]["build_ms"])
                   for n, op, w in ops)
    kw = dict(chunk_bytes=int(settings["chunk_bytes"]), lam=float(settings["lambda"]), objective=objective,
              window=window, lookback=int(settings["lookback"]), time_limit_s=float(settings["time_limit_s"]))
    prob = Problem(layers, m_peak=1, **kw)
    total = sum(prob.full_kib(i) for i in range(prob.n)) * KIB
    return Problem(layers, m_peak=max(int(share * total), int(min_m_peak(prob) * 1.05)), **kw)


def scarcity(prob, first: int, last: int) -> dict:
    """What layers ``first``..``last`` ask of C3 and what they offer: their weights' builds against their build
    shadows (ms), their weights' KiB against their read capacity (KiB). A window's weights may also use the
    ``lookback`` layers before it, so a window asking more than it offers is not yet infeasible."""
    span = range(first, last + 1)
    return {"build_ms": round(sum(prob.layers[i].build_ms for i in span if prob.layers[i].weight_bytes), 2),
            "shadow_ms": round(sum(prob.layers[i].capacity_build_ms for i in span), 2),
            "weight_kib": sum(prob.chunks(i) * prob.chunk_kib(i) for i in span),
            "read_capacity_kib": sum(prob.capacity_kib(i) for i in span),
            "layers_with_shadow": sum(prob.layers[i].capacity_build_ms > 0 for i in span)}


def solve_row(name: str, prob) -> dict:
    from edgeplan.plan.flashmem import lcopg

    t0 = time.perf_counter()
    p = lcopg.plan(prob)
    wall = time.perf_counter() - t0
    ws = [{"layers": [w.first, w.last], "weights": w.weights, "tier": w.tier, "why": w.why, "status": w.status,
           "gap": w.gap, "seconds": round(w.seconds, 3), **scarcity(prob, w.first, w.last)} for w in p.windows]
    row = {"model": name, "layers": prob.n, "weights": len(prob.weights()), "objective": prob.objective,
           "window": prob.window, "m_peak_bytes": prob.m_peak, "windows": len(ws),
           "all_optimal": all(w["status"] == "OPTIMAL" for w in ws), "tiers": sorted({w["tier"] for w in ws}),
           "max_window_s": max((w["seconds"] for w in ws), default=0.0), "wall_s": round(wall, 2),
           **scarcity(prob, 0, prob.n - 1), "per_window": ws}
    log(f"  {name} {prob.objective} window {prob.window}: {row['windows']} windows, all optimal "
        f"{row['all_optimal']}, max {row['max_window_s']:.1f} s, wall {wall:.1f} s")
    return row


DENSE_WINDOWS = (100, 50)  # Table 4's DenseNet201 row at the issue's largest window, and beside it at half


def solver(dirs: dict[str, Path], settings: dict, share: float, dense_plan=None) -> dict:
    """Table 4's rows. ``dense_plan``: the bench's FlashMem plan of DenseNet201, whose M_peak its rows are solved at
    and whose merged segments' measured builds are set beside the per-layer builds the solver places."""
    from dataclasses import replace

    rows = []
    probs = {name: problem_of(d, settings, 1) for name, d in dirs.items()}
    dense = probs.get("DenseNet201")
    extra = {}
    if dense is not None and dense_plan is not None:
        for window in DENSE_WINDOWS:
            rows.append(solve_row("DenseNet201", replace(dense, m_peak=dense_plan.m_peak, objective="paper",
                                                         window=window)))
        segments = dense_plan.models[0].segments
        extra = {"dense_layer_build_ms": round(sum(x.build_ms for x in dense.layers), 2),
                 "dense_segment_build_ms": round(sum(seg.build_ms for seg in segments), 2),
                 "dense_segments": len(segments)}
    caps = class_capacity(list(probs.values())) if probs else UNMEASURED_CAPACITY
    for name, cfg in GPT_NEO.items():
        ops = gpt_neo_layers(*cfg, max_bytes=int(settings["max_segment_bytes"]))
        rows.append(solve_row(name, shape_problem(ops, caps, settings, "paper", 100, share)))
        rows.append(solve_row(name, shape_problem(ops, caps, settings, "resident", len(ops), share)))
    return {"rows": rows, "class_capacity": caps, "class_capacity_from": list(probs), **extra}


# ---------------------------------------------------------------------------------------------- capacity model
def capacity_mape(dirs: dict[str, Path]) -> dict:
    """Leave one model out: fit the slowdown model on the others' measured runs, predict the held-out's
    layer times beside each loader rate and beside a build; MAPE of those times."""
    from edgeplan.artifacts import StreamInfo
    from edgeplan.profile import capacity as cap
    from edgeplan.profile.capacity_model import SlowdownModel, capacities
    from edgeplan.profile.features import segment_features
    from edgeplan.profile.predictor import mape
    from edgeplan.profile.schema import Profile
    from edgeplan.quantize.tflite_graph import TfliteGraph

    runs = {}
    for name, d in dirs.items():
        info = StreamInfo.load(d / "stream" / "stream.json")
        feats = [segment_features(TfliteGraph((d / x.file).read_bytes())) for x in info.layers]
        runs[name] = (Profile.load(d / "profiles" / f"{CLASS}.json").load_capacity, feats)
    folds = {}
    for held in runs:
        train = [runs[n] for n in runs if n != held]
        if not train:
            continue
        model = SlowdownModel.fit(train, os.cpu_count() or 1)
        run, feats = runs[held]
        pred = model.slowdowns(run, feats)
        measured, predicted = [], []
        for layer, slows in zip(run.layers, pred):
            for k, s in enumerate(slows):
                measured.append(layer.alone_ms * (1 + layer.slowdown(k)))
                predicted.append(layer.alone_ms * (1 + s))
        chunk = 64 * 1024
        measured_c = capacities(run, chunk)
        same = [a == b for a, b in zip(measured_c, capacities(run, chunk, pred))]
        # the baseline a model must beat: every layer as fast beside a load as alone (C_l then as loose as allowed)
        alone = [layer.alone_ms for layer in run.layers for _ in pred[0]]
        none = [[0.0] * len(pred[0]) for _ in run.layers]
        same_none = [a == b for a, b in zip(measured_c, capacities(run, chunk, none))]
        folds[held] = {"mape": round(mape(predicted, measured), 4), "layers": len(run.layers),
                       "c_l_same_fraction": round(sum(same) / len(same), 3),
                       "mape_no_slowdown": round(mape(alone, measured), 4),
                       "c_l_same_fraction_no_slowdown": round(sum(same_none) / len(same_none), 3),
                       "rates_mb_s": list(cap.RATES_MB_S)}
    if not folds:
        return {"value": None, "folds": folds}
    return {"value": statistics.mean(f["mape"] for f in folds.values()),
            "no_slowdown_mape": statistics.mean(f["mape_no_slowdown"] for f in folds.values()), "folds": folds}


# ---------------------------------------------------------------------------------------------- main
def geomean(xs: list[float]) -> float:
    return math.exp(statistics.mean(math.log(x) for x in xs))


PARTS = ("models", "fifo", "tradeoff", "solver", "capacity", "probe")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "flashmem",
                    help="where the compiled models and plans stay between runs (default: .edgeplan/bench/flashmem)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    ap.add_argument("--share", type=float, default=0.25, help="M_peak as this share of the preloaded footprint")
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds per model (fresh processes, medians)")
    ap.add_argument("--iterations", type=int, default=3, help="cold requests per configuration process")
    ap.add_argument("--fifo-iterations", type=int, default=10)
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="comma-separated, of " + ", ".join(PARTS) + " (default: all). A run of fewer parts or "
                         "models writes flashmem-partial.json/.png, leaving the full run's flashmem.json as it is")
    ap.add_argument("--quick", action="store_true", help="2 rounds, 1 iteration, 3 FIFO iterations (marked quick)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.quick:
        args.rounds, args.iterations, args.fifo_iterations = 2, 1, 3
    from edgeplan.pipeline import params as params_mod

    settings = params_mod.load(None)["flashmem"]
    parts = {x for x in args.parts.split(",") if x}
    unknown_parts = sorted(parts - set(PARTS))
    if unknown_parts:
        ap.error(f"--parts: {', '.join(unknown_parts)} unknown; choose from {', '.join(PARTS)}")
    result: dict = {"machine": machine(), "quick": args.quick, "share": args.share, "rounds": args.rounds,
                    "iterations": args.iterations, "cold": True, "emulated": False,
                    "solve_share": float(settings["solve_share"]), "read_lead": int(settings["read_lead"])}
    wanted = [m for m in args.models.split(",") if m]
    unknown = [m for m in wanted if m not in MODELS]
    if unknown:
        ap.error(f"--models: {', '.join(unknown)} unknown; choose from {', '.join(MODELS)}")
    dirs, missing = {}, {}
    for name in wanted:
        try:
            dirs[name] = prepare(args.work, MODELS[name])
        except RuntimeError as e:
            missing[name] = str(e)
            log(f"{name}: not measured: {e}")
    result["missing_models"] = missing
    plans = {}
    for name, d in dirs.items():
        m_peak, footprint = budget(d, settings, args.share)
        fp, path, seconds = plan(args.work, f"bench-{d.parent.name}", d.parent.name, m_peak, variants=VARIANTS)
        _, bare, _ = plan(args.work, f"bench-no-lead-{d.parent.name}", d.parent.name, m_peak, solve_share=1.0,
                          read_lead=1, read_in_time=False, segment_kernels="xnnpack")
        plans[name] = (fp, path, bare)
        log(f"{name}: planned at M_peak {m_peak / 2**20:.1f} MiB in {seconds:.1f} s")
    if "models" in parts:
        per_model = {}
        for name, d in dirs.items():
            fp, path, bare = plans[name]
            (mp,) = fp.models
            log(f"{name}: measuring {', '.join(MODES)}, {NO_LEAD}, {', '.join(VARIANTS)}")
            configs = {mode: {"mode": mode, "iterations": args.iterations, "models": [entry(d, path)]}
                       for mode in (*MODES, READ_FLOOR)}
            configs[NO_LEAD] = {"mode": "plan", "iterations": args.iterations, "models": [entry(d, bare)]}
            for variant in VARIANTS:
                configs[variant] = {"mode": "plan", "iterations": args.iterations,
                                    "models": [entry(d, path.parent / f"{variant}.json")]}
            runs = measure_configs(configs, args.rounds, seed=len(per_model))
            s = {mode: summary(runs[mode]) for mode in (*MODES, NO_LEAD, *VARIANTS)}
            floor = summary(runs[READ_FLOOR])["ms"]
            pre = s["preload"]
            per_model[name] = {
                "m_peak_bytes": fp.m_peak, "segments": len(mp.segments), "layers": len(mp.plan.resident_bytes),
                "predicted_peak_bytes": mp.plan.peak_resident_bytes, "predicted_preload_bytes": mp.preload_peak_bytes,
                "predicted_from": mp.footprint, "solve_m_peak_bytes": mp.plan.solve_m_peak or fp.m_peak,
                "read_lead": mp.plan.read_lead, "modes": s,
                "unpacked_segments": sum(seg.kernels == "unpacked" for seg in mp.segments),
                "peak_rss_ratio": s["plan"]["peak_bytes"] / pre["peak_bytes"],
                "integrated_latency_ratio": s["plan"]["ms"] / pre["ms"],
                "always_next_over_plan": s["always-next"]["ms"] / s["plan"]["ms"],
                "same_op_over_plan": s["same-op-type"]["ms"] / s["plan"]["ms"],
                "read_floor_ms": floor,
                "read_floor_ms_runs": [round(r["requests"][0]["ms"], 2) for r in runs[READ_FLOOR]],
                # no plan streams faster than its segments can be read cold: always-next / plan is at most this
                "always_next_over_read_floor": s["always-next"]["ms"] / floor,
                # eager (every read at the start, every build as soon as read, no budget) is the quickest this
                # runtime streams a request here; a plan within M_peak beating always-next by more than this would
                # have to beat eager too
                "always_next_over_eager": s["always-next"]["ms"] / s["eager"]["ms"],
                "always_next_peak_over_plan": s["always-next"]["peak_bytes"] / s["plan"]["peak_bytes"],
                "eager_latency_ratio": s["eager"]["ms"] / pre["ms"],
                "eager_peak_ratio": s["eager"]["peak_bytes"] / pre["peak_bytes"],
                # the kernel choice's effect, in the same rounds: the same plan with every segment on XNNPACK
                "xnnpack_only_latency_ratio": s[XNNPACK_ONLY]["ms"] / pre["ms"],
                "xnnpack_only_peak_ratio": s[XNNPACK_ONLY]["peak_bytes"] / pre["peak_bytes"],
                "always_next_over_xnnpack_only": s["always-next"]["ms"] / s[XNNPACK_ONLY]["ms"],
                # the same plan, its reads also moved to when the readers need them to start (``lead.in_time``)
                "in_time_latency_ratio": s[IN_TIME]["ms"] / pre["ms"],
                "in_time_peak_ratio": s[IN_TIME]["peak_bytes"] / pre["peak_bytes"],
                "always_next_over_in_time": s["always-next"]["ms"] / s[IN_TIME]["ms"],
                # the read lead's effect, in the same interleaved rounds: the solver's placement as it was (all
                # XNNPACK, as before the kernel choice)
                "no_lead_latency_ratio": s[NO_LEAD]["ms"] / pre["ms"],
                "no_lead_peak_ratio": s[NO_LEAD]["peak_bytes"] / pre["peak_bytes"],
                "rss_prediction_error": abs(mp.plan.peak_resident_bytes - s["plan"]["peak_bytes"])
                / s["plan"]["peak_bytes"],
                "predicted_read_mb_s": mp.read_mb_s,
                # the same plan priced without when the loads land (every load beside its segment): for comparison
                "rss_prediction_error_ledger": abs(ledger_peak(d, settings, mp) - s["plan"]["peak_bytes"])
                / s["plan"]["peak_bytes"],
                "identical": identical(d, path),
            }
            log(f"{name}: peak plan/preload {per_model[name]['peak_rss_ratio']:.3f}, time "
                f"{per_model[name]['integrated_latency_ratio']:.3f}, always-next/plan "
                f"{per_model[name]['always_next_over_plan']:.3f}")
        result["models"] = per_model
        if per_model:
            result["peak_rss_ratio"] = geomean([m["peak_rss_ratio"] for m in per_model.values()])
            result["integrated_latency_ratio"] = geomean([m["integrated_latency_ratio"] for m in per_model.values()])
            result["integrated_latency_ratio_max"] = max(m["integrated_latency_ratio"] for m in per_model.values())
            result["eager_latency_ratio"] = geomean([m["eager_latency_ratio"] for m in per_model.values()])
            result["eager_peak_ratio"] = geomean([m["eager_peak_ratio"] for m in per_model.values()])
            result["no_lead_latency_ratio"] = geomean([m["no_lead_latency_ratio"] for m in per_model.values()])
            result["xnnpack_only_latency_ratio"] = geomean([m["xnnpack_only_latency_ratio"]
                                                            for m in per_model.values()])
            result["xnnpack_only_peak_ratio"] = geomean([m["xnnpack_only_peak_ratio"] for m in per_model.values()])
            result["no_lead_peak_ratio"] = geomean([m["no_lead_peak_ratio"] for m in per_model.values()])
            for key in ("in_time_latency_ratio", "in_time_peak_ratio"):
                result[key] = geomean([m[key] for m in per_model.values()])
            vgg = per_model.get("VGG19")
            result["always_next_over_plan"] = {"value": vgg["always_next_over_plan"] if vgg else None,
                                               "model": "VGG19" if vgg else "VGG19 not measured"}
            result["same_op_over_plan"] = {"value": vgg["same_op_over_plan"] if vgg else None}
            result["always_next_over_eager"] = {
                "value": vgg["always_next_over_eager"] if vgg else None,
                "models": {n: m["always_next_over_eager"] for n, m in per_model.items()}}
            result["always_next_over_read_floor"] = {"value": vgg["always_next_over_read_floor"] if vgg else None,
                                                     "read_floor_ms": vgg["read_floor_ms"] if vgg else None}
            result["rss_prediction_error"] = max(m["rss_prediction_error"] for m in per_model.values())
            result["identical"] = int(all(all(m["identical"].values()) for m in per_model.values()))
    if "fifo" in parts and len(dirs) > 1:
        log(f"FIFO of {', '.join(dirs)} x {args.fifo_iterations}")
        models = [entry(d, plans[n][1]) for n, d in dirs.items()]
        configs = {mode: {"mode": mode, "iterations": args.fifo_iterations, "models": models}
                   for mode in ("preload", "plan")}
        runs = measure_configs(configs, max(1, args.rounds // 2), seed=99)
        s = {mode: summary(runs[mode]) for mode in configs}
        result["fifo_peak_ratio"] = s["plan"]["peak_bytes"] / s["preload"]["peak_bytes"]
        result["fifo"] = {"models": list(dirs), "iterations": args.fifo_iterations, "modes": s,
                          "timeline": {mode: runs[mode][0]["timeline"] for mode in configs}}
    if "tradeoff" in parts and "ResNet50V2" in dirs:
        d = dirs["ResNet50V2"]
        _, footprint = budget(d, settings, args.share)
        low, _ = budget(d, settings, 0.0)
        points = []
        for share in (0.0, 0.15, 0.25, 0.5, 1.0):
            for lam in (0.5, 0.9):
                m_peak = max(low, int(share * footprint))
                fp, path, _ = plan(args.work, f"bench-tradeoff-{share}-{lam}", d.parent.name, m_peak, lam)
                runs = measure_configs({"plan": {"mode": "plan", "iterations": args.iterations,
                                                 "models": [entry(d, path)]}}, max(1, args.rounds // 2), seed=7)
                s = summary(runs["plan"])
                points.append({"share": share, "lambda": lam, "m_peak_bytes": m_peak,
                               "predicted_peak_bytes": fp.models[0].plan.peak_resident_bytes, **s})
                log(f"  tradeoff share {share} lambda {lam}: peak {s['peak_bytes'] / 2**20:.1f} MiB, {s['ms']:.0f} ms")
        result["tradeoff"] = {"model": "ResNet50V2", "points": points}
    if "solver" in parts:
        log("solver: Table 4 layer lists")
        dense_plan = plans["DenseNet201"][0] if "DenseNet201" in plans else None
        result["solver"] = solver(dirs, settings, args.share, dense_plan)
    if "capacity" in parts and len(dirs) > 1:
        result["capacity_mape"] = capacity_mape(dirs)
    if "probe" in parts:
        result["second_core_free"] = second_core()
    keys = tuple(k for k in ("peak_rss_ratio", "integrated_latency_ratio", "always_next_over_plan",
                             "fifo_peak_ratio", "rss_prediction_error", "capacity_mape", "identical") if k in result)
    whole = parts == set(PARTS) and set(wanted) == set(MODELS)
    publish("flashmem" if whole else "flashmem-partial", result, plot, keys)
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(3, 2, figsize=(13, 13), gridspec_kw={"height_ratios": [1, 1, 0.8]})
    models = result.get("models", {})
    _bars(axes[0][0], models, lambda s: s["peak_bytes"] / 2**20, "peak RSS above baseline (MiB, cold)",
          "Table 8: peak resident set per mode (measured)")
    _bars(axes[0][1], models, lambda s: s["ms"], "median request ms (read + build + run, cold)",
          "Table 7 / Fig. 9: integrated latency per mode")
    ax = axes[1][0]
    for p in result.get("tradeoff", {}).get("points", []):
        ax.scatter(p["peak_bytes"] / 2**20, p["ms"], marker="o" if p["lambda"] == 0.9 else "s",
                   color="tab:blue" if p["lambda"] == 0.9 else "tab:orange")
        ax.annotate(f"{p['share']}", (p["peak_bytes"] / 2**20, p["ms"]), fontsize=7)
    ax.set_xlabel("measured peak RSS (MiB)")
    ax.set_ylabel("median request ms")
    ax.set_title("Fig. 8: ResNet50V2 over M_peak share (labels); o lambda 0.9, s lambda 0.5")
    ax = axes[1][1]
    for mode, tl in result.get("fifo", {}).get("timeline", {}).items():
        ax.plot([t for t, _ in tl], [b / 2**20 for _, b in tl], label=mode, lw=0.8)
    ax.set_xlabel("s")
    ax.set_ylabel("RSS above baseline (MiB)")
    ax.set_title("Fig. 6: FIFO of the models, cold")
    ax.legend(fontsize=8)
    gs = axes[2][0].get_gridspec()
    for ax in axes[2]:
        ax.remove()
    _windows(fig.add_subplot(gs[2, :]), result.get("solver", {}).get("rows", []))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


STATUS_COLOURS = {"OPTIMAL": "tab:green", "FEASIBLE": "tab:orange"}  # anything else (greedy, unknown): red


def _windows(ax, rows: list[dict]) -> None:
    """Table 4: every rolling window's solve seconds, one group of bars per row, coloured by its status."""
    x, ticks = 0, []
    for row in rows:
        ws = row["per_window"]
        bars = ax.bar(range(x, x + len(ws)), [w["seconds"] for w in ws],
                      color=[STATUS_COLOURS.get(w["status"], "tab:red") for w in ws])
        for bar, w in zip(bars, ws):
            if w["tier"] != "strict":
                bar.set_hatch("//")
        ticks.append((x + (len(ws) - 1) / 2, f"{row['model']}\n{row['objective']} w{row['window']}"))
        x += len(ws) + 1
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7)
    ax.set_ylabel("seconds per window (10 s limit)")
    ax.axhline(5.0, color="grey", lw=0.6, ls="--")
    ax.set_title("Table 4: LC-OPG windows, 2 CP-SAT workers (green OPTIMAL, orange FEASIBLE, red neither; "
                 "hatched: a C4 tier past strict; dashed: 5 s)")


def _bars(ax, models: dict, value, ylabel: str, title: str) -> None:
    names = list(models)
    modes = [m for m in (*MODES, NO_LEAD, *VARIANTS) if all(m in models[n]["modes"] for n in names)]
    width = 0.8 / max(1, len(modes))
    for k, mode in enumerate(modes):
        ax.bar([i + k * width for i in range(len(names))], [value(models[n]["modes"][mode]) for n in names], width,
               label=mode)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


if __name__ == "__main__":
    raise SystemExit(main())
