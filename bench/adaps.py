"""ADaPS figures (issue 16): Table 6 rerun, the search against exact optima, search time, bytes and latency of
the plans run as int8 tiles over MPI on EMULATED hosts beside the two baselines.

What runs (no flags needed):
- speed_d per device class: every conv of the int8 AlexNet timed alone on one thread inside a CPU cgroup
  capped at the class's quota (1.0 and 0.45 core, RPi 5B/4B-like; 0.5 and 0.22 for the 4-device set), and a
  least-squares line of seconds on MACs (``plan/spatial/speed``). No speed is entered by hand.
- ``table6``: a 224-wide 3x3 conv (64 -> 64 channels, int8) for D in {2, 4, 8, 16} devices (half of them of
  the fast class, half of the slow one; D = 2: one each) at thresholds 5-20 % and 10 Mbit/s, the holder the
  proportional split of the layer's input. Per cell: the space (log10, counted by the space's own DP, which
  tests check against enumeration), the tree's scored nodes ("visited"), memo hits, pruned sub-trees, the
  interval data terms its bound's dynamic programme evaluated (``bound_terms``: work beside the visited nodes,
  not counted in them), the pruning factor log10(space / visited), and the best score against the exhaustive
  search (D = 2; D = 4 at 5-10 %) and the exact per-layer DP (every cell). Headline: the largest visited /
  paper's visited.
- ``gap_max``: whole-network search vs the exact chain DP, two devices, VGG16 and AlexNet, 10 and 100 Mbit/s,
  at the paper's thresholds (5 % VGG16, 15 % otherwise) and at 15 % for VGG16 too.
- ``search_s``: every network at 2 and 4 devices and both links at the paper's threshold, CPU seconds of the
  search (one core: the search is single-threaded). Headline: the largest.
- ``data_reduction_planned``: bytes between devices inside the region the plans move (no scatter, no gather),
  ADaPS and BBGraP-like over EdgeFlow-like, from the plans. Headline: VGG16, 2 devices, 10 Mbit/s.
- Execution (AlexNet and VGG16; 2 and 4 devices; 10 and 100 Mbit/s): each plan (ADaPS, EdgeFlow-like,
  BBGraP-like) is split into int8 tiles (``surgery/spatial``: verified in process, builtin and XNNPACK kernels)
  and run as MPI ranks on EMULATED hosts (a network namespace, a cpu cgroup at the class's quota and a tbf link
  each: real processes, real TCP, the quota is a cap), one frame at a time; 3 rounds, each running every plan
  once (interleaved), 8 frames a launch with the first dropped: 21 latencies per plan, median.
  - ``int8_identical``: the smallest fraction of outputs equal to the whole int8 model's, over the in-process
    check (both kernel sets) and the MPI runs.
  - ``data_reduction``: application bytes (counted by the ranks as they send: scatter, exchange, gather) per
    frame, ADaPS / EdgeFlow-like; beside it the wire bytes (tx of every host's veth) per frame, a launch's
    own traffic (daemons, wire-up) removed by subtracting a one-frame launch. Headline: VGG16, 2 devices,
    10 Mbit/s; ``wire_over_app_max_error`` how far the two counts are apart. Beside it,
    ``data_reduction_at_15pct``: the same cell planned (ADaPS and EdgeFlow-like) at 15 %, as the other networks
    are (``RUN_ALSO``; its cell is ``VGG16/2dev/10M@0.15``), with its latency ratio.
  - ``latency_vs_baselines``: median latency ADaPS / EdgeFlow-like (and BBGraP-like's). Headline: VGG16, 2
    devices, 10 Mbit/s.
  - ``model_mape``: |eq. (12) score - measured latency| / measured over every plan run. The score leaves out
    the head's suffix (the Type 3 rest of the model) and the gather; no target.
  - ``max_abs_diff``: the float ONNX tiles of every plan run and every multi-path plan (``surgery/spatial_float``:
    cut as the int8 tiles, each reading the rows the tiles before it computed, onnxruntime at ORT_ENABLE_BASIC on
    one thread, a short tile's convolution blocked as the whole tensor's) against the whole float model (the same
    settings) at every row they keep, two seeded inputs in [-1, 1]; the largest |difference| over all of them, the
    plans not exact, and the largest difference relative to the largest value compared.

The first layer's input is scored as sent by the head (the scatter; ``cost.source``). Regions: VGG16 and AlexNet
partition up to their flatten; MobileNetV2 stops at its first residual branch and InceptionV3 at its first
branch (their chain regions; ``regions``). Path analysis (§4.2, ``plan/spatial/paths``) takes both further
(``regions.<net>.paths``: layers, sub-blocks, merges, the tensors gathered), and ``path_tiles`` plans those
multi-path regions at 2 and 4 devices (10 Mbit/s) with ADaPS and both baselines (sub-block by sub-block), cuts
them into int8 tiles and float tiles, verifies both in process and runs them as MPI ranks on EMULATED hosts,
interleaved (counted in ``int8_identical`` and ``max_abs_diff``; latency and bytes against EdgeFlow-like reported
without target).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import compiled, int8_frames, machine, publish, pyplot
from edgeplan.graph.ingest import canonicalise, load_any
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial import baselines, oracle, paths, search, speed
from edgeplan.plan.spatial.blocks import region
from edgeplan.plan.spatial.cost import (
    Device,
    Layer,
    LayerCost,
    Space,
    network_bytes,
    proportional,
)
from edgeplan.plan.spatial.intervals import Window
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.zoo import registry

WORK = Path(".edgeplan/bench/adaps")
CGROUP = Path("/sys/fs/cgroup/cpu")
QUOTAS = {"rpi5": 1.0, "rpi4": 0.45, "half": 0.5, "fifth": 0.22}
LINKS = {"10M": 10e6 / 8, "100M": 100e6 / 8}
NETWORKS = {"VGG16": ("vgg16_224", 0.05), "AlexNet": ("alexnet_224", 0.15),
            "MobileNetV2": ("mobilenetv2_224", 0.15), "InceptionV3": ("inceptionv3_299", 0.15)}
PAPER_T6 = {  # Table 6: (space log10, visited) per devices and threshold
    2: [(2.5, 26), (3.1, 48), (3.4, 70), (3.6, 92)], 4: [(5.7, 389), (7.4, 1355), (8.2, 2600), (9.0, 4622)],
    8: [(9.8, 966), (13.3, 3417), (15.5, 7344), (17.2, 12747)],
    16: [(17.1, 2501), (21.1, 5174), (26.6, 16528), (28.7, 43121)]}
THRESHOLDS = (0.05, 0.10, 0.15, 0.20)
RUN_NETWORKS = {"AlexNet": ("alexnet_224", 0.15), "VGG16": ("vgg16_224", 0.05)}  # run as MPI ranks
# also run, beside the cells above (their keys end in @threshold): VGG16 at the other networks' 15 %, where its
# plans may overlap enough rows to fuse layers (at 5 % eq. (3) leaves the slow device 7 rows beyond its minimum)
RUN_ALSO = (("VGG16", 2, "10M", 0.15),)
ROUNDS, FRAMES = 3, 8  # per plan: 3 interleaved launches of 8 frames, the first of each dropped: 21 latencies
EMULATED = "bench-adaps"
RETRIES: list[str] = []  # launches that failed once and were run again (in the results)
PAPER_T4 = {("AlexNet", "10M"): (1.45, 0.73), ("AlexNet", "100M"): (1.45, 0.96), ("VGG16", "10M"): (1.08, 0.46),
            ("VGG16", "100M"): (1.08, 0.61), ("MobileNetV2", "10M"): (0.50, 0.52),
            ("MobileNetV2", "100M"): (0.51, 0.53), ("InceptionV3", "10M"): (2.18, 0.97),
            ("InceptionV3", "100M"): (2.17, 0.98)}
PAPER_T5 = {("AlexNet", "10M"): (1.05, 0.88), ("AlexNet", "100M"): (0.86, 0.72), ("VGG16", "10M"): (0.98, 0.81),
            ("VGG16", "100M"): (0.98, 0.81), ("MobileNetV2", "10M"): (0.92, 0.93),
            ("MobileNetV2", "100M"): (0.71, 0.72), ("InceptionV3", "10M"): (1.22, 1.09),
            ("InceptionV3", "100M"): (1.29, 1.10)}


def log(msg: str) -> None:
    print(f"[adaps] {msg}", flush=True)


def canonical(zoo: str) -> onnx.ModelProto:
    path = WORK / f"{zoo}.onnx"
    if not path.is_file():
        log(f"building {zoo}")
        model = canonicalise(load_any(registry.build(zoo, WORK / "zoo")), source=zoo)
        onnx.save(model, path)
    return onnx.load(path, load_external_data=False)


def devices_for(n: int, speeds: dict, bw: float) -> tuple[Device, ...]:
    fast, slow = ("rpi5", "rpi4") if n == 2 else ("half", "fifth")
    mk = lambda c, i: Device(f"{c}-{i}", speeds[c]["s_per_mac"], bw, speeds[c]["s_per_layer"])
    return tuple(mk(fast, i) for i in range(n // 2)) + tuple(mk(slow, i) for i in range(n // 2))


def table6(speeds: dict) -> list[dict]:
    layer = Layer("conv224", Window.same(3, 1, 224), 224 * 224 * 64 * 64 * 9, 224 * 64, 224 * 64)
    cells = []
    for n in (2, 4, 8, 16):
        devices = devices_for(n, speeds, LINKS["10M"])
        cost = LayerCost(layer, devices)
        holder = proportional(224, devices)
        for k, thr in enumerate(THRESHOLDS):
            space = Space.of(224, devices, thr)
            counters = search.Counters()
            t0 = time.process_time()
            best, _ = search.LayerTree(cost, space, holder, counters=counters).search()
            tree_s = time.process_time() - t0
            dp, _ = oracle.layer_dp(cost, space, holder)
            cell = {"devices": n, "threshold": thr, "space_log10": math.log10(space.count()),
                    "visited": counters.scored, "memo_hits": counters.memo_hits, "pruned": counters.pruned,
                    "bound_terms": counters.bound_terms,
                    "pruning_factor_log10": math.log10(space.count() / counters.scored), "best_s": best,
                    "dp_s": dp, "above_dp": best / dp - 1, "search_s": tree_s,
                    "paper": {"space_log10": PAPER_T6[n][k][0], "visited": PAPER_T6[n][k][1]}}
            if n == 2 or (n == 4 and thr <= 0.10):
                ex, _, count = oracle.exhaustive(cost, space, holder)
                assert count == space.count()
                cell["exhaustive_s"] = ex
                cell["equals_exhaustive"] = bool(abs(best - ex) <= 1e-9 * ex)
            cells.append(cell)
            log(f"table6 D={n} thr={thr:.2f}: space 10^{cell['space_log10']:.1f}, visited {counters.scored} "
                f"(paper {PAPER_T6[n][k][1]}), above DP {cell['above_dp']:.2e}")
    return cells


def path_figures(view: GraphView) -> dict:
    """The multi-path region path analysis finds (§4.2): layers, sub-blocks, merges, the tensors gathered."""
    p = paths.analyse(view, "H")
    return {"layers": len(p.layers), "sub_blocks": len(p.blocks), "merges": sum(len(x.inputs) > 1 for x in p.layers),
            "gathered": list(p.outputs), "ends": p.reason}


def path_tiles(speeds: dict) -> dict:
    """MobileNetV2's and InceptionV3's multi-path regions (path analysis) planned sub-block by sub-block at 2 and 4
    devices (10 Mbit/s) by ADaPS and both baselines (each sub-block a chain, ``baselines.*_paths``), cut into int8
    tiles verified in process (both kernel sets) and float tiles verified against the float model
    (``spatial.split``), then run as MPI ranks on EMULATED hosts as ``execution`` runs the chain plans."""
    cells = {}
    for net in ("MobileNetV2", "InceptionV3"):
        zoo, thr = NETWORKS[net]
        art = compiled(WORK, zoo, log)
        p = paths.analyse(GraphView(onnx.load(str(art / "model.onnx"), load_external_data=False)), "H")
        for n in (2, 4):
            key = f"{net}/{n}dev/10M"
            devices = devices_for(n, speeds, LINKS["10M"])
            plans = {"adaps": paths.search_paths(p, devices, thr), "edgeflow": baselines.edgeflow_paths(p, devices, thr),
                     "bbgrap": baselines.bbgrap_paths(p, devices)}
            cell = run_plans(key, art, plans, devices, paths=p)
            cell.update(layers=len(p.layers), sub_blocks=len(p.blocks))
            cells[key] = cell
            log(f"{key} multi-path: {len(p.layers)} layers in {len(p.blocks)} sub-blocks, ADaPS searched in "
                f"{plans['adaps'].seconds:.1f} s, {cell['adaps']['stages']} stages")
    return cells


def networks(speeds: dict) -> tuple[dict, dict, dict, dict]:
    gaps, times, reduction, regions = {}, {}, {}, {}
    for net, (zoo, thr) in NETWORKS.items():
        r = region(GraphView(canonical(zoo)), "H")
        layers = list(r.layers)
        regions[net] = {"layers": len(layers), "ends": r.reason,
                        "paths": path_figures(GraphView(canonical(zoo)))}
        for n in (2, 4):
            for link, bw in LINKS.items():
                devices = devices_for(n, speeds, bw)
                plan = search.search_network(layers, devices, thr)
                costs = search.costs_of(layers, devices)
                ef, bb = baselines.edgeflow(layers, devices, thr), baselines.bbgrap(layers, devices)
                key = f"{net}/{n}dev/{link}"
                times[key] = plan.seconds
                b_ef = network_bytes(costs, list(ef.partitions))
                reduction[key] = {"adaps_bytes": network_bytes(costs, list(plan.partitions)), "edgeflow_bytes": b_ef,
                                  "bbgrap_bytes": network_bytes(costs, list(bb.partitions)),
                                  "score_s": {"adaps": plan.score, "edgeflow": ef.score, "bbgrap": bb.score}}
                if b_ef:
                    reduction[key]["adaps"] = reduction[key]["adaps_bytes"] / b_ef
                    reduction[key]["bbgrap"] = reduction[key]["bbgrap_bytes"] / b_ef
                paper = (PAPER_T4 if n == 2 else PAPER_T5).get((net, link))
                if paper:
                    reduction[key]["paper"] = {"bbgrap": paper[0], "adaps": paper[1]}
                if n == 2 and net in ("VGG16", "AlexNet"):
                    for t in sorted({thr, 0.15}):
                        p = plan if t == thr else search.search_network(layers, devices, t)
                        best, _ = oracle.chain_dp(costs, search.spaces_of(layers, devices, t))
                        gaps[f"{key}/{t:.2f}"] = {"search_s": p.score, "exact_s": best, "gap": p.score / best - 1}
                log(f"{key}: search {plan.seconds:.2f} s, bytes vs EdgeFlow-like "
                    f"{reduction[key].get('adaps', float('nan')):.2f} (BBGraP-like "
                    f"{reduction[key].get('bbgrap', float('nan')):.2f})")
    return gaps, times, reduction, regions


def _launch(split: Path, frames: int, state: dict) -> dict:
    """One mpirun of ``frames`` frames, one at a time (``--window 0``: the head feeds a frame once the last is
    out); the veths' bytes counted around it."""
    from edgeplan.distributed import emulate, launch

    before = emulate.link_bytes(state)
    r = launch.run(split, frames=frames, timeout_s=900, deadline_s=120, mpi_args=emulate.mpi_args(EMULATED),
                   extra=["--inputs", str(split / "x.npy"), "--out", str(split / "y.npy"), "--window", "0"])
    if r.startup_retries:  # mpirun's start-up failed (launch.STARTUP_FAILURE) and the launch was made again
        RETRIES.append(f"{split}: {r.startup_retries} start-up failure(s)")
    after = emulate.link_bytes(state)
    return {"summary": r.summary, "wire_bytes": sum(after[h]["tx"] - before[h]["tx"] for h in after),
            "app_bytes": sum(k["sent_bytes"] for k in r.summary["ranks"])}


