"""Parallax benchmark (issue 14): beside the paper's Tables 3-7, on this 2-vCPU host.

Writes bench/results/parallax.json and parallax.png. EMULATED: Table 7's "post" and "pruned" columns use the
emulated Edge TPU compiler's op placement (which ops would map, multiple subgraphs allowed), "pruned" and
``hetero_layer_reduction`` the emulated Edge TPU's modelled times; nothing else. A run without flags does
everything below: about 20 minutes once the models are compiled (reused from ``--work`` or from bench/flashmem's
work directory).

Per model (InceptionV3, DenseNet201 — seeded Keras weights —, light_inception_v1 and ``encoder``, the zoo's
``vit_encoder``: a vision-transformer encoder built node by node, 196 tokens, 4 blocks of 4 heads, each head its
own projections, so heads are branches and BATCH_MATMUL stays on the CPU; int8, XNNPACK kernels as the runtime
uses them): branches and layers (``graph/branches``), refinement (3 ops, 1.5x FLOPs), the budget
MemAvailable x (1 - 0.4), per-layer times measured and the choices confirmed end to end one layer at a time
(``plan/parallax/measure``), the plan, its sub-models cut from the one int8 model. Configurations:
- ``whole-1t`` / ``whole-2t``: the int8 model as one interpreter on 1 / 2 XNNPACK threads;
- ``parallax``: the plan on 2 workers (``runtime/parallel``);
- ``all-branches``: every candidate layer forced branch-parallel (what cutting alone costs and saves);
- ``tight``: the plan under a budget below every layer's two smallest branch peaks (no parallelism left).
Latency: every configuration built in one fresh process, requests interleaved in a shuffled order, ``--requests``
each; ``--rounds`` processes, each round preceded by a two-process probe showing whether the second core is free;
medians over rounds of per-round medians. Peak RSS: each configuration alone in a fresh process, VmHWM (after
clear_refs 5) and a 2 ms sampler, above the resident set before its interpreters were built, ``--rounds``
rounds shuffled; medians. Arenas (Table 5) with the reference kernels, the arena being the span of
non-constant tensor addresses after ``allocate_tensors``.

Keys (ratios and errors are fractions):
- latency_vs_1t / latency_vs_2t: InceptionV3 whole model, parallax / whole-1t and / whole-2t. [Table 3]
- suffixes: InceptionV3's middle points' suffixes, the same ratios.
- table6: InceptionV3 per layer: branches, tasks, their times alone, branch-parallel vs 2 threads, mode.
- no_parallelism_overhead: worst of DenseNet201's plan (no parallel layer) and every model's ``tight`` over
  whole-2t.
- arena_vs_naive / arena_vs_global: worst over the models of the plan's estimated arenas (every sub-model
  built at once, as the runtime holds them) over the naive one-buffer-per-tensor total / over TFLite's
  measured arena of the whole model. [Table 5] Beside: the paper's cross-layer-sharing model (the largest
  stage) and the as-run sum of measured arenas.
- peak_rss_ratio: worst over the models of parallax / whole-2t peak RSS (and / whole-1t beside). [Table 4]
- peak_estimate_error_max: over every sub-model of every plan with a measured arena >= 0.5 MB,
  |estimated - measured| / measured.
- table7: nodes, layers, parallel layers, max branches — pre (ONNX), post (int8 TFLite, the emulated Edge TPU
  regions contracted), pruned (only the regions delegate pruning keeps: Appendix B's inequality with the
  EMULATED Edge TPU's fitted overhead and efficiency and the CPU's measured MAC rate, 1 thread; the paper's
  relaxed constants beside), cpu (int8 TFLite as the runtime runs it) and parallax (cpu refined). [Table 7]
- all_branches: InceptionV3 with every candidate layer forced branch-parallel (what the plan does when confirm
  keeps none is the whole model): the latency, arena and RSS ratios above for it.
- identical: 1 if every configuration of every model and suffix gives the int8 model's bits.
- hetero_layer_reduction: the encoder's layers whose branches are Edge TPU regions and CPU ops (Post
  placement): 1 - concurrent / in turn, the Edge TPU branches on the EMULATED device's clock, the CPU branches
  real (``hetero_layers``); the median over those layers is the value, the best layer and every layer beside
  (with the layer all on the CPU, which delegate pruning chooses for these small regions). [Table 6, SwinV2
  layer 53]
- second_core_free: the median over rounds of the two-process probe ratio (about 1 when the core is free).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import compiled, machine, publish, pyplot, second_core  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = {"InceptionV3": "inceptionv3_299", "DenseNet201": "densenet201_224",
          "light_inception_v1": "light_inception_v1", "encoder": "vit_encoder"}
WORKERS = 2
MARGIN = 0.4  # of MemAvailable, the paper's 30-50 %
CONFIGS = ("whole-1t", "whole-2t", "parallax", "all-branches", "tight")
MIB = 1 << 20


def log(msg: str) -> None:
    print(f"[parallax {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prepare(work: Path, zoo: str) -> Path:
    return compiled(work, zoo, log, also=(REPO / ".edgeplan" / "bench" / "flashmem",))


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


# ---------------------------------------------------------------------------------------------- plans
def save_stages(graph, plan, out: Path, tag: str) -> Path:
    """The plan's sub-models as files and their stage list (what a child process loads)."""
    from edgeplan.plan.parallax.measure import runtime_stages

    out.mkdir(parents=True, exist_ok=True)
    stages = []
    for st in runtime_stages(graph, plan, tag):
        subs = []
        for s in st.submodels:
            (out / f"{s.name}.tflite").write_bytes(s.data)
            subs.append({"name": s.name, "file": str(out / f"{s.name}.tflite"), "threads": s.threads})
        stages.append({"layer": st.layer, "submodels": subs})
    path = out / "stages.json"
    path.write_text(json.dumps(stages))
    return path


