"""Split one model over several devices (AutoDiCE §III-C, Fig. 2): a mapping puts units on keys (one MPI rank
each); each rank's units become *stages*, one model per stage, in float ONNX and in int8 TFLite, with the
communication tables, the rankfile and the hostfile.

A rank waiting for remote data between its layers (Fig. 2's rank 0: MaxPool1, then Add1 once Buff2 and Buff3
arrive) runs several stages. Stages are made walking the units in dependency order: a unit joins its rank's
open stage unless it reads a remote stage made after that one opened; so every stage reads only stages made
before it, and the creation order is an order the chain runs in — in one process for verification, or spread
over ranks as data arrives. Frames enter and leave at rank 0 (the head): it sends the input to whoever reads
it and receives the output.

Written (``out``): ``int8/s<k>.tflite`` (cut from ``model_int8.tflite``: the int8 tensors pass between stages
with their own quantization, so the chain gives the model's bits), ``float/s<k>.onnx`` (node subsets of the float
model; their weights point into a hard link of the model's own file, ``float/model.onnx``, never copied),
``tables.json``, ``rankfile``, ``hostfile``,
``platform.txt``, ``mapping.json`` and ``split.json`` (sizes, timings, verification). Nothing is written
when verification fails.
"""
from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgeplan.artifacts import external_data, link_or_copy, staged_dir, write_json_atomic
from edgeplan.errors import SpecError
from edgeplan.graph.model import GraphView, load_mapped, weights_folder
from edgeplan.graph.wire import external_stub
from edgeplan.plan.multidevice.spec import Mapping, Platform, mapping_doc
from edgeplan.plan.multidevice.units import Units
from edgeplan.quantize import litert
from edgeplan.quantize.stream import cut_ops, ops_boundary
from edgeplan.quantize.tflite_graph import TfliteGraph, np_dtype, tensor_bytes
from edgeplan.runtime.stream import invoke_named
from edgeplan.store.base import file_sha256

HEAD = 0


@dataclass(frozen=True)
class Stage:
    index: int  # creation order = an order the chain runs in
    rank: int
    units: tuple[int, ...]
    ops: tuple[int, ...]  # int8 ops
    nodes: tuple[int, ...]  # ONNX nodes
    inputs: tuple[int, ...]  # int8 tensors
    outputs: tuple[int, ...]


def unit_order(units: Units) -> list[int]:
    """Units in dependency order (lowest index first among the ready ones)."""
    n = len(units.units)
    done, order = 0, []
    while len(order) < n:
        ready = [u for u in range(n) if not (done >> u) & 1 and units.depends[u] & ~done == 0]
        if not ready:
            raise SpecError("the units depend on each other in a cycle: the int8 model fuses across branches")
        order.append(ready[0])
        done |= 1 << ready[0]
    return order


def stages(graph: TfliteGraph, units: Units, mapping: Mapping) -> list[Stage]:
    stage_of: dict[int, int] = {}
    open_stage: dict[int, int] = {}
    members: list[list[int]] = []
    ranks: list[int] = []
    for u in unit_order(units):
        r = mapping.unit_key[u]
        s = open_stage.get(r)
        producers = [p for p in range(len(units.units)) if (units.depends[u] >> p) & 1]
        if s is None or any(mapping.unit_key[p] != r and stage_of[p] > s for p in producers):
            s = len(members)
            members.append([])
            ranks.append(r)
            open_stage[r] = s
        stage_of[u] = s
        members[s].append(u)
    out = []
    for k, us in enumerate(members):
        ops = sorted(op for u in us for op in units.units[u].ops)
        nodes = sorted(i for u in us for i in units.units[u].nodes)
        ins, outs = ops_boundary(graph, ops)
        out.append(Stage(k, ranks[k], tuple(us), tuple(ops), tuple(nodes), tuple(ins), tuple(outs)))
    return out


