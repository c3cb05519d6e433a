"""Campaign 4 of bench/reliability.py: model fuzzing. Broken models given to ``edgeplan compile`` (each trial
its own process, forked from the harness, which imported the CLI but not TensorFlow: ``_faults.Forked``),
into an artifact root that already holds other models' and versions' results.

Broken inputs (seeded), from a valid ONNX model (tiny_cnn's canonical model) and a valid ``.keras`` file:
bytes truncated, bit-flipped, zeroed, emptied or replaced by garbage (ONNX and Keras); and ONNX graphs with a
cycle, a dangling node input, an initializer removed, a weight of the wrong shape or byte count, zero or huge
input dimensions, an input of another dtype, an unknown op, an op of a custom domain, a second input or
output, no output, NaN, infinite or huge (finite) weights, an opset or IR version from the future, two nodes
writing one tensor, no nodes at all; and a valid model over the size limit (``ingest.max_model_bytes``, 4 MiB for
every trial here: tiny_cnn padded with an unused initializer past it).

The same for ``edgeplan run`` (the whole flow on its local Prefect server), each kind once: the fuzzed model's
chain fails in its ingest task, or runs through to a published revision when edgeplan can compile it.

Promise: the command exits 2 (or 0, for an input edgeplan can in fact compile: recorded per kind) with exactly
one ``error:`` line naming the file (or the artifact it was being compiled into), a node or a tensor; no
traceback; within a time limit; and every file already under the artifact root for other models and versions is
unchanged (sha256 of each, before and after).
"""
from __future__ import annotations

import hashlib
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from _faults import Forked, record
from onnx import TensorProto, helper, numpy_helper

KINDS = ("truncate", "flip", "zero", "empty", "garbage", "keras-truncate", "keras-flip", "cycle", "dangling",
         "no-initializer", "weight-shape", "weight-bytes", "zero-dim", "huge-dim", "input-dtype", "unknown-op",
         "custom-domain", "two-inputs", "two-outputs", "no-output", "nan-weights", "inf-weights", "huge-weight",
         "future-opset", "future-ir", "duplicate-output", "no-nodes", "oversize")
SIZE_LIMIT = 4 << 20  # ingest.max_model_bytes for every trial: an "oversize" model is a valid one padded past it


def _weights(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in m.graph.initializer if len(t.dims) >= 2]