def load_runner(path: Path, deterministic: bool = False):
    from edgeplan.runtime.parallel import ParallelRunner, Stage, SubModel, interpreter_for

    stages = [Stage(s["layer"], tuple(SubModel(m["name"], Path(m["file"]).read_bytes(), m["threads"])
                                      for m in s["submodels"])) for s in json.loads(Path(path).read_text())]
    return ParallelRunner(stages, interpreter_for(deterministic), workers=WORKERS)


def plans_for(graph, name: str, out: Path) -> dict:
    """The measured plan, every candidate forced branch-parallel, and the tight budget's plan."""
    from edgeplan.plan.parallax import measure, schedule

    budget = int(mem_available() * (1 - MARGIN))
    cands = schedule.candidates(graph, workers=WORKERS, budget_bytes=budget)
    live = measure.activations(graph)
    layers = measure.measure(graph, cands, workers=WORKERS, repeats=9, live=live)
    confirmed, checks = measure.confirm(graph, layers, workers=WORKERS, budget_bytes=budget, repeats=25, live=live)
    chosen = schedule.plan(graph, confirmed, workers=WORKERS, budget_bytes=budget)
    forced = schedule.plan(graph, [replace(layer, mode="branches") if layer.task_ms else layer for layer in layers],
                           workers=WORKERS, budget_bytes=1 << 62)
    pairs = [sorted(layer.peaks)[:2] for layer in cands if len(layer.tasks) > 1]
    tight_budget = max(1, min((sum(p) for p in pairs), default=1) - 1)
    tight = schedule.plan(graph, schedule.candidates(graph, workers=WORKERS, budget_bytes=tight_budget),
                          workers=WORKERS, budget_bytes=tight_budget)
    plans = {"parallax": chosen, "all-branches": forced, "tight": tight}
    files = {k: save_stages(graph, p, out / k, f"{name}_{k}") for k, p in plans.items()}
    return {"budget_bytes": budget, "tight_budget_bytes": tight_budget, "plans": plans, "files": files,
            "confirm": checks}


