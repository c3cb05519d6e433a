"""Shared helpers for benchmarks: machine description and result writing."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = 0
    try:
        mem = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "platform": platform.platform(), "commit": commit}


def write(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def publish(name: str, result: dict, plot, keys: tuple[str, ...]) -> Path:
    """Write ``results/<name>.json`` and the plot beside it; print the headline keys."""
    path = write(name, result)
    plot(result, RESULTS / f"{name}.png")
    print(f"[bench] wrote {path}")
    print({k: result[k] for k in keys if k in result})
    return path


def child_json(script: str, spec: dict, label: str) -> dict:
    """``python script --child SPEC`` (the repository on PYTHONPATH), in a fresh process: its last stdout line as
    JSON; a failure raises naming ``label`` and the child's last stderr line."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    res = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], env=env, capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise RuntimeError(f"child {label} failed: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def second_core() -> dict:
    """The speed probe alone, then two probes at once in two processes: median ms of each."""
    code = ("from edgeplan.profile import cpu; import statistics, time\n"
            "from ai_edge_litert.interpreter import Interpreter\n"
            "it = Interpreter(model_path=str(cpu.PROBE), num_threads=1); it.allocate_tensors(); it.invoke()\n"
            "ts = []\n"
            "for _ in range(60):\n t = time.perf_counter(); it.invoke(); ts.append((time.perf_counter() - t) * 1e3)\n"
            "print(statistics.median(ts))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    def start():
        return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)

    alone = float(start().communicate()[0])
    pair = [start(), start()]
    both = [float(p.communicate()[0]) for p in pair]
    return {"value": round(statistics.median(both) / alone, 3), "alone_ms": alone, "two_at_once_ms": both}


def int8_frames(graph, n: int, seed: int):
    """``n`` seeded random int8 frames for a ``TfliteGraph`` and the whole int8 model's outputs for them
    (XNNPACK, as the MPI ranks run)."""
    import numpy as np

    from edgeplan.quantize import litert
    from edgeplan.runtime.stream import invoke_named

    whole = litert.interpreter(graph.data, deterministic=False)
    t = graph.tensors[graph.inputs[0]]
    xs = litert.random_value((n, *t.shape), np.int8, np.random.default_rng(seed))
    out = graph.tensors[graph.outputs[0]].name
    return xs, np.stack([invoke_named(whole, {t.name: x})[out] for x in xs])


def compiled(work: Path, zoo: str, log, also: tuple[Path, ...] = ()) -> Path:
    """The zoo model compiled as the CLI does it (``edgeplan compile``): reused from ``work`` or from the work
    directories ``also`` (other benches'), else compiled into ``work``."""
    for root in (work, *also):
        d = root / "artifacts" / zoo / "1"
        if (d / "verify.json").is_file():
            return d
    d = work / "artifacts" / zoo / "1"
    log(f"compiling {zoo}")
    repo = Path(__file__).resolve().parent.parent
    res = subprocess.run([sys.executable, "-m", "edgeplan.cli", "compile", f"zoo:{zoo}", "--name", zoo, "--version",
                          "1", "--out", str(work / "artifacts")], env={**os.environ, "PYTHONPATH": str(repo)},
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"edgeplan compile {zoo}: {res.stderr.strip().splitlines()[-1:]}")
    return d