def mutate(kind: str, onnx_bytes: bytes, keras_bytes: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A broken model of ``kind``: (bytes, file suffix)."""
    if kind.startswith("keras-"):
        data, suffix = keras_bytes, ".keras"
        kind = kind[len("keras-"):]
    else:
        data, suffix = onnx_bytes, ".onnx"
    if kind == "truncate":
        return data[:rng.randrange(1, len(data))], suffix
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.choice([1, 8, 64])):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b), suffix
    if kind == "zero":
        i = rng.randrange(len(data))
        return data[:i] + b"\0" * min(4096, len(data) - i) + data[i + 4096:], suffix
    if kind == "empty":
        return b"", suffix
    if kind == "garbage":
        return rng.randbytes(rng.choice([16, 1000, 100000])), suffix
    m = onnx.load_from_string(onnx_bytes)
    g = m.graph
    nodes = g.node  # edited in place
    if kind == "cycle":  # a node reads the output of a node after it
        i, j = sorted(rng.sample(range(len(nodes)), 2))
        nodes[i].input[0] = nodes[j].output[0]
    elif kind == "dangling":
        rng.choice(nodes).input[0] = "nowhere_" + str(rng.randrange(1000))
    elif kind == "no-initializer":
        g.initializer.remove(rng.choice(_weights(m)))
    elif kind == "weight-shape":
        w = rng.choice(_weights(m))
        a = numpy_helper.to_array(w)
        w.CopyFrom(numpy_helper.from_array(np.zeros(tuple(d + 1 for d in a.shape), a.dtype), w.name))
    elif kind == "weight-bytes":
        w = rng.choice(_weights(m))
        a = numpy_helper.to_array(w)
        w.raw_data = a.tobytes()[:-rng.choice([1, 4, 100])]
    elif kind in ("zero-dim", "huge-dim"):
        dims = g.input[0].type.tensor_type.shape.dim
        dims[rng.randrange(1, len(dims))].dim_value = 0 if kind == "zero-dim" else rng.choice([10**6, 2**31, 10**12])
    elif kind == "input-dtype":
        g.input[0].type.tensor_type.elem_type = rng.choice([TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL,
                                                            TensorProto.COMPLEX64])
    elif kind == "unknown-op":
        rng.choice(nodes).op_type = rng.choice(["FooOp", "Conv3DTransposeX", "", "Relu "])
    elif kind == "custom-domain":
        n = rng.choice(nodes)
        n.domain = "com.acme"
        m.opset_import.append(helper.make_opsetid("com.acme", 1))
    elif kind == "two-inputs":
        g.input.append(helper.make_tensor_value_info("second_input", TensorProto.FLOAT, [1, 3, 8, 8]))
        if rng.random() < 0.5:
            nodes[0].input.append("second_input")
    elif kind == "two-outputs":
        g.output.append(helper.make_tensor_value_info(nodes[len(nodes) // 2].output[0], TensorProto.FLOAT, None))
    elif kind == "no-output":
        del g.output[:]
    elif kind in ("nan-weights", "inf-weights"):
        w = rng.choice(_weights(m))
        a = numpy_helper.to_array(w).copy()
        flat = a.reshape(-1)
        for _ in range(rng.choice([1, 10, flat.size])):
            flat[rng.randrange(flat.size)] = np.nan if kind == "nan-weights" else rng.choice([np.inf, -np.inf])
        w.CopyFrom(numpy_helper.from_array(a, w.name))
    elif kind == "huge-weight":  # finite, but far out of any trained range (what one flipped exponent bit gives)
        w = rng.choice(_weights(m))
        a = numpy_helper.to_array(w).copy()
        a.reshape(-1)[rng.randrange(a.size)] = rng.choice([1e30, -1e36, 3e38])
        w.CopyFrom(numpy_helper.from_array(a, w.name))
    elif kind == "future-opset":
        m.opset_import[0].version = rng.choice([99, 1000])
    elif kind == "future-ir":
        m.ir_version = rng.choice([99, 1000])
    elif kind == "duplicate-output":
        i, j = sorted(rng.sample(range(len(nodes)), 2))
        nodes[j].output[0] = nodes[i].output[0]
    elif kind == "no-nodes":
        del g.node[:]
    elif kind == "oversize":
        pad = rng.randrange(1, 1 << 20)
        g.initializer.append(numpy_helper.from_array(np.zeros(SIZE_LIMIT // 4 + pad, np.float32), "padding"))
    else:
        raise ValueError(kind)
    return m.SerializeToString(), suffix


def _names(data: bytes) -> set[str]:
    """Node and tensor names a message could point at (none for bytes that do not parse)."""
    try:
        m = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001 (broken on purpose)
        return set()
    g = m.graph
    return ({n.name for n in g.node} | {o for n in g.node for o in n.output} | {i for n in g.node for i in n.input}
            | {t.name for t in g.initializer} | {v.name for v in g.input} | {v.name for v in g.output}) - {""}


def _tree(root: Path, skip: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and skip not in p.parents}


def _traceback(err: str, lines: int = 40) -> str:
    """The first traceback on ``err`` and the lines before it (what printed it), cut to ``lines`` lines."""
    at = err.splitlines()
    first = next(i for i, ln in enumerate(at) if "Traceback" in ln)
    return "\n".join(at[max(0, first - 5):first + lines])


def run_model_fuzz(onnx_path: Path, keras_path: Path, arts: Path, env: dict, trials: int, seed: int, work: Path,
                   limit_s: float = 300.0, kinds: tuple[str, ...] = KINDS, command: str = "compile") -> dict:
    """``trials`` broken models through ``edgeplan compile`` (``command`` "run": ``edgeplan run``, the whole flow
    on its local Prefect server, in ``work``; the server is stopped after) into ``arts`` (which holds other
    results): each of ``kinds`` once, in turn, then kinds drawn at random."""
    rng = random.Random(seed)
    onnx_bytes, keras_bytes = onnx_path.read_bytes(), keras_path.read_bytes()
    rows, violations = [], []
    inputs = work / "broken"
    inputs.mkdir(parents=True, exist_ok=True)
    limits = work / "fuzz_params.yaml"
    limits.write_text(f"ingest: {{max_model_bytes: {SIZE_LIMIT}}}\n")
    try:
        for i in range(trials):
            kind = kinds[i] if i < len(kinds) else rng.choice(kinds)
            data, suffix = mutate(kind, onnx_bytes, keras_bytes, rng)
            path = inputs / f"broken_{i:04d}{suffix}"
            path.write_bytes(data)
            name = "fuzzed" if command == "compile" else f"fuzzed{i}"  # run: each its own deployment (<name>-solo)
            target = arts / name / str(i)
            before = _tree(arts, target)
            proc = Forked(["--params", str(limits), command, str(path), "--name", name, "--version", str(i), "--out", str(arts)], env, work,
                          command, module="edgeplan.cli", cwd=work if command == "run" else None)
            try:
                rc = proc.wait(limit_s)
                timed_out = False
            except RuntimeError:
                rc, timed_out = proc.rc, True
            err = proc.stderr()
            errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
            broke = []
            if timed_out:
                broke.append(f"no answer in {limit_s:.0f} s")
            elif rc not in (0, 2):
                broke.append(f"exit {rc}")
            if "Traceback" in err:
                broke.append("a traceback")
            if rc == 2:
                if len(errors) != 1:
                    broke.append(f"{len(errors)} error lines")
                elif not (path.name in errors[0] or str(target) in errors[0] or any(
                        re.search(rf"\b{re.escape(n)}\b", errors[0]) for n in _names(data))):
                    broke.append("the error line names neither the file nor a node or tensor")
            after = _tree(arts, target)
            changed = sorted(k for k, v in before.items() if after.get(k) != v)
            if changed:
                broke.append(f"{len(changed)} files of other models or versions changed or lost: {changed[:3]}")
            record(rows, violations, {"trial": i, "seed": seed, "kind": kind, "file": path.name, "exit": rc,
                                      "seconds": round(getattr(proc, "seconds", limit_s), 2),
                                      "message": errors[0][:300] if errors else err.strip()[-300:],
                                      "stderr_lines": len(err.splitlines()), "violations": broke,
                                      **({"traceback": _traceback(err)} if "Traceback" in err else {})},
                   "model fuzzing, inputs", trials)
            path.unlink()
    finally:
        if command == "run":  # the runs' local Prefect server (beside the artifact root) stops with them
            subprocess.run([sys.executable, "-m", "edgeplan.cli", "server", "stop", "--out", str(arts)], cwd=work,
                           env=env, capture_output=True, check=False)
    print(file=sys.stderr)
    by: dict = {}
    for r in rows:
        b = by.setdefault(r["kind"], {"tried": 0, "exit_2": 0, "exit_0": 0, "violations": 0})
        b["tried"] += 1
        b["exit_2"] += r["exit"] == 2
        b["exit_0"] += r["exit"] == 0
        b["violations"] += bool(r["violations"])
    return {"tried": len(rows), "violations": len(violations),
            "tracebacks": sum(any("traceback" in v for v in r["violations"]) for r in rows),
            "collateral_damage": sum(any("changed or lost" in v for v in r["violations"]) for r in rows),
            "accepted": sum(r["exit"] == 0 for r in rows), "by_kind": by, "violated": violations, "rows": rows}


KERAS = """
import keras, sys
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
m.save(sys.argv[1])
"""


def small_keras(path: Path, env: dict) -> Path:
    """A small valid ``.keras`` file (made by Keras in a child process: this one never imports TensorFlow)."""
    import subprocess

    if not path.is_file():
        subprocess.run([sys.executable, "-c", KERAS, str(path)], env=env, check=True, capture_output=True)
    return path