def execution(speeds: dict) -> dict:
    """Plans of ADaPS and both baselines split into int8 tiles and run as MPI ranks on EMULATED hosts (network
    namespaces, cpu cgroups at the classes' quotas, tbf links), interleaved; see the module docstring."""
    runs = [(net, n, link, thr, f"{net}/{n}dev/{link}") for net, (_, thr) in RUN_NETWORKS.items() for n in (2, 4)
            for link in LINKS]
    runs += [(net, n, link, thr, f"{net}/{n}dev/{link}@{thr:g}") for net, n, link, thr in RUN_ALSO]
    cells, regions = {}, {}
    for net, n, link, thr, key in runs:
        if net not in regions:  # each network's model read once (VGG16's model.onnx: 553 MB)
            art = compiled(WORK, RUN_NETWORKS[net][0], log)
            regions[net] = art, region(GraphView(onnx.load(str(art / "model.onnx"), load_external_data=False)), "H")
        art, float_region = regions[net]
        layers = list(float_region.layers)
        devices = devices_for(n, speeds, LINKS[link])
        plans = {"adaps": search.search_network(layers, devices, thr),
                 "edgeflow": baselines.edgeflow(layers, devices, thr), "bbgrap": baselines.bbgrap(layers, devices)}
        cell = run_plans(key, art, plans, devices, region=float_region)
        costs = search.costs_of(layers, devices)
        for k, p in plans.items():
            cell[k]["planned_region_bytes"] = network_bytes(costs, list(p.partitions))
        cells[key] = cell
    return cells


