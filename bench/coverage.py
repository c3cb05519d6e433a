"""Model coverage (issue: model coverage): every Keras application through edgeplan. Writes
bench/results/coverage.json and coverage.png.

Each constructor in ``keras.applications`` is built with ``weights=None``, logits (``classifier_activation=None``)
and batch-norm statistics calibrated on a random batch (``edgeplan.zoo.keras_apps``: with Keras's initial
statistics the activations of deep models such as MobileNetV3 shrink to ~1e-16 at the logits, which no int8
model can follow) at SIZE x SIZE x 3. A model that starts with its own preprocessing (Rescaling or Normalization:
MobileNetV3, EfficientNet, EfficientNetV2, ConvNeXt) takes pixels in [0, 255]: its batch norms, int8 calibration
and verify inputs are drawn from [0, 255] (params.yaml's `quantize.calibration` low/high, given with --params),
the others' from [-1, 1] (the default). Measured: MobileNetV3Small given [-1, 1] sees an input varying by
+-0.8% around -1 after its Rescaling, four int8 steps, and its int8 model's output has cosine 0.56 with the float
one (96 by default: the smallest input every architecture accepts is 75 (InceptionV3,
InceptionResNetV2), and 224 puts the run well past 90 minutes on two cores), saved as a .keras file, then taken
through edgeplan as a user would, each command a fresh process, one model at a time:
`edgeplan compile MODEL.keras` (ingest, analyze, int8 conversion, cutting, EMULATED Edge TPU compile, verify) and
`edgeplan profile run --device-class coral-usb-emulated --repeats 5 --span-s 1 --budget-s 2` (Edge TPU times
EMULATED, CPU times measured: few runs, the figure here is that it profiles, not the times).

Per architecture: the status of each stage (ingest, build, verify, profile), the one error line a failure printed,
tracebacks printed (any ``Traceback (most recent call last)`` on stdout or stderr of any command), the candidate
points, int8~float cosine and the int8 chain's identical fraction (min over points, verify.json), the largest share
of the model's MACs in an Edge TPU prefix that maps whole (EMULATED compiler's report), the ops that end or stay off
the TPU in the deepest prefix, the parameter bytes, wall time per stage and the peak RSS (memory.json).

Headline keys:
- coverage_fraction: {value, compiled, tried}: architectures whose compile exits 0 with verify passing, over those
  tried (target >= 0.95).
- architectures: how many were tried.
- tracebacks: tracebacks shown to the user over the whole run (target 0).
- identical_fraction_min: the smallest int8-chain identical fraction over every point of every compiled model
  (target 1.0).

Each architecture's record is kept in the work directory (.edgeplan/bench/coverage/records/, keyed by the input
size, with the commit it was measured at), so an interrupted run resumes; `--fresh` ignores them. `--models A,B`
runs a subset (written to coverage_subset.json); `--size N` another input.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, publish, pyplot  # noqa: E402

WORK = Path(".edgeplan/bench/coverage")
DEVICE_CLASS = "coral-usb-emulated"
TRACEBACK = "Traceback (most recent call last)"
STAGES = ("ingest", "build", "verify", "profile")
BUILD_STAGES = ("analyze", "int8 conversion", "matching", "cutting", "compile")


def constructors() -> list[str]:
    """The architectures ``keras.applications`` exports (its capitalised names: the model constructors), sorted."""
    import keras

    return sorted(n for n in dir(keras.applications) if n[:1].isupper() and callable(getattr(keras.applications, n)))


# parameters in millions (Keras applications' table): the full run goes smallest first, so that an interrupted run
# has covered the most architectures; a constructor not listed goes last
SIZE_M = {"MobileNetV3Small": 2.5, "MobileNetV2": 3.5, "MobileNet": 4.3, "NASNetMobile": 5.3, "EfficientNetB0": 5.3,
          "MobileNetV3Large": 5.4, "EfficientNetV2B0": 7.2, "EfficientNetB1": 7.9, "DenseNet121": 8.1,
          "EfficientNetV2B1": 8.2, "EfficientNetB2": 9.2, "EfficientNetV2B2": 10.2, "EfficientNetB3": 12.3,
          "DenseNet169": 14.3, "EfficientNetV2B3": 14.5, "EfficientNetB4": 19.5, "DenseNet201": 20.2,
          "EfficientNetV2S": 21.6, "Xception": 22.9, "InceptionV3": 23.9, "ResNet50": 25.6, "ResNet50V2": 25.6,
          "ConvNeXtTiny": 28.6, "EfficientNetB5": 30.6, "EfficientNetB6": 43.3, "ResNet101": 44.7,
          "ResNet101V2": 44.7, "ConvNeXtSmall": 50.2, "EfficientNetV2M": 54.4, "InceptionResNetV2": 55.9,
          "ResNet152": 60.4, "ResNet152V2": 60.4, "EfficientNetB7": 66.7, "ConvNeXtBase": 88.6, "NASNetLarge": 88.9,
          "EfficientNetV2L": 119.0, "VGG16": 138.4, "VGG19": 143.7, "ConvNeXtLarge": 197.8, "ConvNeXtXLarge": 350.1}


def build_keras(name: str, size: int, path: Path) -> dict:
    """``name`` at ``size`` saved to ``path`` (in a child: Keras and TensorFlow memory go with it)."""
    code = ("import sys, json, keras\n"
            "from pathlib import Path\n"
            "from edgeplan.zoo import keras_apps\n"
            "name, size = sys.argv[1], int(sys.argv[2])\n"
            "probe = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))\n"
            "pixels = keras_apps.expects_pixels(probe)\n"
            "del probe\n"
            "lo, hi = (0.0, 255.0) if pixels else (-1.0, 1.0)\n"
            "keras_apps.build(name, size, Path(sys.argv[3]).with_suffix(''), input_range=(lo, hi))\n"
            "print(json.dumps({'input_range': [lo, hi]}))\n")
    proc = subprocess.run([sys.executable, "-c", code, name, str(size), str(path)], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return {"error": _last_line(proc.stderr)}


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip() and "━" not in x]  # (not a progress bar)
    errors = [x for x in lines if x.startswith("error:")]
    return (errors or lines or [""])[-1][:400]


def _edgeplan(*args: str, timeout: float) -> dict:
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, COLUMNS="160"))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        return {"rc": None, "seconds": round(time.perf_counter() - t, 1), "error": f"timed out after {timeout:.0f} s",
                "tracebacks": out.count(TRACEBACK)}
    text = proc.stdout + proc.stderr
    return {"rc": proc.returncode, "seconds": round(time.perf_counter() - t, 1),
            "error": _last_line(proc.stderr) if proc.returncode else None, "tracebacks": text.count(TRACEBACK)}


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def inspect(art: Path) -> dict:
    """What the artifact directory says of the compiled model (whatever stages got that far)."""
    out: dict = {}
    model = _read(art / "model.json")
    if model:
        out.update(parameters=model.get("parameter_count"), parameter_bytes=model.get("parameter_bytes"),
                   macs=model.get("macs"), nodes=model.get("node_count"))
    analysis = _read(art / "analysis.json")
    if analysis:
        out["points"] = len(analysis["points"])
        macs = out.get("macs") or 0
        whole = []
        deepest = None
        for p in analysis["points"]:
            report = _read(art / "segments" / f"p{p['index']}" / "compile.json")
            if report is None:
                continue
            if report.get("cpu_ops") == 0:
                whole.append(p.get("prefix_macs") or 0)
            if deepest is None or (p.get("prefix_macs") or 0) >= deepest[0]:
                deepest = (p.get("prefix_macs") or 0, report)
        out["tpu_mac_share"] = round(max(whole) / macs, 4) if whole and macs else 0.0
        if deepest:
            ops = deepest[1].get("operators", [])
            out["off_tpu_ops"] = {o["op"]: o["count"] for o in ops if o.get("status") != "Mapped to Edge TPU"}
            out["first_unmapped"] = deepest[1].get("first_unmapped")
    verify = _read(art / "verify.json")
    if verify:
        pts = verify.get("points") or []
        out["verify_ok"] = bool(verify.get("ok"))
        out["identical_fraction_min"] = min((p.get("int8_identical_fraction") or 0.0 for p in pts), default=None)
        out["int8_float_cosine_min"] = min((p.get("int8_float_cosine") or 0.0 for p in pts), default=None)
        out["float_ok"] = all(p.get("float_ok") for p in pts) if pts else None
        checks = (("float", "float_ok"), ("int8 chain", "int8_ok"),
                  (f"int8~float cosine < {verify.get('min_cosine')}", "cosine_ok"))
        failed = [f"{what} at {n} of {len(pts)} points" for what, key in checks
                  if (n := sum(not p.get(key) for p in pts))]
        if verify.get("input_dependence_ok") is False:
            failed.append(f"output barely depends on the input ({verify.get('input_dependence'):.3g})")
        if failed:
            out["verify_failure"] = "verify failed: " + "; ".join(failed)
    memory = _read(art / "memory.json")
    if memory:
        stages = memory.get("stages", {})
        out["peak_rss_bytes"] = max((s.get("peak_rss_bytes", 0) for s in stages.values()), default=None)
        out["stage_seconds"] = {k: s.get("seconds") for k, s in stages.items()}
    return out


def run_one(name: str, size: int, fresh: bool) -> dict:
    key = f"input {size}"
    record_path = WORK / "records" / f"{name}.json"
    old = _read(record_path)
    if old and old.get("key") == key and not fresh:
        print(f"[coverage] {name}: from its record (commit {old.get('commit')})", flush=True)
        return old
    root = WORK / "artifacts"
    art = root / name / "1"
    shutil.rmtree(root / name, ignore_errors=True)
    keras_file = WORK / "keras" / f"{name}_{size}.keras"
    keras_file.parent.mkdir(parents=True, exist_ok=True)
    rec: dict = {"name": name, "key": key, "commit": machine()["commit"], "input": [1, 3, size, size], "stages": {}}
    t = time.perf_counter()
    made = build_keras(name, size, keras_file)
    if "error" in made:
        rec["stages"] = {s: "not run" for s in STAGES}
        rec["error"] = f"Keras could not build it: {made['error']}"
        rec["tracebacks"] = 0
        return _save(record_path, rec)
    rec["keras_seconds"] = round(time.perf_counter() - t, 1)
    rec["input_range"] = made["input_range"]
    params = _params(made["input_range"])
    comp = _edgeplan("--params", str(params), "compile", str(keras_file), "--name", name, "--version", "1",
                     "--out", str(root), timeout=5400)
    rec.update(inspect(art))
    rec["compile_seconds"] = comp["seconds"]
    rec["tracebacks"] = comp["tracebacks"]
    ingested = (art / "model.onnx").is_file()
    built = (art / "model_int8.tflite").is_file() and (art / "analysis.json").is_file()
    rec["stages"] = {"ingest": "ok" if ingested else "failed",
                     "build": "ok" if built else ("failed" if ingested else "not run"),
                     "verify": ("ok" if rec.get("verify_ok") else "failed") if built else "not run"}
    if comp["rc"] != 0:
        rec["error"] = rec.get("verify_failure") or comp["error"]
    if comp["rc"] == 0:
        prof = _edgeplan("--params", str(params), "profile", "run", str(art), "--device-class", DEVICE_CLASS,
                         "--repeats", "5", "--span-s", "1", "--budget-s", "2", timeout=3600)
        rec["stages"]["profile"] = "ok" if prof["rc"] == 0 else "failed"
        rec["profile_seconds"] = prof["seconds"]
        rec["tracebacks"] += prof["tracebacks"]
        if prof["rc"] != 0:
            rec["error"] = prof["error"]
    else:
        rec["stages"]["profile"] = "not run"
    shutil.rmtree(root / name, ignore_errors=True)  # gigabytes per model: the record keeps what the bench reads
    return _save(record_path, rec)


def _params(input_range) -> Path:
    """The repository's params.yaml with calibration (and verify) inputs drawn from ``input_range``."""
    import yaml

    params = yaml.safe_load(Path("params.yaml").read_text())
    params["quantize"]["calibration"].update(low=float(input_range[0]), high=float(input_range[1]))
    path = WORK / f"params_{input_range[0]:g}_{input_range[1]:g}.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def _save(path: Path, rec: dict) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    status = " ".join(f"{s}={rec['stages'].get(s)}" for s in STAGES)
    print(f"[coverage] {rec['name']}: {status}" + (f" -- {rec['error']}" if rec.get("error") else ""), flush=True)
    return rec


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    rows = result["by_model"]
    fig, ax = plt.subplots(figsize=(12, 5))
    names = [r["name"] for r in rows]
    cosine = [r.get("int8_float_cosine_min") or 0.0 for r in rows]
    colours = ["tab:green" if r["stages"].get("verify") == "ok" else "tab:red" for r in rows]
    ax.bar(range(len(rows)), cosine, color=colours)
    ax.axhline(0.85, color="black", linestyle="--", linewidth=1, label="verify's cosine floor (0.85)")
    ax.set_xticks(range(len(rows)), names, rotation=75, ha="right", fontsize=7)
    ax.set_ylabel("int8~float cosine, min over points")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower left")
    ax.set_title(f"coverage: {result['coverage_fraction']['compiled']} of {result['architectures']} Keras applications "
                 f"compile and verify at {result['input_size']} px (green); red: failed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated constructor names (default: every keras.applications one)")
    ap.add_argument("--size", type=int, default=96, help="input height and width (default 96)")
    ap.add_argument("--fresh", action="store_true", help="ignore the records of earlier runs")
    args = ap.parse_args()
    every = constructors()
    names = args.models.split(",") if args.models else sorted(every, key=lambda n: (SIZE_M.get(n, 1e9), n))
    unknown = [n for n in names if n not in every]
    if unknown:
        sys.exit(f"error: not keras.applications constructors: {', '.join(unknown)}")
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[coverage] {i}/{len(names)} {name}", flush=True)
        rows.append(run_one(name, args.size, args.fresh))
    compiled = [r for r in rows if r["stages"].get("verify") == "ok"]
    identical = [r["identical_fraction_min"] for r in compiled if r.get("identical_fraction_min") is not None]
    result = {
        "coverage_fraction": {"value": round(len(compiled) / len(rows), 4), "compiled": len(compiled),
                              "tried": len(rows)},
        "architectures": len(rows),
        "tracebacks": sum(r.get("tracebacks", 0) for r in rows),
        "identical_fraction_min": min(identical) if identical else None,
        "input_size": args.size,
        "subset": bool(args.models),
        "commits": sorted({r.get("commit") for r in rows if r.get("commit")}),
        "failed": {r["name"]: r.get("error") for r in rows if r not in compiled},
        "by_model": rows,
        "machine": machine(),
        "method": __doc__,
    }
    publish("coverage" if not args.models else "coverage_subset", result, plot,
            ("coverage_fraction", "architectures", "tracebacks", "identical_fraction_min"))


if __name__ == "__main__":
    main()