# ---------------------------------------------------------------------------------------------- children
def build_config(spec: dict, config: str):
    """A callable serving one request of ``config``."""
    from edgeplan.quantize import litert
    from edgeplan.runtime.stream import invoke_named

    if config.startswith("whole-"):
        it = litert.interpreter(Path(spec["model"]).read_bytes(), deterministic=False, threads=int(config[6]))
        return lambda x: invoke_named(it, x)
    runner = load_runner(Path(spec["stages"][config]))
    return runner.run


def child_latency(spec: dict) -> dict:
    x = {spec["input_name"]: np.load(spec["input"])}
    runs = {c: build_config(spec, c) for c in spec["configs"]}
    want = runs["whole-1t"](x)
    same = {c: all(np.array_equal(run(x)[k], want[k]) for k in want) for c, run in runs.items()}
    ms: dict[str, list[float]] = {c: [] for c in runs}
    order = random.Random(spec["seed"])
    for _ in range(spec["requests"]):
        keys = list(runs)
        order.shuffle(keys)
        for c in keys:
            t = time.perf_counter()
            runs[c](x)
            ms[c].append((time.perf_counter() - t) * 1e3)
    return {"ms": {c: statistics.median(v) for c, v in ms.items()}, "identical": same}


def child_memory(spec: dict) -> dict:
    from edgeplan.pipeline.memory import rss
    from edgeplan.runtime import fifo, parallel  # noqa: F401  (every config's imports before the baseline)

    x = {spec["input_name"]: np.load(spec["input"])}
    base = rss()
    fifo.reset_hwm()
    with fifo.RssSampler() as sampler:
        run = build_config(spec, spec["config"])
        for _ in range(spec["requests"]):
            run(x)
    peak = max(fifo.hwm_bytes(), max(b for _, b in sampler.samples))
    return {"peak_bytes": peak - base, "baseline_bytes": base}


def run_child(kind: str, spec: dict) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(spec)],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"child {kind} failed: {res.stderr.strip().splitlines()[-3:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def latency(spec: dict, rounds: int) -> tuple[dict, list[dict]]:
    per_round, probes = [], []
    for r in range(rounds):
        probes.append(second_core())
        per_round.append(run_child("latency", {**spec, "seed": r}))
    out = {c: {"ms": statistics.median(p["ms"][c] for p in per_round),
               "ms_rounds": [round(p["ms"][c], 3) for p in per_round]} for c in spec["configs"]}
    for c in spec["configs"]:
        out[c]["identical"] = all(p["identical"][c] for p in per_round)
    return out, probes


def memory(spec: dict, configs: list[str], rounds: int, requests: int) -> dict:
    peaks: dict[str, list[int]] = {c: [] for c in configs}
    order = random.Random(5)
    for _ in range(rounds):
        keys = list(configs)
        order.shuffle(keys)
        for c in keys:
            peaks[c].append(run_child("memory", {**spec, "config": c, "requests": requests})["peak_bytes"])
    return {c: {"peak_bytes": statistics.median(v), "peak_bytes_runs": v} for c, v in peaks.items()}


# ---------------------------------------------------------------------------------------------- tables
def emulated_pruning(graph, cpu_macs_per_s: float):
    """Delegate pruning's regions and bounds with the EMULATED Edge TPU's fitted overhead and efficiency (the host
    of the class coral-usb-emulated) and the CPU's measured MAC rate."""
    from edgeplan.plan.parallax.prune import prune
    from edgeplan.profile import tpu_model

    tpu = tpu_model.for_host("desktop")
    return prune(graph, overhead_ms=tpu.overhead_ms, acc_macs_per_s=tpu.peak_macs_per_s * tpu.efficiency,
                 link_bytes_per_s=tpu.link_bytes_per_s, cpu_macs_per_s=cpu_macs_per_s)