# ------------------------------------------------------------------------------------------------- float
def float_stage(model: onnx.ModelProto, view: GraphView, nodes: tuple[int, ...], name: str, path: Path) -> None:
    """Write the nodes (a subset, in order) as a model to ``path``: inputs the activations they read and do not
    make, outputs those they make that another node or the model's output reads. An initializer the model holds
    as external data (``graph.model.load_mapped``) stays where it is: the caller links its file beside ``path``
    under its name (``split``). Other initializers of 1 KiB or more go to ``path``'s ``.weights`` file, written
    here from the model's own bytes; the smaller ones stay inline. (onnx's save with external data copied VGG-19's
    548 MB twice on the way, and opened the file per tensor: 2.3 s of the 24 sub-models' 3 s; writing them once
    per split still took 0.5-2 s and 548 MB of disk.)"""
    inside = set(nodes)
    made = {o for i in nodes for o in view.graph.node[i].output if o}
    reads = [x for i in nodes for x in view.graph.node[i].input if x]
    ins = list(dict.fromkeys(x for x in reads if x not in made and x not in view.initializers))
    wanted = {view.output.name} | {x for j, n in enumerate(view.graph.node) if j not in inside for x in n.input}
    outs = [o for i in nodes for o in view.graph.node[i].output if o in made and o in wanted]
    vi = {v.name: v for v in (*view.graph.input, *view.graph.value_info, *view.graph.output)}
    weights = path.with_suffix(".weights")
    inits, data, offset = [], [], 0
    for t in (view.initializers[x] for x in dict.fromkeys(reads) if x in view.initializers):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            inits.append(t)
            continue
        raw = t.raw_data  # a copy of the bytes at every read: read once
        if len(raw) >= 1024:
            inits.append(external_stub(t, weights.name, offset, len(raw)))
            data.append(raw)
            offset += len(raw)
        else:
            inits.append(t)
    if data:
        with open(weights, "wb") as f:
            f.writelines(data)
    g = helper.make_graph([view.graph.node[i] for i in nodes], name, [vi[x] for x in ins], [vi[x] for x in outs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    path.write_bytes(m.SerializeToString())


def _float_chain(paths: list[Path], f_in: str, f_out: str, xs: np.ndarray) -> np.ndarray:
    """The float stages run in order on each sample of ``xs`` (one session per stage, made once), with the options
    ``graph.evaluate`` runs the whole model with for matching (``quantize.match.match_tensors``: no prepacked
    weights); the output stacked."""
    import onnxruntime as ort

    from edgeplan.graph.evaluate import session_options

    sessions = [ort.InferenceSession(str(p), session_options(prepack=False), providers=["CPUExecutionProvider"])
                for p in paths]
    got = []
    for x in xs:
        live = {f_in: x[None].astype(np.float32)}
        for sess in sessions:
            names = [o.name for o in sess.get_outputs()]
            live.update(zip(names, sess.run(None, {i.name: live[i.name] for i in sess.get_inputs()})))
        got.append(live[f_out])
    return np.concatenate(got)


# ------------------------------------------------------------------------------------------------- tables
def tensor_detail(graph: TfliteGraph, ix: int) -> dict:
    """A tensor as the tables describe it: shape, dtype, bytes and int8 quantization (a fresh dict)."""
    t = graph.tensors[ix]
    return {"shape": list(t.shape), "dtype": t.dtype, "nbytes": tensor_bytes(graph, ix),
            "scale": list(t.scale), "zero_point": list(t.zero_point)}


def tables(graph: TfliteGraph, view: GraphView, units: Units, mapping: Mapping, platform: Platform,
           stage_list: list[Stage]) -> dict:
    """Sender and receiver tables (Fig. 2's, by MPI rank) and, per buffer, what both sides need."""
    name = {ix: graph.tensors[ix].name for ix in range(len(graph.tensors))}
    float_of = {ix: t for t, ix in units.int8_tensor.items()}
    model_in, model_out = graph.inputs[0], graph.outputs[0]
    made_by = {model_in: (-1, HEAD)}  # tensor -> (stage making it, its rank); the head feeds the input
    readers: dict[int, set[int]] = {model_out: {HEAD}}  # tensor -> ranks reading it; the head takes the output
    for s in stage_list:
        made_by.update((o, (s.index, s.rank)) for o in s.outputs)
        for i in s.inputs:
            readers.setdefault(i, set()).add(s.rank)
    buffers: dict[str, dict] = {}
    for ix in sorted(made_by, key=lambda i: (made_by[i][0], i)):
        sender = made_by[ix][1]
        remote = sorted(readers.get(ix, set()) - {sender})
        if remote:
            buffers[name[ix]] = {"tag": len(buffers), **tensor_detail(graph, ix), "float": float_of.get(ix),
                                 "sender": sender, "receivers": remote}
    sender: dict[str, dict] = {str(r): {} for r in range(len(mapping.keys))}
    receiver: dict[str, dict] = {str(r): {} for r in range(len(mapping.keys))}
    for b, d in buffers.items():
        sender[str(d["sender"])][b] = [str(r) for r in d["receivers"]]
        for r in d["receivers"]:
            receiver[str(r)][b] = [str(d["sender"])]
    ranks = []
    for r, key in enumerate(mapping.keys):
        dev = platform.device(key.device, f"mapping key {key.name!r}")
        ranks.append({"rank": r, "key": key.name, "device": dev.name, "host": dev.host, "slots": list(key.slots),
                      "stages": [s.index for s in stage_list if s.rank == r]})
    return {
        "head": HEAD,
        "input": {"name": name[model_in], **tensor_detail(graph, model_in), "float": view.input.name},
        "output": {"name": name[model_out], **tensor_detail(graph, model_out), "float": view.output.name,
                   "rank": made_by[model_out][1]},
        "ranks": ranks,
        "stages": [{"index": s.index, "rank": s.rank, "int8": f"int8/s{s.index}.tflite",
                    "float": f"float/s{s.index}.onnx", "inputs": [name[i] for i in s.inputs],
                    "outputs": [name[o] for o in s.outputs],
                    "layers": [view.graph.node[i].name for i in s.nodes]} for s in stage_list],
        "buffers": buffers,
        "sender": sender,
        "receiver": receiver,
    }


def rankfile(mapping: Mapping, platform: Platform) -> str:
    return "".join(f"rank {r}={platform.device(k.device, k.name).host} slot={','.join(map(str, k.slots))}\n"
                   for r, k in enumerate(mapping.keys))


def hostfile(mapping: Mapping, platform: Platform) -> str:
    """One line per host: its slots are the cores of the devices it holds (several on one host when testing)."""
    slots: dict[str, int] = {}
    for name in dict.fromkeys(k.device for k in mapping.keys):
        dev = platform.device(name, "hostfile")
        slots[dev.host] = slots.get(dev.host, 0) + len(dev.slots)
    return "".join(f"{h} slots={n}\n" for h, n in slots.items())


# ------------------------------------------------------------------------------------------------- split
def split(root: Path, units: Units, mapping: Mapping, platform: Platform, out: Path, *,
          xs: np.ndarray | None = None, int8_samples: int = 2, seed: int = 0, tolerance: float = 1e-4,
          loaded: tuple[onnx.ModelProto, TfliteGraph] | None = None) -> dict:
    """Write the split of the artifact ``root`` (``model.onnx``, ``model_int8.tflite``) to ``out``, verified first
    in a scratch directory: the float chain within ``tolerance`` x max(1, max|y|) of the model on the float inputs
    ``xs``, the int8 chain identical with both kernel sets. Returns split.json's content; raises SpecError (``out``
    untouched) when the chain does not verify.

    ``xs`` defaults to the inputs the units were matched on: matching ran the whole float model on them, so its
    output is the reference, not computed again (VGG-19: a session and two runs, 2.5 s). ``loaded``: the two
    models as the caller already read them from ``root`` (finding the units), not read and parsed again (1.3 s).

    The model file is hashed on a second thread while this one cuts and writes the stages. ``split_s`` is the time
    until both kinds of stage are written, ``total_s`` until verified (VGG-19: 12.0 s -> 6.1 s for matching, split
    and verification together, with the sessions' idle threads sleeping and no prepacked weights:
    ``graph.evaluate.session_options``; 4.4-4.7 s with the weights left in the model's file:
    ``graph.model.load_mapped``)."""
    t0 = time.perf_counter()
    if xs is None and units.reference is None:
        raise SpecError("no float inputs to verify the split on: give xs (the units carry none)")
    reference = units.reference if xs is None else (xs, None)
    if loaded is None:
        loaded = load_mapped(root / "model.onnx"), TfliteGraph((root / "model_int8.tflite").read_bytes())
    model, graph = loaded
    view = GraphView(model)
    int8_bytes = graph.data
    stage_list = stages(graph, units, mapping)
    with staged_dir(out) as scratch, ThreadPoolExecutor(1) as pool:
        (scratch / "int8").mkdir()
        (scratch / "float").mkdir()
        onnx_sha = pool.submit(file_sha256, root / "model.onnx")  # hashlib releases the GIL as it reads
        source = weights_folder(root / "model.onnx")
        for location in {loc for loc, _, _ in external_data(model).values()}:  # what the float stages point into
            link_or_copy(source / location, scratch / "float" / location)
        blobs, segs = {}, []
        for s in stage_list:
            data = cut_ops(graph, list(s.ops), f"s{s.index}")
            (scratch / "int8" / f"s{s.index}.tflite").write_bytes(data)
            blobs[f"int8/s{s.index}.tflite"] = hashlib.sha256(data).hexdigest()
            segs.append(data)
            float_stage(model, view, s.nodes, f"s{s.index}", scratch / "float" / f"s{s.index}.onnx")
        t_front = time.perf_counter() - t0
        table = tables(graph, view, units, mapping, platform, stage_list)
        int8 = verify_int8(segs, table, graph, int8_samples, seed)
        check = verify_float(scratch, table, model, reference, tolerance, source)
        why = "; ".join(w for w in (check.pop("why"), int8.pop("why")) if w)
        check = {**check, **int8, "ok": not why, "why": why}
        if not check["ok"]:
            raise SpecError(f"the split does not verify: {check['why']}; nothing written to {out}")
        for s in table["stages"]:
            s["int8_sha256"] = blobs[s["int8"]]
        write_json_atomic(scratch / "tables.json", table)
        (scratch / "rankfile").write_text(rankfile(mapping, platform))
        (scratch / "hostfile").write_text(hostfile(mapping, platform))
        (scratch / "platform.txt").write_text(platform.to_text())
        write_json_atomic(scratch / "mapping.json", mapping_doc(mapping, units))
        summary = {
            "model": {"onnx_sha256": onnx_sha.result(),
                      "int8_sha256": hashlib.sha256(int8_bytes).hexdigest()},
            "units": len(units.units), "ranks": len(mapping.keys), "stages": len(stage_list),
            "per_rank": [{"rank": r, "key": k.name, "stages": sum(1 for s in stage_list if s.rank == r),
                          "int8_param_bytes": sum(graph.op_param_bytes[o] for s in stage_list if s.rank == r
                                                  for o in s.ops),
                          "macs": sum(graph.op_macs[o] for s in stage_list if s.rank == r for o in s.ops)}
                         for r, k in enumerate(mapping.keys)],
            "buffers": len(table["buffers"]),
            "buffer_bytes": sum(b["nbytes"] for b in table["buffers"].values()),
            "verify": check, "split_s": round(t_front, 3), "total_s": round(time.perf_counter() - t0, 3),
        }
        write_json_atomic(scratch / "split.json", summary)
    return summary


def verify_float(d: Path, table: dict, model: onnx.ModelProto, reference: tuple[np.ndarray, np.ndarray | None],
                 tolerance: float, source: Path) -> dict:
    """The float stages (written in ``d``) run in order in this process against onnxruntime on the whole model
    (``reference``: the float inputs and the whole model's output for them, computed here when None; ``source``:
    the folder of the model's external data)."""
    from edgeplan.graph.evaluate import tensor_values

    f_in, f_out = table["input"]["float"], table["output"]["float"]
    xs, want = reference
    if want is None:
        want = tensor_values(model, [f_out], xs, prepack=False, folder=source)[f_out]
    got = _float_chain([d / s["float"] for s in table["stages"]], f_in, f_out, xs)
    diff = float(np.max(np.abs(got - want)))
    bound = tolerance * max(1.0, float(np.max(np.abs(want))))
    return {"float_max_abs_diff": diff, "float_bound": bound,
            "why": "" if diff <= bound else f"float chain differs by {diff:.3g} (> {bound:.3g})"}


def verify_int8(segs: list[bytes], table: dict, graph: TfliteGraph, samples: int, seed: int) -> dict:
    """The int8 stages (``segs``, in the tables' order) run in order in this process against the whole int8 model,
    with the reference kernels and with XNNPACK, on every core (integer arithmetic: the same bits on any number of
    threads)."""
    rng = np.random.default_rng(seed)
    i_name = table["input"]["name"]
    dt = np_dtype(graph.tensors[graph.inputs[0]])
    out, why = {}, []
    for kernels, deterministic in (("reference", True), ("xnnpack", False)):
        whole = litert.interpreter(graph.data, deterministic=deterministic, threads=litert.EVERY_CORE)
        its = [litert.interpreter(s, deterministic=deterministic, threads=litert.EVERY_CORE) for s in segs]
        same = 0
        for _ in range(samples):
            x = {i_name: litert.random_value(table["input"]["shape"], dt, rng)}
            ref = invoke_named(whole, x)
            live = dict(x)
            for it in its:
                live.update(invoke_named(it, live))
            same += all(np.array_equal(live[k], v) for k, v in ref.items())
        out[f"int8_identical_{kernels}"] = same / samples
        if same < samples:
            why.append(f"int8 chain ({kernels} kernels) differs from the model on {samples - same} of {samples} inputs")
    return {**out, "why": "; ".join(why)}