def run_plans(key: str, art: Path, plans: dict, devices: tuple[Device, ...], **split: object) -> dict:
    """Each plan split (``spatial.split`` with ``split``: the float region or the paths) onto EMULATED hosts like
    ``devices`` (their classes' quotas, their link), then run as MPI ranks, the plans interleaved: per plan the
    median latency, application and wire bytes per frame, outputs against the whole int8 model, the split's
    checks; and ADaPS's and BBGraP-like's over EdgeFlow-like's."""
    from edgeplan.distributed import emulate
    from edgeplan.plan.multidevice import spec
    from edgeplan.surgery import spatial

    graph = TfliteGraph((art / "model_int8.tflite").read_bytes())
    xs, want = int8_frames(graph, FRAMES, seed=7)
    text = "".join(f"dev{i}, cpu, slots=0, net={d.bytes_per_s:g}, quota={QUOTAS[d.name.rsplit('-', 1)[0]]:g}\n"
                   for i, d in enumerate(devices))
    hosts = emulate.up(EMULATED, spec.parse_text(text, "platform"))
    try:
        state = emulate.load(EMULATED)
        splits, runs = {}, {k: [] for k in plans}
        for k, p in plans.items():
            out = WORK / "splits" / key.replace("/", "-") / k
            info = spatial.split(art, list(p.partitions), list(hosts.devices), out, **split)
            np.save(out / "x.npy", xs)
            one = _launch(out, 1, state)  # the launch's own traffic (daemons, wire-up), one frame
            splits[k] = {"verify": info["verify"], "bytes_per_frame": info["bytes"], "stages": info["stages"],
                         "one_frame": one}
        for _ in range(ROUNDS):  # interleaved: each round runs every plan once
            for k in plans:
                runs[k].append(_launch(WORK / "splits" / key.replace("/", "-") / k, FRAMES, state))
    finally:
        emulate.down(EMULATED)
    cell = {}
    for k, p in plans.items():
        lat = [b - a for r in runs[k] for a, b in zip(r["summary"]["frame_done_s"], r["summary"]["frame_done_s"][1:])]
        got = np.load(WORK / "splits" / key.replace("/", "-") / k / "y.npy")
        one = splits[k]["one_frame"]
        wire = float(np.median([(r["wire_bytes"] - one["wire_bytes"]) / (FRAMES - 1) for r in runs[k]]))
        app = float(np.median([(r["app_bytes"] - one["app_bytes"]) / (FRAMES - 1) for r in runs[k]]))
        cell[k] = {"latency_s": float(np.median(lat)), "latencies": len(lat), "score_s": p.score,
                   "search_s": p.seconds, "app_bytes_per_frame": app, "wire_bytes_per_frame": wire,
                   "wire_over_app": wire / app if app else None,
                   "int8_identical_mpi": float(np.mean([np.array_equal(a, b) for a, b in zip(got, want)])),
                   **splits[k]["verify"], "bytes_by_kind": splits[k]["bytes_per_frame"], "stages": splits[k]["stages"]}
    for k in ("adaps", "bbgrap"):
        cell[f"{k}_over_edgeflow"] = {
            "latency": cell[k]["latency_s"] / cell["edgeflow"]["latency_s"],
            "app_bytes": cell[k]["app_bytes_per_frame"] / cell["edgeflow"]["app_bytes_per_frame"],
            "wire_bytes": cell[k]["wire_bytes_per_frame"] / cell["edgeflow"]["wire_bytes_per_frame"]}
    log(f"{key}: latency ADaPS {1e3 * cell['adaps']['latency_s']:.0f} ms, EdgeFlow-like "
        f"{1e3 * cell['edgeflow']['latency_s']:.0f} ms, BBGraP-like {1e3 * cell['bbgrap']['latency_s']:.0f} ms; bytes "
        f"ADaPS/EdgeFlow-like {cell['adaps_over_edgeflow']['app_bytes']:.2f} (wire "
        f"{cell['adaps_over_edgeflow']['wire_bytes']:.2f}); identical over MPI "
        f"{min(cell[k]['int8_identical_mpi'] for k in plans)}")
    return cell


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    cells = result["table6"]["cells"]
    labels = [f"D{c['devices']}\n{int(c['threshold'] * 100)}%" for c in cells]
    x = range(len(cells))
    axes[0].bar([i - 0.2 for i in x], [c["visited"] for c in cells], 0.4, label="edgeplan (counted)")
    axes[0].bar([i + 0.2 for i in x], [c["paper"]["visited"] for c in cells], 0.4, label="paper Table 6")
    axes[0].set_yscale("log")
    axes[0].set_xticks(list(x), labels, fontsize=6)
    axes[0].set_ylabel("visited nodes")
    axes[0].set_title("Table 6: one 224-wide conv layer")
    axes[0].legend()
    red = result["data_reduction_planned"]["cells"]
    keys = [k for k in red if "adaps" in red[k]]
    axes[1].barh(keys, [red[k]["adaps"] for k in keys], label="ADaPS")
    axes[1].barh(keys, [red[k]["bbgrap"] for k in keys], alpha=0.4, label="BBGraP-like")
    axes[1].axvline(1.0, color="k", lw=0.8)
    axes[1].tick_params(axis="y", labelsize=6)
    axes[1].set_xlabel("planned bytes / EdgeFlow-like")
    axes[1].legend()
    cells = result["latency_vs_baselines"]["cells"]
    keys = list(cells)
    y = range(len(keys))
    axes[2].barh([i + 0.2 for i in y], [cells[k]["adaps"] for k in keys], 0.4, label="ADaPS latency")
    axes[2].barh([i - 0.2 for i in y], [result["data_reduction"]["cells"][k]["adaps"]["app_bytes"] for k in keys],
                 0.4, label="ADaPS bytes (measured)")
    axes[2].axvline(1.0, color="k", lw=0.8)
    axes[2].set_yticks(list(y), keys, fontsize=6)
    axes[2].set_xlabel("ADaPS / EdgeFlow-like, MPI on EMULATED hosts")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args()
    if os.geteuid() != 0 or not CGROUP.is_dir():
        print("bench/adaps: needs root and the cpu cgroup (v1) to hold each class to its quota", file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    alex = compiled(WORK, "alexnet_224", log)
    speeds = {}
    for name, quota in QUOTAS.items():
        speeds[name] = speed.measure(alex / "model_int8.tflite", quota)
        log(f"{name} ({quota} core): {1e12 * speeds[name]['s_per_mac']:.1f} ps/MAC, "
            f"{1e3 * speeds[name]['s_per_layer']:.2f} ms/layer")
    cells = table6(speeds)
    gaps, times, reduction, regions = networks(speeds)
    head = reduction["VGG16/2dev/10M"]
    multi = path_tiles(speeds)
    runs = execution(speeds)
    plans = [c[k] for c in runs.values() for k in ("adaps", "edgeflow", "bbgrap")]
    multi_plans = [c[k] for c in multi.values() for k in ("adaps", "edgeflow", "bbgrap")]
    result = {
        "machine": machine(),
        "speeds": speeds,
        "table6": {"value": max(c["visited"] / c["paper"]["visited"] for c in cells),
                   "equals_exhaustive": all(c.get("equals_exhaustive", True) for c in cells),
                   "above_dp_max": max(c["above_dp"] for c in cells), "cells": cells},
        "gap_max": max(g["gap"] for g in gaps.values()),
        "gaps": gaps,
        "search_s": {"value": max(times.values()), "per": times},
        "data_reduction_planned": {"value": head["adaps"], "cells": reduction},
        "int8_identical": min(min(p["int8_identical_builtin"], p["int8_identical_xnnpack"], p["int8_identical_mpi"])
                              for p in [*plans, *multi_plans]),
        "path_tiles": multi,
        "max_abs_diff": {"value": max(p["float_max_abs_diff"] for p in [*plans, *multi_plans]),
                         "plans": len(plans), "multi_path_plans": len(multi_plans),
                         "plans_not_exact": sum(p["float_max_abs_diff"] > 0 for p in [*plans, *multi_plans]),
                         "relative_max": max(p["float_max_abs_diff"] / p["float_max_abs_value"]
                                             for p in [*plans, *multi_plans]),
                         "values_compared": sum(p["float_values_compared"] for p in [*plans, *multi_plans])},
        "data_reduction_at_15pct": {"value": runs["VGG16/2dev/10M@0.15"]["adaps_over_edgeflow"]["app_bytes"],
                                    "latency": runs["VGG16/2dev/10M@0.15"]["adaps_over_edgeflow"]["latency"],
                                    "cell": "VGG16/2dev/10M@0.15"},
        "data_reduction": {"value": runs["VGG16/2dev/10M"]["adaps_over_edgeflow"]["app_bytes"],
                           "cells": {k: {"adaps": c["adaps_over_edgeflow"], "bbgrap": c["bbgrap_over_edgeflow"]}
                                     for k, c in runs.items()},
                           "wire_over_app_max_error": max(abs(p["wire_over_app"] - 1) for p in plans)},
        "latency_vs_baselines": {"value": runs["VGG16/2dev/10M"]["adaps_over_edgeflow"]["latency"],
                                 "cells": {k: {"adaps": c["adaps_over_edgeflow"]["latency"],
                                               "bbgrap": c["bbgrap_over_edgeflow"]["latency"]}
                                           for k, c in runs.items()}},
        "model_mape": float(np.mean([abs(p["score_s"] - p["latency_s"]) / p["latency_s"] for p in plans])),
        "execution": runs,
        "launch_retries": RETRIES,
        "regions": regions,
    }
    publish("adaps", result, plot, ("table6", "gap_max", "search_s", "data_reduction_planned", "int8_identical",
                                    "max_abs_diff", "data_reduction", "latency_vs_baselines", "model_mape"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