def structure_rows(d: Path, graph, cpu_macs_per_s: float) -> dict:
    import onnx

    from edgeplan.compile import edgetpu_ops
    from edgeplan.compile.emulated import place_ops
    from edgeplan.graph.branches import from_onnx, from_tflite, refine, structure, tflite_flops
    from edgeplan.graph.model import GraphView
    from edgeplan.plan.parallax.prune import region_map

    def row(s, nodes: int) -> dict:
        return {"nodes": nodes, "layers": len(s.layers), "parallel_layers": s.parallel_layers,
                "max_branches": s.max_branches}

    pre = structure(from_onnx(GraphView(onnx.load(str(d / "model.onnx"), load_external_data=False))))
    regions, run = {}, 0
    for p in place_ops(graph, allow_multiple_subgraphs=True):
        if p.status == edgetpu_ops.MAPPED:
            regions[p.index] = run
        else:
            run += 1
    post = structure(from_tflite(graph, regions))
    pruned, bounds = emulated_pruning(graph, cpu_macs_per_s)
    kept = structure(from_tflite(graph, region_map(pruned)))
    cpu = structure(from_tflite(graph))
    tasks = refine(cpu, tflite_flops(graph))
    return {"pre": row(pre, len(from_onnx(GraphView(onnx.load(str(d / "model.onnx"),
                                                               load_external_data=False))).names)),
            "post": row(post, len(graph.ops) - len(regions) + len(set(regions.values()))),
            "pruned": {**row(kept, len(graph.ops) - len(region_map(pruned)) + sum(1 for r in pruned if r.keep)),
                       "regions": len(pruned), "kept": sum(1 for r in pruned if r.keep),
                       "relaxed_kept": sum(1 for r in pruned if r.relaxed_keep),
                       "cpu_macs_per_s": cpu_macs_per_s, "bound_l_r_acc_macs": bounds.l_r_acc,
                       "bound_l_r_cpu_macs": bounds.l_r_cpu,
                       "why": [r.why for r in pruned]},
            "cpu": row(cpu, len(graph.ops)),
            "parallax": {"nodes": len(graph.ops), "layers": len(tasks),
                         "parallel_layers": sum(1 for t in tasks if len(t) > 1),
                         "max_branches": max(len(t) for t in tasks)}}


def hetero_layers(graph, cpu_macs_per_s: float, repeats: int = 25) -> dict:
    """Table 6's heterogeneous layers (the paper's SwinV2 layer 53: 1 Edge TPU + 3 CPU branches) on the Post
    placement: every region the emulated compiler maps (multiple subgraphs) is one Edge TPU branch, held for its
    EMULATED offload time (``prune``'s L + F / R_acc + B / B_bw) on the device's clock, as the runtime's emulated
    accelerator does (``engine.wait_until``); the CPU branches are real sub-models on real threads. Per layer
    whose branches are each wholly Edge TPU or wholly CPU, with both kinds present, interleaved medians of:
    - ``in_turn``: the Edge TPU part, then the CPU branches as one sub-model on 2 XNNPACK threads (a delegated
      TFLite graph runs its partitions one after another);
    - ``concurrent``: the CPU branches packed by LPT on the 2 CPU workers while the device's clock runs;
    - ``cpu_only``: every branch on the CPU (what delegate pruning does with a region not worth offloading)."""
    from edgeplan.graph.branches import from_tflite, structure
    from edgeplan.plan.parallax.measure import activations
    from edgeplan.plan.parallax.schedule import lpt
    from edgeplan.profile.cpu import median_ms
    from edgeplan.quantize.stream import cut_ops
    from edgeplan.runtime.engine import wait_until
    from edgeplan.runtime.parallel import ParallelRunner, Stage, SubModel, interpreter_for
    from edgeplan.runtime.stream import invoke_named

    regions, _ = emulated_pruning(graph, cpu_macs_per_s)
    region_of = {i: r.index for r in regions for i in r.ops}
    s = structure(from_tflite(graph, region_of))
    live, build = activations(graph), interpreter_for(False)

    def packed(tag: str, tasks: list[tuple[int, ...]]) -> ParallelRunner:
        alone = []
        for i, ops in enumerate(tasks):
            it = build(cut_ops(graph, list(ops), f"{tag}t{i}"), 1)
            alone.append(median_ms(lambda: invoke_named(it, live), 5))
        subs = tuple(SubModel(f"{tag}w{w}", cut_ops(graph, sorted(v for i in b for v in tasks[i]), f"{tag}w{w}"), 1)
                     for w, b in enumerate(lpt(alone, WORKERS)))
        return ParallelRunner([Stage(0, subs)], build, workers=WORKERS)

    rows, skipped = [], 0
    for k, layer in enumerate(s.layers):
        kinds = [{region_of.get(v) for v in s.branches[b].nodes} for b in layer]
        on_tpu = [r for r in kinds if None not in r]
        on_cpu = [s.branches[b].nodes for b, r in zip(layer, kinds) if r == {None}]
        if len(on_tpu) + len(on_cpu) < len(layer):
            skipped += 1  # a branch mixing both: not this table's case
            continue
        if not on_tpu or not on_cpu:
            continue
        held = sorted({r for rs in on_tpu for r in rs})
        hold_s = sum(regions[r].offload_ms for r in held) / 1e3  # one device: its regions in turn (FCFS)
        cpu_ops = sorted(v for nodes in on_cpu for v in nodes)
        in_order = build(cut_ops(graph, cpu_ops, f"h{k}all"), WORKERS)
        branches = packed(f"h{k}", on_cpu)
        everything = packed(f"h{k}c", [*on_cpu, *(regions[r].ops for r in held)])

        def in_turn():
            wait_until(time.perf_counter() + hold_s)
            invoke_named(in_order, live)

        def concurrent():
            t0 = time.perf_counter()
            branches.run(live)
            wait_until(t0 + hold_s)

        works = {"in_turn": in_turn, "concurrent": concurrent, "cpu_only": lambda: everything.run(live)}
        ms: dict[str, list[float]] = {c: [] for c in works}
        for w in works.values():
            w()  # warm
        order = random.Random(k)
        for _ in range(repeats):  # interleaved, shuffled
            keys = list(works)
            order.shuffle(keys)
            for c in keys:
                ms[c].append(median_ms(works[c], 1))
        med = {c: statistics.median(v) for c, v in ms.items()}
        rows.append({"layer": k, "branches": f"{len(on_tpu)}D+{len(on_cpu)}", "tpu_regions": held,
                     "tpu_ms_emulated": hold_s * 1e3, "cpu_ops": len(cpu_ops), **{f"{c}_ms": v for c, v in med.items()},
                     "reduction": 1 - med["concurrent"] / med["in_turn"],
                     "pruned": all(not regions[r].keep for r in held)})
    reductions = [r["reduction"] for r in rows]
    return {"value": statistics.median(reductions) if reductions else None,
            "best": max(reductions, default=None), "layers": rows, "skipped_mixed_branches": skipped,
            "emulated": "Edge TPU branches: the emulated device's clock (desktop host, USB 3.0)"}


def arenas(graph, plans: dict, files: dict) -> dict:
    from edgeplan.plan.parallax.memory import naive_bytes
    from edgeplan.profile.capacity import arena_bytes
    from edgeplan.quantize import litert

    every = list(range(len(graph.ops)))
    naive = naive_bytes(graph, every)
    tflite = arena_bytes(litert.interpreter(graph.data, deterministic=True))
    out = {"naive_bytes": naive, "tflite_bytes": tflite, "plans": {}, "submodels": []}
    for k, plan in plans.items():
        runner = load_runner(files[k], deterministic=True)
        measured = [[arena_bytes(it) for it in its] for its in runner.interpreters]
        for st, m in zip(plan.stages, measured):
            out["submodels"] += [{"plan": k, "layer": st.layer, "estimated_bytes": e, "measured_bytes": a}
                                 for e, a in zip(st.peak_bytes, m)]
        out["plans"][k] = {"planned_bytes": plan.arena_bytes,
                           "shared_bytes": max(sum(s.peak_bytes) for s in plan.stages),
                           "as_run_bytes": sum(sum(m) for m in measured),
                           "submodels": sum(len(s.submodels) for s in plan.stages),
                           "parallel_layers": plan.parallel_layers, "why": plan.why}
    p = out["plans"]["parallax"]
    out["arena_vs_naive"] = p["planned_bytes"] / naive
    out["arena_vs_global"] = p["planned_bytes"] / tflite
    return out


def bench_graph(graph, name: str, out: Path, args, *, with_memory: bool) -> dict:
    """Plans, latency and (whole models) memory and arenas for one int8 graph."""
    made = plans_for(graph, name, out)
    (i,) = graph.inputs
    x_path = out / "input.npy"
    np.save(x_path, np.random.default_rng(7).integers(-128, 128, graph.tensors[i].shape, dtype=np.int8))
    model = out / "model_int8.tflite"
    model.write_bytes(graph.data)
    spec = {"model": str(model), "input": str(x_path), "input_name": graph.tensors[i].name,
            "stages": {k: str(v) for k, v in made["files"].items()}, "configs": list(CONFIGS),
            "requests": args.requests}
    log(f"{name}: latency, {args.rounds} rounds")
    lat, probes = latency(spec, args.rounds)
    chosen = made["plans"]["parallax"]
    res = {"ops": len(graph.ops), "budget_bytes": made["budget_bytes"],
           "tight_budget_bytes": made["tight_budget_bytes"], "latency": lat, "probe": probes,
           "latency_vs_1t": lat["parallax"]["ms"] / lat["whole-1t"]["ms"],
           "latency_vs_2t": lat["parallax"]["ms"] / lat["whole-2t"]["ms"],
           "tight_vs_2t": lat["tight"]["ms"] / lat["whole-2t"]["ms"],
           "all_branches_vs_2t": lat["all-branches"]["ms"] / lat["whole-2t"]["ms"],
           "all_branches_vs_1t": lat["all-branches"]["ms"] / lat["whole-1t"]["ms"],
           "parallel_layers": chosen.parallel_layers, "why": chosen.why, "confirm": made["confirm"],
           "table6": [{"layer": layer.index, "branches": layer.branches, "tasks": len(layer.tasks),
                       "task_ms": [round(t, 3) for t in layer.task_ms], "parallel_ms": layer.parallel_ms,
                       "threads_ms": layer.threads_ms, "mode": layer.mode, "why": layer.why}
                      for layer in chosen.layers if layer.branches > 1],
           "identical": int(all(v["identical"] for v in lat.values()))}
    log(f"{name}: parallax/1t {res['latency_vs_1t']:.3f}, /2t {res['latency_vs_2t']:.3f}, "
        f"{chosen.parallel_layers} parallel layers")
    if with_memory:
        log(f"{name}: arenas and peak RSS")
        res["arenas"] = arenas(graph, made["plans"], made["files"])
        res["memory"] = memory(spec, ["whole-1t", "whole-2t", "parallax", "all-branches"], args.rounds, 5)
        m = res["memory"]
        res["peak_rss_ratio"] = m["parallax"]["peak_bytes"] / m["whole-2t"]["peak_bytes"]
        res["peak_rss_vs_1t"] = m["parallax"]["peak_bytes"] / m["whole-1t"]["peak_bytes"]
        res["all_branches_rss_ratio"] = m["all-branches"]["peak_bytes"] / m["whole-2t"]["peak_bytes"]
    return res


def middle_suffixes(d: Path, count: int = 3) -> list[Path]:
    points = sorted((p for p in (d / "segments").iterdir() if (p / "suffix_int8.tflite").is_file()),
                    key=lambda p: int(p.name[1:]))
    inner = points[1:-1]
    if not inner:
        return []
    picks = sorted({round(k * (len(inner) - 1) / max(1, count - 1)) for k in range(count)})
    return [inner[k] / "suffix_int8.tflite" for k in picks]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "parallax",
                    help="compiled models and cut sub-models (default: .edgeplan/bench/parallax)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=30, help="requests per configuration per latency round")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 10 requests, no suffixes (marked quick)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, spec = args.child
        print(json.dumps((child_latency if kind == "latency" else child_memory)(json.loads(spec))))
        return 0
    if args.quick:
        args.rounds, args.requests = 2, 10
    from edgeplan.quantize.tflite_graph import TfliteGraph

    wanted = [m for m in args.models.split(",") if m]
    unknown = [m for m in wanted if m not in MODELS]
    if unknown:
        ap.error(f"--models: {', '.join(unknown)} unknown; choose from {', '.join(MODELS)}")
    result: dict = {"machine": machine(), "quick": args.quick, "rounds": args.rounds, "requests": args.requests,
                    "workers": WORKERS, "margin": MARGIN, "emulated": "table7 post column only (op placement)",
                    "models": {}}
    for name in wanted:
        d = prepare(args.work, MODELS[name])
        graph = TfliteGraph((d / "model_int8.tflite").read_bytes())
        out = args.work / "runs" / MODELS[name]
        res = bench_graph(graph, name, out, args, with_memory=True)
        cpu_macs_per_s = sum(graph.op_macs) / (res["latency"]["whole-1t"]["ms"] / 1e3)
        res["table7"] = structure_rows(d, graph, cpu_macs_per_s)
        if name == "encoder":
            log(f"{name}: layers mixing Edge TPU (EMULATED) and CPU branches")
            res["hetero"] = hetero_layers(graph, cpu_macs_per_s, repeats=10 if args.quick else 40)
        if name == "InceptionV3" and not args.quick:
            res["suffixes"] = {}
            for path in middle_suffixes(d):
                point = path.parent.name
                sg = TfliteGraph(path.read_bytes())
                r = bench_graph(sg, f"{name}_{point}", out / point, args, with_memory=False)
                res["suffixes"][point] = {k: r[k] for k in ("ops", "latency", "latency_vs_1t", "latency_vs_2t",
                                                            "parallel_layers", "identical", "why")}
        result["models"][name] = res
    ms = result["models"]
    inc = ms.get("InceptionV3")
    if inc:
        result["latency_vs_1t"] = inc["latency_vs_1t"]
        result["latency_vs_2t"] = inc["latency_vs_2t"]
        result["table6"] = inc["table6"]
        a = inc["arenas"]
        forced = a["plans"]["all-branches"]
        result["all_branches"] = {  # every candidate layer branch-parallel, whatever confirm said: beside
            "model": "InceptionV3", "parallel_layers": forced["parallel_layers"],
            "latency_vs_1t": inc["all_branches_vs_1t"], "latency_vs_2t": inc["all_branches_vs_2t"],
            "arena_vs_naive": forced["planned_bytes"] / a["naive_bytes"],
            "arena_vs_global": forced["planned_bytes"] / a["tflite_bytes"],
            "shared_vs_global": forced["shared_bytes"] / a["tflite_bytes"],
            "peak_rss_ratio": inc["all_branches_rss_ratio"]}
    overheads = [m["tight_vs_2t"] for m in ms.values()]
    if "DenseNet201" in ms:
        overheads.append(ms["DenseNet201"]["latency_vs_2t"])
    result["no_parallelism_overhead"] = {"value": max(overheads), "tight": {n: m["tight_vs_2t"] for n, m in ms.items()},
                                         "densenet201_plan": ms.get("DenseNet201", {}).get("latency_vs_2t")}
    result["arena_vs_naive"] = max(m["arenas"]["arena_vs_naive"] for m in ms.values())
    result["arena_vs_global"] = max(m["arenas"]["arena_vs_global"] for m in ms.values())
    result["peak_rss_ratio"] = max(m["peak_rss_ratio"] for m in ms.values())
    errors = [abs(s["estimated_bytes"] - s["measured_bytes"]) / s["measured_bytes"]
              for m in ms.values() for s in m["arenas"]["submodels"] if s["measured_bytes"] >= 500_000]
    result["peak_estimate_error_max"] = {"value": max(errors, default=0.0), "submodels": len(errors)}
    result["table7"] = {n: m["table7"] for n, m in ms.items()}
    result["identical"] = int(all(m["identical"] and all(s["identical"] for s in m.get("suffixes", {}).values())
                                  for m in ms.values()))
    if "encoder" in ms:
        result["hetero_layer_reduction"] = ms["encoder"]["hetero"]
    probes = [p["value"] for m in ms.values() for p in m["probe"]]
    result["second_core_free"] = {"value": statistics.median(probes), "rounds": probes}
    keys = ("latency_vs_1t", "latency_vs_2t", "no_parallelism_overhead", "arena_vs_naive", "arena_vs_global",
            "peak_rss_ratio", "peak_estimate_error_max", "hetero_layer_reduction", "identical", "second_core_free")
    publish("parallax", result, plot, tuple(k for k in keys if k in result))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(19, 9))
    models = result["models"]
    _bars(axes[0][0], models, [(c, lambda m, c=c: m["latency"][c]["ms"]) for c in CONFIGS],
          "median request ms (2 vCPU)", "Tables 3/6: latency per configuration (measured)")
    _bars(axes[0][1], models, [
        ("naive", lambda m: m["arenas"]["naive_bytes"] / MIB), ("TFLite", lambda m: m["arenas"]["tflite_bytes"] / MIB),
        ("Parallax planned", lambda m: m["arenas"]["plans"]["parallax"]["planned_bytes"] / MIB),
        ("Parallax as run", lambda m: m["arenas"]["plans"]["parallax"]["as_run_bytes"] / MIB),
        ("all branches as run", lambda m: m["arenas"]["plans"]["all-branches"]["as_run_bytes"] / MIB)],
        "arena MiB", "Table 5: arenas")
    _bars(axes[1][0], models, [(c, lambda m, c=c: m["memory"][c]["peak_bytes"] / MIB)
                               for c in ("whole-1t", "whole-2t", "parallax", "all-branches")],
          "peak RSS above baseline (MiB)", "Table 4: peak resident set (measured)")
    ax = axes[1][1]
    rows = [r for r in result.get("table6", []) if r["parallel_ms"] is not None]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["parallel_ms"] for r in rows], 0.4, label="branches on 2 workers")
    ax.bar([x + 0.2 for x in xs], [r["threads_ms"] for r in rows], 0.4, label="one sub-model, 2 threads")
    ax.set_xticks(list(xs), [str(r["layer"]) for r in rows])
    ax.set_xlabel("InceptionV3 layer")
    ax.set_ylabel("median ms")
    ax.set_title("Table 6: per candidate layer, the two modes")
    ax.legend(fontsize=8)
    ax = axes[0][2]
    rows = (result.get("hetero_layer_reduction") or {}).get("layers", [])
    xs = range(len(rows))
    for k, (key, label) in enumerate((("in_turn_ms", "in turn"), ("concurrent_ms", "concurrent"),
                                      ("cpu_only_ms", "all on the CPU"))):
        ax.bar([x + (k - 1) * 0.27 for x in xs], [r[key] for r in rows], 0.27, label=label)
    ax.set_xticks(list(xs), [f"{r['layer']}\n{r['branches']}" for r in rows], fontsize=7)
    ax.set_xlabel("encoder layer (Post placement), Edge TPU (D) + CPU branches")
    ax.set_ylabel("median ms")
    ax.set_title("Table 6: Edge TPU + CPU layers (Edge TPU EMULATED)")
    ax.legend(fontsize=8)
    axes[1][2].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax, models: dict, series: list, ylabel: str, title: str) -> None:
    """Grouped bars: one group per model, one bar per (label, value of a model's results)."""
    names, width = list(models), 0.8 / len(series)
    for k, (label, value) in enumerate(series):
        ax.bar([i + k * width for i in range(len(names))], [value(models[n]) for n in names], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


if __name__ == "__main__":
    sys.exit(main())
