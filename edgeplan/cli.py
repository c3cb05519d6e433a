"""``edgeplan``: the command line of the offline pipeline.

    edgeplan compile MODEL --name N --version V   ingest -> analyze -> int8 -> cut -> compile -> verify
    edgeplan analyze MODEL --json OUT             list the ONNX candidate partition points
    edgeplan verify ARTIFACT_DIR                  re-run the checks, print the table (exit 1 on failure)
    edgeplan accuracy ARTIFACT_DIR [--dataset D]  the accuracy gate on a labelled set (exit 1: no point passes)
    edgeplan ingest | build | stream              single stages (what dvc.yaml runs)
    edgeplan parallax ARTIFACT_DIR                Parallax branch-parallel plans, measured here -> parallax/
    edgeplan zoo list | zoo build NAME DIR        real architectures with seeded weights, no downloads
    edgeplan profile run ARTIFACT_DIR --device-class C   profiles/C.json: TPU (emulated) and CPU (measured) times
    edgeplan profile diff A B                     segments whose latency moved beyond a threshold
    edgeplan profile train PROFILE...             fit the XGBoost latency predictor on measured profiles
    edgeplan profile emulator                     the emulated Edge TPU's fitted parameters and errors
    edgeplan fleet                                check and list the fleet registry
    edgeplan plan swapless --deployment NAME      SwapLess points and cores for a deployment -> plans/swapless.json
    edgeplan plan flashmem --deployment NAME      FlashMem overlap plans streaming weights -> plans/flashmem.json
    edgeplan plan parallax --deployment NAME      Parallax: suffixes run branch-parallel -> plans/parallax.json
    edgeplan plan spatial --deployment NAME       ADaPS: one model split along H/W over devices -> plans/spatial.json
    edgeplan plan autodice --deployment NAME      AutoDiCE: one model cut into layers over devices -> plans/autodice.json
    edgeplan units ARTIFACT_DIR                   the layers a multi-device mapping keeps together (fused units)
    edgeplan split ARTIFACT_DIR --mapping M ...   one model over several devices: stages, tables, rankfile (AutoDiCE)
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgeplan import quiet
from edgeplan.errors import EdgeplanError

from edgeplan.console import err  # noqa: E402
from edgeplan.console import out as console  # noqa: E402
from edgeplan.console import table  # noqa: E402


def _shape(text: str | None):
    if not text:
        return None
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: expected integers like 1,3,224,224") from None
    if any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: every dimension must be positive")
    return dims


def _size(text: str) -> int:
    from edgeplan.pipeline.preflight import parse_size

    try:
        size = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return size


@contextmanager
def _progress():
    with Progress(TextColumn("[bold]{task.description:<16}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=False) as bar:
        tasks: dict[str, int] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


def _short(name: str | None, width: int = 44) -> str:
    if not name:
        return "-"
    return name if len(name) <= width else "…" + name[-(width - 1):]


def print_build(result) -> None:
    from edgeplan.compile.edgetpu_ops import SHORT

    t = Table(title="segments (Edge TPU figures from the " + _compiler_label(result.reports) + ")")
    for col in ("point", "ONNX tensor", "boundary B", "prefix params B", "prefix MMACs", "TPU ops", "first op off the TPU"):
        t.add_column(col, justify="right" if col not in ("ONNX tensor", "first op off the TPU") else "left")
    for p in result.analysis.points:
        r = result.reports.get(p.index)
        if p.index in result.errors:
            off = f"[red]failed: {result.errors[p.index].splitlines()[0]}"
        elif r and r.first_unmapped:
            status = r.first_unmapped.get("status")
            off = f"{r.first_unmapped.get('op')} ({SHORT.get(status, status)})"
        else:
            off = "-"
        t.add_row(str(p.index), _short(p.tensor), f"{p.boundary_bytes:,}", f"{p.prefix_param_bytes:,}",
                  f"{p.prefix_macs / 1e6:.1f}", f"{r.tpu_ops}/{r.total_ops}" if r else "-", off)
    console.print(t)
    a = result.analysis
    whole = result.reports.get(a.last)
    if whole and whole.first_unmapped:
        f = whole.first_unmapped
        console.print(f"The Edge TPU part of the whole model ends at op {f.get('index')} {f.get('op')}: "
                      f"{f.get('status')} — {f.get('reason')}")
    console.print(f"{a.onnx_candidates} ONNX candidates, {len(a.points) - 2} interior points kept, "
                  f"{len(a.dropped)} dropped (see analysis.json). {a.note}")


def _compiler_label(reports) -> str:
    kinds = {r.compiler for r in reports.values()}
    if kinds == {"edgetpu_compiler"}:
        return "edgetpu_compiler"
    return "EMULATED Edge TPU compiler" if kinds else "compiler"


def print_verify(report) -> None:
    t = Table(title="verify")
    for col in ("point", "float max|Δ|", "tolerance", "int8 identical", "int8~float cosine", "result"):
        t.add_column(col, justify="right")
    for c in report.points:
        t.add_row(
            str(c.point),
            "-" if c.float_max_abs_diff is None else f"{c.float_max_abs_diff:.2e}",
            "-" if c.float_tolerance is None else f"{c.float_tolerance:.1e}",
            f"{100 * c.int8_identical_fraction:.2f}%",
            f"{c.int8_float_cosine:.4f}",
            "[green]ok" if c.ok else f"[red]FAIL{(': ' + c.error) if c.error else ''}",
        )
    console.print(t)
    dep = "[green]ok" if report.input_dependence_ok else "[red]FAIL (the output ignores the input)"
    console.print(f"output depends on input: {report.input_dependence:.3g} {dep}; "
                  f"min cosine {report.min_cosine}; {report.samples} samples")
    console.print("[bold green]verify passed" if report.ok else "[bold red]verify FAILED")


def print_accuracy(report) -> None:
    t = Table(title=f"accuracy gate: top-1 on {report.samples} labelled samples ({report.dataset})")
    for col in ("point", "int8 top-1", "drop", "result"):
        t.add_column(col, justify="right")
    for p in report.points:
        t.add_row(str(p.point), f"{p.top1:.4f}", f"{p.drop:+.4f}",
                  "[green]publishable" if p.publishable else f"[red]over the {report.max_top1_drop:.3f} limit")
    console.print(t)
    console.print(f"float top-1 {report.float_top1:.4f}; int8 chains on {report.kernels} kernels (Edge TPU prefixes "
                  "as their int8 models)")
    if not report.ok:
        console.print("[bold red]accuracy gate FAILED at every point: this model is not published")
    elif report.excluded:
        console.print(f"[yellow]points {list(report.excluded)} are never planned or switched to")
    else:
        console.print("[bold green]accuracy gate passed")


def _accuracy_params(args, params) -> dict:
    if getattr(args, "accuracy_dataset", None):
        params = {**params, "accuracy": {**params["accuracy"], "dataset": args.accuracy_dataset}}
    return params


def cmd_accuracy(args, params) -> int:
    params = _accuracy_params(args, params)
    if not params["accuracy"].get("dataset"):
        raise EdgeplanError("no labelled evaluation set: give --dataset (a .npz with x and y, or zoo:NAME) or set "
                            "accuracy.dataset in params.yaml")
    with _progress() as update:
        report = _stages().accuracy(Path(args.artifact_dir), params, update)
    print_accuracy(report)
    console.print(f"wrote {Path(args.artifact_dir) / 'accuracy.json'}")
    return 0 if report.ok else 1


def cmd_ingest(args, params) -> int:
    out = _stages().ingest(args.model, args.name, args.version, Path(args.out), args.input_shape,
                           params["ingest"]["max_model_bytes"], params["ingest"].get("max_memory_bytes"))
    console.print(f"wrote {out / 'model.onnx'} and {out / 'model.json'}")
    return 0


def cmd_analyze(args, params) -> int:
    from edgeplan.artifacts import write_json_atomic
    from edgeplan.graph.ingest import load_any
    from edgeplan.zoo import resolve

    model = load_any(resolve(args.model, Path(args.out) / ".zoo"), input_shape=args.input_shape)
    analysis = _stages().onnx_analysis(model, args.max_points if args.max_points is not None
                                       else params["analysis"]["max_points"])
    t = Table(title=f"ONNX candidate partition points of {args.model}")
    for col in ("point", "tensor", "node", "shape", "boundary B", "prefix params B", "prefix MMACs"):
        t.add_column(col)
    for p in analysis.points:
        t.add_row(str(p.index), _short(p.tensor), _short(p.onnx_node, 30), "x".join(map(str, p.shape)),
                  f"{p.boundary_bytes:,}", f"{p.prefix_param_bytes:,}", f"{p.prefix_macs / 1e6:.1f}")
    console.print(t)
    if analysis.note:
        console.print(analysis.note)
    if args.branches:
        _print_branches(model, args.model)
    if args.paths:
        _print_paths(model, args.model, args.paths)
    if args.json:
        write_json_atomic(args.json, analysis)
        console.print(f"wrote {args.json}")
    return 0


def _print_branches(model, label: str) -> None:
    from edgeplan.graph import branches
    from edgeplan.graph.model import GraphView

    dag = branches.from_onnx(GraphView(model))
    s = branches.structure(dag)
    t = Table(title=f"Parallax layers of {label} with more than one branch (nodes per branch)")
    for col in ("layer", "branches", "nodes", "first nodes"):
        t.add_column(col)
    for k, layer in enumerate(s.layers):
        if len(layer) > 1:
            bs = [s.branches[b] for b in layer]
            t.add_row(str(k), str(len(bs)), " ".join(str(len(b.nodes)) for b in bs),
                      _short(", ".join(dag.names[b.nodes[0]] for b in bs), 60))
    console.print(t)
    console.print(f"{len(dag.names)} nodes, {len(s.branches)} branches, {len(s.layers)} layers, "
                  f"{s.parallel_layers} of them parallel (largest: {s.max_branches} branches)")


def _print_paths(model, label: str, dim: str) -> None:
    from edgeplan.graph.model import GraphView
    from edgeplan.plan.spatial.paths import analyse

    p = analyse(GraphView(model), dim)
    t = Table(title=f"ADaPS sub-blocks of {label} along {dim} (path analysis, §4.2)")
    for col in ("sub-block", "layers", "rows out", "reads", "first .. last layer"):
        t.add_column(col)
    for k, b in enumerate(p.blocks):
        first, last = p.layers[b.layers[0]], p.layers[b.layers[-1]]
        t.add_row(str(k), str(len(b.layers)), " ".join(str(p.layers[i].layer.out_size) for i in b.layers),
                  _short(", ".join(b.entry(p)), 40), _short(f"{first.layer.name} .. {last.layer.name}", 60))
    console.print(t)
    merges = sum(1 for x in p.layers if len(x.inputs) > 1)
    console.print(f"{len(p.layers)} layers in {len(p.blocks)} sub-blocks ({merges} merge{'s' if merges != 1 else ''}); "
                  f"the region ends: {p.reason}; gathered: {', '.join(p.outputs)}", highlight=False)


def cmd_build(args, params) -> int:
    with _progress() as update:
        result = _stages().build(Path(args.artifact_dir), params, update)
    print_build(result)
    return 1 if result.errors else 0


def cmd_verify(args, params) -> int:
    with _progress() as update:
        report = _stages().verify(Path(args.artifact_dir), params, update)
    print_verify(report)
    console.print(f"wrote {Path(args.artifact_dir) / 'verify.json'}")
    return 0 if report.ok else 1


def cmd_stream(args, params) -> int:
    root = Path(args.artifact_dir)
    if not (root / "model_int8.tflite").is_file():
        raise EdgeplanError(f"{root / 'model_int8.tflite'}: missing; run `edgeplan build {root}` first.")
    with _progress() as update:
        info = _stages().stream(root, params, update)
    t = Table(title=f"streaming layers of {root}")
    for col in ("layers", "weights MB", "largest layer MB", "split weights", "identical"):
        t.add_column(col, justify="right" if col != "identical" else "left")
    weights = [layer.weight_bytes for layer in info.layers]
    t.add_row(str(len(info.layers)), f"{sum(weights) / 1e6:.2f}", f"{max(weights, default=0) / 1e6:.2f}",
              str(len(info.split_ops)), ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in info.identical.items()))
    console.print(t)
    console.print(f"wrote {root / 'stream'}")
    return 0 if info.ok else 1


def cmd_parallax(args, params) -> int:
    root = Path(args.artifact_dir)
    if not (root / "model_int8.tflite").is_file():
        raise EdgeplanError(f"{root / 'model_int8.tflite'}: missing; run `edgeplan build {root}` first.")
    with _progress() as update:
        record = _stages().parallax(root, params, update)
    t = Table(title=f"Parallax plans of {root} ({record['workers']} workers, budget "
                    f"{record['budget_bytes'] / 2**20:.0f} MiB; times measured here)")
    for col in ("target", "ops", "parallel layers", "whole ms", "plan ms", "plan/whole", "sub-models", "identical"):
        t.add_column(col, justify="left" if col in ("target", "identical") else "right")
    ok = True
    for name, r in record["targets"].items():
        if "same_as" in r:
            t.add_row(name, "", f"as {r['same_as']}", "", "", "", "", "")
            continue
        ok &= all(r["identical"].values())
        ratio = r["plan_ms"] / r["whole_ms"] if r["whole_ms"] else 1.0
        ms = [f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("whole_ms", "plan_ms")]
        t.add_row(name, str(r["ops"]), str(r["parallel_layers"]), *ms, f"{ratio:.3f}", str(sum(len(st["submodels"]) for st in r["stages"]) or "whole"),
                  ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in r["identical"].items()))
    console.print(t)
    for name, r in record["targets"].items():
        if r.get("why"):
            console.print(f"{name}: no branch-parallel layer: {r['why']}")
    console.print(f"wrote {root / 'parallax'}")
    return 0 if ok else 1


def cmd_compile(args, params) -> int:
    from edgeplan.artifacts import write_json_atomic
    from edgeplan.pipeline.memory import Sampler

    st = _stages()
    with Sampler() as mem:
        with _progress() as update:
            update("ingest", 0, 1)
            root = st.ingest(args.model, args.name, args.version, Path(args.out), args.input_shape,
                             params["ingest"]["max_model_bytes"], params["ingest"].get("max_memory_bytes"))
            update("ingest", 1, 1)
            result = st.build(root, params, update)
        print_build(result)
        with _progress() as update:
            report = st.verify(root, params, update)
        params = _accuracy_params(args, params)
        gate = None
        if report.ok and params["accuracy"].get("dataset"):
            with _progress() as update:
                gate = st.accuracy(root, params, update)
    print_verify(report)
    if gate is not None:
        print_accuracy(gate)
    record = mem.record()
    write_json_atomic(root / "memory.json", {"schema_version": 1, "source": "measured: RSS of the process tree, "
                                             "sampled every 20 ms", "stages": record})
    print_memory(record)
    console.print(f"artifacts in {root}")
    return 0 if report.ok and not result.errors and (gate is None or gate.ok) else 1


def print_memory(record: dict) -> None:
    t = table("peak memory per stage (RSS of edgeplan and the processes it started, measured)",
              ("stage", "seconds", "peak GB", "above its start GB"), right=("seconds", "peak GB", "above its start GB"))
    top = max(record, key=lambda k: record[k]["peak_rss_bytes"], default=None)
    for name, r in record.items():
        mark = " [bold](peak)[/]" if name == top else ""
        t.add_row(name + mark, f"{r['seconds']:.1f}", f"{r['peak_rss_bytes'] / 1e9:.2f}",
                  f"{r['peak_over_baseline_bytes'] / 1e9:.2f}")
    console.print(t)


def cmd_zoo(args, params) -> int:
    from edgeplan import zoo

    if args.zoo_cmd == "list":
        for name in zoo.NAMES:
            console.print(f"{name:<22} {zoo.describe(name)}")
        return 0
    path = zoo.build(args.name, Path(args.dir))
    console.print(f"wrote {path}")
    return 0


def _fleet(params):
    from edgeplan.profile import fleet

    return fleet.load(params, {d["name"] for d in params.get("deployments") or []})


def cmd_profile_run(args, params) -> int:
    from edgeplan.artifacts import ModelInfo
    from edgeplan.pipeline.planning import (
        conv_speed_pairs,
        deployments_serving,
        device_classes,
        split_classes,
    )
    from edgeplan.profile import cpu, run
    from edgeplan.profile.predictor import Predictor

    model_dir = Path(args.artifact_dir)
    conv: set[str] = set()  # classes whose conv speeds are measured without --conv-speed
    if args.device_class:
        names = [args.device_class]
    else:  # what `edgeplan run` profiles: the classes of the deployments serving this model version (and of the
        # registry's devices of the split ones, with conv speeds)
        info = ModelInfo.load(model_dir / "model.json")
        params, served = deployments_serving(params, info.name, info.version, str(model_dir.parents[1]))
        names = device_classes(params, served)
        conv = {c for m, c in conv_speed_pairs(params, split_classes(params, served)) if m == info.name}
    if args.summary_json and len(names) != 1:
        raise EdgeplanError(f"--summary-json takes one device class; {model_dir} is served on {', '.join(names)}: "
                            "pass --device-class")
    pp = dict(params["profile"])
    for key in ("repeats", "timeout_s", "budget_s", "span_s"):
        if getattr(args, key) is not None:
            pp[key] = getattr(args, key)
    try:
        settings = cpu.Settings.from_params(pp)
    except ValueError as e:
        raise EdgeplanError(str(e)) from None
    predictor = Predictor.load(args.predictor) if args.predictor else None
    failed = 0
    for name in names:
        device_class = _fleet(params).device_class(name)
        with _progress() as update:
            prof = run.profile(model_dir, device_class, settings, update, predictor=predictor,
                               sample=args.sample, cpu_prefixes=args.cpu_prefixes,
                               capacity_rounds=int(params["flashmem"]["capacity_rounds"]),
                               conv_speed=args.conv_speed or name in conv)
        print_profile(prof)
        if prof.conv_speed is not None:
            c = prof.conv_speed
            console.print(f"conv speed (ADaPS speed_d, {len(c.macs)} conv timings"
                          + (f" under cpu quota {c.quota:g}" if c.quota is not None else "") + f"): "
                          f"{c.s_per_mac * 1e12:.2f} ps/MAC + {c.s_per_layer * 1e3:.3f} ms/layer")
        console.print(f"wrote {model_dir / 'profiles' / f'{device_class.name}.json'}")
        if args.summary_json:
            from edgeplan.artifacts import write_json_atomic

            write_json_atomic(args.summary_json, prof.summary())
            console.print(f"wrote {args.summary_json}")
        failed += sum(1 for s in prof.segments if s.status != "ok")
    return 1 if failed else 0


def print_profile(prof) -> None:
    rows = prof.summary()
    src = {r["tpu_source"] for r in rows if r["tpu_source"]}
    title = f"{prof.model} on {prof.device_class}" + (" — Edge TPU times EMULATED (modelled, not measured)"
                                                       if "emulated" in src else "")
    t = Table(title=title)
    t.add_column("point", justify="right")
    t.add_column("tpu_ms", justify="right")
    for n in prof.threads:
        t.add_column(f"cpu_ms k={n}", justify="right")
    t.add_column("source")
    t.add_column("status")

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        bad = [s for s in prof.segments if s.point == r["point"] and s.status != "ok"]
        status = "; ".join(f"[red]{s.role} {s.status}: {s.error}" for s in bad) or "[green]ok"
        t.add_row(str(r["point"]), fmt(r["tpu_ms"]), *(fmt(r["cpu_ms"].get(str(n))) for n in prof.threads),
                  f"tpu {r['tpu_source'] or '-'} / cpu {r['cpu_source'] or '-'}", status)
    console.print(t)
    scales = sorted({round(t.scale, 3) for s in prof.segments for t in s.cpu if t.source == "measured"})
    if prof.probe and scales != [1.0]:
        console.print("CPU times at the class's reference speed: speed probe "
                      + ", ".join(f"k={t.threads} {t.median_ms:.2f} ms" for t in prof.probe)
                      + f" in this run (scale {min(scales):.3f}" + (f"..{max(scales):.3f})" if len(scales) > 1 else ")"))
    if prof.load_capacity is not None:
        lc = prof.load_capacity
        by = {c: [x for x in lc.layers if x.op_class == c] for c in ("elemental", "reusable", "hierarchical")}
        med = {c: sorted(x.slowdown(len(lc.rates_mb_s) - 1) for x in v)[len(v) // 2] for c, v in by.items() if v}
        console.print(f"load capacity (FlashMem): {len(lc.layers)} streaming layers timed alone, beside a loader at "
                      f"{'/'.join(f'{r:g}' for r in lc.rates_mb_s)} MB/s and beside a build, {lc.rounds} rounds; "
                      "median slowdown at the fastest rate: "
                      + ", ".join(f"{c} {v:.2f} ({len(by[c])})" for c, v in med.items()))
    if prof.tpu_model:
        m = prof.tpu_model
        console.print(f"emulated Edge TPU ({m.get('model', '?')}): efficiency {m['efficiency']:.3f} of "
                      f"{m['peak_macs_per_s'] / 1e12:g}e12 MAC/s, "
                      f"depthwise {m.get('dw_efficiency') or m['efficiency']:.3f}, "
                      f"{m.get('op_ms', 0) * 1e3:.1f} us per op, {m.get('act_ns_per_byte', 0):.3f} ns per activation "
                      f"byte, overlap {m.get('overlap', 0):.2f}, overhead {m['overhead_ms']:.3f} ms, "
                      f"link {m['link_bytes_per_s'] / 1e6:g} MB/s "
                      f"(fitted on {', '.join(m['calibration'].get('hosts', []))} rows of the Coral benchmarks)")


def cmd_profile_diff(args, params) -> int:
    from edgeplan.profile.diff import diff
    from edgeplan.profile.schema import Profile

    a, b = Profile.load(args.a), Profile.load(args.b)
    threshold = args.threshold if args.threshold is not None else params["profile"]["drift_threshold"]
    changes = diff(a, b, threshold, allow_other_model=args.other_model)
    t = Table(title=f"segments that moved more than {threshold:.0%}: {args.a} -> {args.b}")
    for col in ("point", "segment", "metric", "A ms", "B ms", "change", "note"):
        t.add_column(col, justify="right" if col in ("point", "A ms", "B ms", "change") else "left")
    for c in changes:
        t.add_row(str(c.point), c.role, c.metric, "-" if c.before_ms is None else f"{c.before_ms:.3f}",
                  "-" if c.after_ms is None else f"{c.after_ms:.3f}",
                  "-" if c.rel_change is None else f"{c.rel_change:+.1%}", c.note)
    console.print(t if changes else f"no segment moved more than {threshold:.0%}")
    if args.json:
        from edgeplan.artifacts import write_json_atomic

        write_json_atomic(args.json, changes)
    return 1 if changes else 0


def cmd_profile_train(args, params) -> int:
    from edgeplan.profile.predictor import Predictor, examples, mape
    from edgeplan.profile.schema import Profile

    train = examples([Profile.load(p) for p in args.profiles])
    model = Predictor.train(train)
    model.save(args.out)
    console.print(f"trained on {len(train)} measured timings of {', '.join(model.trained_on)}; wrote {args.out}")
    if args.eval:
        test = examples([Profile.load(p) for p in args.eval])
        pred = model.predict_many([(e.features, e.threads, e.cores, e.probe_ms) for e in test])
        console.print(f"held out: {len(test)} timings of {', '.join(sorted({e.model for e in test}))}: "
                      f"MAPE {mape(pred, [e.ms for e in test]):.1%}")
    return 0


def cmd_profile_emulator(args, params) -> int:
    from edgeplan.profile import tpu_model

    tpu = tpu_model.for_host(args.host)
    cal = {**tpu.calibration, "loao_errors": list(tpu_model.shipped_loao())}
    t = Table(title="emulated Edge TPU (EMULATED, model " + tpu_model.MODEL_VERSION + "): every calibration row, "
              "leave-one-architecture-out (fitted without any host's row of that architecture) and in the joint fit")
    for col in ("model", "input", "host", "measured ms", "LOAO predicted ms", "LOAO error", "in-fit error",
                "dominant term"):
        t.add_column(col, justify="left" if col in ("model", "host", "dominant term") else "right")
    in_fit = {(r["model"], r["input"], r["host"]): r for r in cal["fit_rows"]}
    for row in cal["loao_errors"]:
        fit_row = in_fit[row["model"], row["input"], row["host"]]
        t.add_row(row["model"], str(row["input"]), row["host"], f"{row['measured_ms']:.2f}",
                  f"{row['predicted_ms']:.2f}",
                  f"{row['error']:+.1%}", f"{fit_row['error']:+.1%}",
                  f"{fit_row['dominant']} ({fit_row['terms_ms'][fit_row['dominant']]:.1f} ms)")
    console.print(t)
    errors = sorted(abs(r["error"]) for r in cal["loao_errors"])
    by_host = {h: sorted(abs(r["error"]) for r in cal["loao_errors"] if r["host"] == h) for h in cal["hosts"]}
    console.print("LOAO |error|: median " + f"{errors[len(errors) // 2]:.1%}, max {errors[-1]:.1%}; per host: "
                  + ", ".join(f"{h} median {v[len(v) // 2]:.1%} max {v[-1]:.1%}" for h, v in by_host.items()))
    p = cal["params"]
    console.print(f"fitted on every host: efficiency {p['efficiency']:.4f} (of {tpu.peak_macs_per_s:g} MAC/s), "
                  f"depthwise efficiency {p['dw_efficiency']:.4f}, {p['op_ms'] * 1e3:.1f} us per op, activation "
                  f"traffic {p['act_ns_per_byte']:.3f} ns/B, overlap {p['overlap']:.3f}; per host: "
                  + ", ".join(f"{h} overhead {p['overhead_ms'][h]:.3f} ms, link efficiency "
                              f"{p['link_efficiency'][h]:.3f}" for h in cal["hosts"]))
    console.print(f"{args.host}: link {tpu.link_bytes_per_s / 1e6:.0f} MB/s effective, "
                  f"on-chip {tpu.onchip_param_bytes} B")
    return 0


def cmd_fleet(args, params) -> int:
    fleet = _fleet(params)
    t = Table(title="device classes")
    for col in ("class", "CPU", "cores", "RAM", "accelerator", "on-chip B", "link B/s"):
        t.add_column(col)
    for c in fleet.device_classes.values():
        a = c.accelerator
        t.add_row(c.name, c.cpu, str(c.cores), f"{c.ram_bytes:,}", a.kind, f"{a.onchip_param_bytes:,}", f"{a.link_bytes_per_s:g}")
    console.print(t)
    t = Table(title="devices")
    for col in ("id", "class", "deployment", "work pool", "queue"):
        t.add_column(col)
    for d in fleet.devices:
        t.add_row(d.id, d.device_class, d.deployment or "-", d.work_pool, d.work_queue)
    console.print(t)
    return 0


def cmd_plan_swapless(args, params) -> int:
    from edgeplan.pipeline.planning import plan_swapless

    plan, path = plan_swapless(Path(args.out), args.deployment, params, args.variant)
    from edgeplan.plan.swapless.plan import figure_sources

    t = table(f"SwapLess plan for {plan.deployment} on {plan.device_class}",
              ("model", "version", "rate /s", "point", "of P", "cores", "predicted latency ms", "from"),
              right=("rate /s", "point", "of P", "cores", "predicted latency ms"))
    for m in plan.models:
        t.add_row(m.name, m.version, f"{m.rate:g}", str(m.point), str(m.last_point), str(m.cores),
                  f"{m.predicted_latency_ms:.2f}", figure_sources(m.point, m.last_point, plan.tpu_source))
    console.print(t)
    console.print(f"mean latency {plan.mean_latency_ms:.2f} ms ({plan.variant} model); baselines: " + ", ".join(
        f"{k} {v['mean_latency_ms']:.2f} ms" if v["mean_latency_ms"] is not None else f"{k} unstable"
        for k, v in plan.baselines.items()))
    console.print(f"{len(plan.regimes)} rate regimes; preload {len(plan.preload)} partitions "
                  f"({sum(p.bytes for p in plan.preload):,} of {plan.preload_budget_bytes:,} bytes)")
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"wrote {path}")
    return 0


def cmd_plan_flashmem(args, params) -> int:
    from edgeplan.plan.flashmem.deployment import plan_flashmem

    m_peak = None if args.m_peak_mb is None else int(args.m_peak_mb * 1e6)
    with _progress() as update:
        plan, path = plan_flashmem(Path(args.out), args.deployment, params, m_peak,
                                   lambda model, done, total: update(f"LC-OPG {model}", done, total))
    for m in plan.models:
        p = m.plan
        t = table(f"FlashMem overlap plan: {m.name} {m.version} on {plan.device_class}, M_peak "
                  f"{plan.m_peak / 1e6:.1f} MB ({p.objective} objective, λ {p.lam:g}; solved within "
                  f"{(p.solve_m_peak or p.m_peak) / 1e6:.1f} MB, reads up to {p.read_lead} segments ahead"
                  f"{', earlier where due' if p.read_in_time else ''})",
                  ("layers", "weights", "tier", "status", "objective", "gap", "seconds", "why"),
                  right=("weights", "objective", "gap", "seconds"))
        for w in p.windows:
            t.add_row(f"{w.first}-{w.last}", str(w.weights), w.tier, w.status,
                      "-" if w.objective is None else f"{w.objective:.0f}", "-" if w.gap is None else f"{w.gap:.3f}",
                      f"{w.seconds:.2f}", w.why)
        console.print(t)
        streamed = sum(1 for w in p.weights if not w.preload)
        console.print(f"{len(p.weights)} weights: {streamed} streamed, {len(p.weights) - streamed} preloaded "
                      f"({p.preload_bytes / 1e6:.2f} MB); {len(m.segments)} segments "
                      f"({sum(s.kernels == 'unpacked' for s in m.segments)} on unpacked kernels); predicted peak of "
                      f"weights {p.peak_resident_bytes / 1e6:.2f} MB vs {m.preload_peak_bytes / 1e6:.2f} MB all preloaded "
                      "(the plan's arithmetic: activations and arenas come on top, the runtime measures RSS)"
                      + (f"; beyond the layers' load capacity: {p.over_capacity_bytes / 1e6:.2f} MB read (the reads "
                         f"given lead included), {p.over_build_ms:.1f} ms of builds"
                         if p.over_capacity_bytes or p.over_build_ms else ""))
    console.print(f"wrote {path}")
    return 0


def cmd_plan_parallax(args, params) -> int:
    from edgeplan.plan.parallax.deployment import plan_parallax

    plan, path = plan_parallax(Path(args.out), args.deployment, params)
    t = table(f"Parallax plan for {plan.deployment} on {plan.device_class} (measured on this host; budget "
              f"{plan.budget_bytes / 2**20:.0f} MiB)",
              ("model", "version", "workers", "point", "parallel layers", "stages", "sub-models", "suffix ms",
               "plan ms"), right=("workers", "point", "parallel layers", "stages", "sub-models", "suffix ms", "plan ms"))
    for m in plan.models:
        for pp in m.points:
            t.add_row(m.name, m.version, str(m.workers), str(pp.point), str(pp.parallel_layers), str(len(pp.stages)),
                      str(sum(len(st.submodels) for st in pp.stages)),
                      "-" if pp.whole_ms is None else f"{pp.whole_ms:.2f}",
                      "-" if pp.plan_ms is None else f"{pp.plan_ms:.2f}")
        if not m.points:
            t.add_row(m.name, m.version, str(m.workers), "-", "0", "-", "-", "-", "-")
    console.print(t)
    for m in plan.models:
        console.print(f"{m.name}: {m.why}")
        for pp in m.points:
            for r in pp.regions:
                console.print(f"  point {pp.point}: Edge TPU region of {r.ops} ops, {r.macs / 1e6:.1f} MMAC: "
                              f"{'kept' if r.keep else 'back to the CPU'} ({r.why}; EMULATED offload)")
    console.print(f"wrote {path}")
    return 0


def cmd_plan_spatial(args, params) -> int:
    from edgeplan.plan.spatial.deployment import plan_spatial

    dims = tuple(x.strip().upper() for x in args.dims.split(",") if x.strip()) if args.dims else None
    with console.status("ADaPS search and int8 tiles"):
        record, path = plan_spatial(Path(args.out), args.deployment, params, args.threshold, dims)
    t = table(f"ADaPS plan for {record['deployment']}: {record['model']} {record['version']} split along "
              f"{record['axis']} (threshold {record['threshold']:g})",
              ("device", "host", "ps/MAC", "ms/layer", "Mbit/s", "cpu quota", "rows of the first layer"),
              right=("ps/MAC", "ms/layer", "Mbit/s", "cpu quota"))
    for k, dev in enumerate(record["devices"]):
        s, e = record["partitions"][0][k]
        t.add_row(dev["id"], dev["host"], f"{dev['s_per_mac'] * 1e12:.2f}", f"{dev['s_per_layer'] * 1e3:.3f}",
                  f"{dev['bytes_per_s'] * 8 / 1e6:g}", "-" if dev["cpu_quota"] is None else f"{dev['cpu_quota']:g}",
                  f"{s}..{e}" if e >= s else "none")
    console.print(t)
    for dim, r in record["searched"].items():
        console.print(f"{dim}: {r['layers']} layers in {r.get('sub_blocks', 1)} sub-block(s) to {r['region_end']} "
                      f"({r['why_it_ends']}), score "
                      f"{r['score_s'] * 1e3:.2f} ms, {r['scored']} nodes scored, {r['pruned']} pruned, "
                      f"{r['search_s']:.2f} s")
    b, tl = record["tiles"]["bytes_per_frame"], record["tiles"]
    console.print(f"tiles: {tl['stages']} stages; bytes per frame " + ", ".join(f"{k} {v:,}" for k, v in b.items())
                  + "; identical to the int8 model: " + ", ".join(f"{k.rsplit('_', 1)[-1]} kernels {v:.0%}"
                                                                  for k, v in tl["identical"].items())
                  + f"; float tiles vs the float model: max |diff| {tl['float_max_abs_diff']:.3g}")
    console.print(f"wrote {path} and {path.parent.parent / 'spatial'}")
    return 0


def cmd_plan_autodice(args, params) -> int:
    from edgeplan.plan.multidevice.deployment import PLOT_FILE, plan_autodice

    with _progress() as update:
        record, path = plan_autodice(Path(args.out), args.deployment, params, args.objective, args.generations,
                                     lambda done, total: update("unit times", done, total))
    t = table(f"AutoDiCE Pareto front for {record['deployment']}: {record['model']} {record['version']} over "
              f"{len(record['devices'])} devices (predicted; energy modelled)",
              ("point", "devices", "frames/s", "largest device MB", "energy J/frame (modelled)", "resources"),
              right=("point", "devices", "frames/s", "largest device MB", "energy J/frame (modelled)"))
    for k, p in enumerate([*record["front"], record["single_device"]]):
        label = "one device" if k == len(record["front"]) else str(k) + (" *" if k == record["chosen"] else "")
        t.add_row(label, str(len(p["mapping"])), f"{p['throughput_fps']:.2f}", f"{p['memory_bytes'] / 1e6:.2f}",
                  f"{p['energy_j_modelled']:.3f}", ", ".join(dict.fromkeys(p["resources"])))
    console.print(t)
    e, sp = record["explore"], record["split"]
    console.print(f"NSGA-II {e['population']} x {e['generations']} generations in {e['seconds']:.1f} s; * the point "
                  f"best on {record['objective']}: {sp['ranks']} ranks, {sp['stages']} stages, {sp['buffers']} buffers "
                  f"({sp['buffer_bytes'] / 1e3:.1f} KB per frame); verified: float max |diff| "
                  f"{sp['verify']['float_max_abs_diff']:.2g}, int8 identical (reference "
                  f"{sp['verify']['int8_identical_reference']:.0%}, XNNPACK {sp['verify']['int8_identical_xnnpack']:.0%})")
    console.print(f"wrote {path}, {path.parent.parent / PLOT_FILE} and {path.parent.parent / 'multidevice'}")
    return 0


def _stages():
    from edgeplan.pipeline import stages

    return stages


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgeplan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", help="params.yaml to read (default: ./params.yaml if present, else built-in defaults)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="cmd", required=True)

    def model_args(sp, name_required: bool):
        sp.add_argument("model", help="an .onnx file, a .keras file, a SavedModel directory, or zoo:NAME")
        if name_required:
            sp.add_argument("--name", required=True, help="model name (the artifact directory's first level)")
            sp.add_argument("--version", required=True, help="model version (the second level)")
        sp.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
        sp.add_argument("--input-shape", type=_shape, help="static input shape, NCHW, e.g. 1,3,224,224 "
                        "(needed when a non-batch dimension is dynamic)")

    def memory_arg(sp):
        sp.add_argument("--max-memory", metavar="SIZE", type=_size,
                        help="memory the stages may use, e.g. 16G or 512M (default: params.yaml "
                             "ingest.max_memory_bytes, else what the machine has available): a model whose estimated "
                             "peak (from its size, pipeline/preflight.py) is above it is refused before it is read or "
                             "converted")

    sp = sub.add_parser("compile", help="the whole model stage: ingest, analyze, int8, cut, compile, verify, and "
                        "the accuracy gate when a labelled evaluation set is configured")
    model_args(sp, True)
    memory_arg(sp)
    sp.add_argument("--accuracy-dataset", metavar="DATASET",
                    help="labelled evaluation set for the accuracy gate: a .npz with x (NCHW float) and y (integer "
                         "labels), or zoo:NAME (default: params.yaml accuracy.dataset; none: no gate)")
    sp.set_defaults(func=cmd_compile)
    sp = sub.add_parser("ingest", help="write canonical model.onnx and model.json")
    model_args(sp, True)
    memory_arg(sp)
    sp.set_defaults(func=cmd_ingest)
    sp = sub.add_parser("analyze", help="list the ONNX candidate partition points (single-tensor cuts)")
    model_args(sp, False)
    sp.add_argument("--json", help="write the candidates as analysis JSON to this file")
    sp.add_argument("--max-points", type=int, help="recorded in the JSON; the compile stage applies it")
    sp.add_argument("--branches", action="store_true",
                    help="also the Parallax branch-layer structure of the ONNX graph: branches (maximal chains and "
                         "one-node split/merge units) grouped into layers that can run at once")
    sp.add_argument("--paths", choices=("H", "W"), nargs="?", const="H", metavar="DIM",
                    help="also ADaPS's path analysis along DIM (H, the default, or W): the layers it partitions, "
                         "their single-entry, single-exit sub-blocks and what ends the region")
    sp.set_defaults(func=cmd_analyze)
    sp = sub.add_parser("build", help="int8 conversion, matching, segments and Edge TPU compile of an ingested model")
    sp.add_argument("artifact_dir")
    memory_arg(sp)
    sp.set_defaults(func=cmd_build)
    sp = sub.add_parser("verify", help="check every point of ARTIFACT_DIR; writes verify.json; exit 1 on failure")
    sp.add_argument("artifact_dir")
    sp.set_defaults(func=cmd_verify)
    sp = sub.add_parser("accuracy", help="the accuracy gate on ARTIFACT_DIR: top-1 of the float model and of the "
                        "int8 chain at every point on a labelled set; writes accuracy.json; exit 1 if no point passes",
                        description="A point whose top-1 falls more than accuracy.max_top1_drop (a fraction) below "
                        "the float model's is never planned or switched to; a model with no passing point is not "
                        "published.")
    sp.add_argument("artifact_dir")
    sp.add_argument("--dataset", dest="accuracy_dataset", metavar="DATASET",
                    help="a .npz with x (NCHW float) and y (integer labels), or zoo:NAME (default: params.yaml "
                         "accuracy.dataset)")
    sp.set_defaults(func=cmd_accuracy)
    sp = sub.add_parser("stream", help="FlashMem streaming segments of ARTIFACT_DIR's int8 model (large weights "
                        "split, one segment per layer, checked identical) -> stream/; exit 1 if not identical")
    sp.add_argument("artifact_dir")
    sp.set_defaults(func=cmd_stream)
    sp = sub.add_parser("parallax", help="Parallax branch-parallel plans for ARTIFACT_DIR's int8 model and every "
                        "point's CPU suffix, measured on this host -> parallax/; exit 1 if not identical",
                        description="Per target (the int8 model, each point's suffix): branches and layers, "
                        "refinement (parallax.min_nodes, parallax.beta), the largest branch subset within the budget "
                        "(parallax.budget_bytes, else MemAvailable x (1 - parallax.margin)) packed onto "
                        "parallax.workers by LPT on measured times, each layer branch-parallel only where that "
                        "measured faster than one sub-model on the same XNNPACK threads and kept only if the whole "
                        "model then ran faster; sub-models cut from the int8 model and checked identical with both "
                        "kernel sets.")
    sp.add_argument("artifact_dir")
    sp.set_defaults(func=cmd_parallax)
    sp = sub.add_parser("zoo", help="real architectures with seeded weights (no downloads)")
    zsub = sp.add_subparsers(dest="zoo_cmd", required=True)
    zsub.add_parser("list", help="list the zoo models")
    zb = zsub.add_parser("build", help="build a zoo model file into DIR")
    zb.add_argument("name")
    zb.add_argument("dir")
    sp.set_defaults(func=cmd_zoo)

    sp = sub.add_parser("profile", help="device profiles: run, diff, train the predictor, show the emulator")
    psub = sp.add_subparsers(dest="profile_cmd", required=True)
    pr = psub.add_parser("run", help="profile every segment of ARTIFACT_DIR on a device class -> profiles/CLASS.json",
                         description="Prefixes get Edge TPU times (EMULATED for *-emulated classes: modelled from the "
                         "compile report), suffixes CPU times measured here with 1..K interpreter threads.")
    pr.add_argument("artifact_dir", help="artifacts/<name>/<version> of a compiled model (edgeplan compile)")
    pr.add_argument("--device-class", help="a class of the fleet registry (`edgeplan fleet`); default: every class "
                    "whose deployments serve this model version, and the classes of a split deployment's devices "
                    "with conv speeds (what `edgeplan run` profiles)")
    pr.add_argument("--summary-json", help="also write the per-point summary (tpu_ms, cpu_ms per core count) here")
    pr.add_argument("--sample", type=int, help="measure only this many suffixes (spread evenly), predict the rest")
    pr.add_argument("--predictor", help="predictor file from `edgeplan profile train` (for --sample or predicted classes)")
    pr.add_argument("--cpu-prefixes", action="store_true", help="also time prefixes on the CPU (predictor training data)")
    pr.add_argument("--conv-speed", action="store_true",
                    help="also fit the class's seconds per MAC on its conv times (ADaPS speed_d, what `edgeplan plan "
                         "spatial` reads); under the class's cpu_quota when it has one (a cpu cgroup: needs root)")
    pr.add_argument("--repeats", type=int, help="timed runs per segment and thread count (default: params profile.repeats)")
    pr.add_argument("--budget-s", type=float, help="time budget per segment (default: params profile.budget_s)")
    pr.add_argument("--span-s", type=float, help="spread the timed rounds over at least this long (default: params profile.span_s)")
    pr.add_argument("--timeout-s", type=float, help="kill a segment still running after this (default: params profile.timeout_s)")
    pr.set_defaults(func=cmd_profile_run)
    pd = psub.add_parser("diff", help="list segments whose latency moved beyond a threshold (exit 1 if any)")
    pd.add_argument("a")
    pd.add_argument("b")
    pd.add_argument("--threshold", type=float, help="relative change, e.g. 0.1 (default: params profile.drift_threshold)")
    pd.add_argument("--other-model", action="store_true", help="compare profiles of different models anyway")
    pd.add_argument("--json", help="write the changes as JSON here")
    pd.set_defaults(func=cmd_profile_diff)
    pt = psub.add_parser("train", help="fit the XGBoost latency predictor on measured profiles")
    pt.add_argument("profiles", nargs="+", help="profiles/<class>.json files with measured CPU timings")
    pt.add_argument("--out", required=True, help="predictor file to write")
    pt.add_argument("--eval", nargs="*", help="held-out profiles: report the predictor's MAPE on them")
    pt.set_defaults(func=cmd_profile_train)
    pe = psub.add_parser("emulator", help="the emulated Edge TPU's fitted parameters and leave-one-architecture-out errors")
    pe.add_argument("--host", default="desktop", help="the host whose overhead and link are shown (desktop, rpi4b, "
                                                       "devboard); the fit uses every host's rows")
    pe.set_defaults(func=cmd_profile_emulator)
    sp = sub.add_parser("fleet", help="check the fleet registry in params.yaml and list classes and devices")
    sp.set_defaults(func=cmd_fleet)
    sp = sub.add_parser("plan", help="execution plans for a deployment")
    plsub = sp.add_subparsers(dest="plan_cmd", required=True)
    ps = plsub.add_parser("swapless", help="SwapLess: partition points and CPU cores for every model of a deployment",
                          description="Reads each model's profiles/<class>.json, plans with the SwapLess analytic model "
                          "(exact optimum when small, else the refined search), writes <out>/deployments/NAME/plans/"
                          "swapless.json with a rate-regime table, the partitions to preload and the baselines.")
    ps.add_argument("--deployment", required=True, help="a deployment of params.yaml")
    ps.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    ps.add_argument("--variant", choices=("refined", "paper"), help="analytic model (default: params.yaml plan.variant)")
    ps.set_defaults(func=cmd_plan_swapless)
    pf = plsub.add_parser("flashmem", help="FlashMem: overlap plans streaming each model's weights under M_peak",
                          description="Reads each model's stream/ (edgeplan stream) and the load capacity measured "
                          "in profiles/<class>.json, solves LC-OPG with CP-SAT window by window (tiers: strict, "
                          "soft capacity, incremental preloading, greedy latest-fit) within flashmem.solve_share "
                          "of M_peak, cuts the segments the plan runs into <out>/deployments/NAME/flashmem/, moves "
                          "each streamed read up to flashmem.read_lead segments ahead of its segment while the plan "
                          "fits M_peak (earlier still where the readers would not have it in time: "
                          "flashmem.read_in_time), and writes plans/flashmem.json.")
    pf.add_argument("--deployment", required=True, help="a deployment of params.yaml")
    pf.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    pf.add_argument("--m-peak-mb", type=float, help="M_peak in MB (default: flashmem.m_peak_bytes, else "
                    "flashmem.m_peak_ram_share of the class's RAM less SwapLess's preloads)")
    pf.set_defaults(func=cmd_plan_flashmem)
    px = plsub.add_parser("parallax", help="Parallax: which CPU suffixes of a deployment run branch-parallel",
                          description="After `plan swapless`: for every model of the deployment, the points whose "
                          "suffix keeps a branch-parallel layer in the model's `edgeplan parallax` stage (measured on "
                          "this host), on W workers when SwapLess gives the model at least W cores. Copies their "
                          "sub-models into <out>/deployments/NAME/parallax/ and writes plans/parallax.json; the bundle "
                          "carries both and the runtime serves those suffixes branch-parallel.")
    px.add_argument("--deployment", required=True, help="a deployment of params.yaml")
    px.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    px.set_defaults(func=cmd_plan_parallax)
    pz = plsub.add_parser("spatial", help="ADaPS: one model split along H or W over the deployment's devices",
                          description="The deployment's one model split spatially over the fleet registry's devices "
                          "assigned to it (registry order; the first is the head). Speeds come from each device "
                          "class's conv-speed fit in the model's profile (`edgeplan profile run --conv-speed`), links "
                          "from the class's net_bytes_per_s. Searches eq. (12) along each dimension, cuts the best "
                          "plan into int8 tiles verified identical with both kernel sets, and writes "
                          "<out>/deployments/NAME/spatial/ (tables.json, tiles, rankfile, hostfile) and "
                          "plans/spatial.json. Run the tiles with `edgeplan-runtime mpi run`.")
    pz.add_argument("--deployment", required=True, help="a deployment of params.yaml with one model")
    pz.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    pz.add_argument("--threshold", type=float, help="smallest share of a layer a device takes, in (0, 1] (default: "
                    "params spatial.threshold)")
    pz.add_argument("--dims", help="dimensions to search: H, W or H,W (default: params spatial.dims)")
    pz.set_defaults(func=cmd_plan_spatial)
    pa = plsub.add_parser("autodice", help="AutoDiCE: one model cut into consecutive layers over the deployment's devices",
                          description="The deployment's one model split over the fleet registry's devices assigned to "
                          "it (registry order; their classes' cores, net_bytes_per_s, power_w and cpu_quota). Times "
                          "every unit (the layers the int8 model fuses) on this machine, explores cuts and 1-core or "
                          "all-core resources with NSGA-II (params multidevice), splits the Pareto point best on the "
                          "objective into int8 and float stages verified against the whole model, and writes "
                          "<out>/deployments/NAME/multidevice/ (tables.json, stages, rankfile, hostfile), "
                          "plans/autodice.json and plans/autodice.png (the front). Throughput and memory are "
                          "predicted, energy modelled; `edgeplan-runtime mpi run` measures them.")
    pa.add_argument("--deployment", required=True, help="a deployment of params.yaml with one model")
    pa.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    pa.add_argument("--objective", choices=("throughput", "memory", "energy"),
                    help="the Pareto point split (default: params multidevice.objective)")
    pa.add_argument("--generations", type=int, help="NSGA-II generations (default: params multidevice.generations)")
    pa.set_defaults(func=cmd_plan_autodice)
    from edgeplan import cli_multidevice, cli_run, cli_store

    cli_multidevice.register(sub)
    cli_store.register(sub)
    cli_run.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verbose:
        os.environ.setdefault(quiet.ENV, "1")  # TensorFlow's load-time lines too (edgeplan/quiet.py)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        from edgeplan.pipeline import params as params_mod

        params = params_mod.load(args.params)
        if getattr(args, "max_memory", None) is not None:
            params["ingest"]["max_memory_bytes"] = args.max_memory
        return args.func(args, params)
    except EdgeplanError as e:
        # escaped: a message quoting a shape ("[1, 17, 17, 1088]") is not rich markup
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/] (what a stage had finished is kept; a rerun resumes from it)",
                  highlight=False)
        return 130
    except Exception as e:  # a fault of edgeplan or a library: one line here, the traceback in a log file
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" writing {e.filename}" if e.filename else ""
            err.print(f"[bold red]error:[/] no space left on the device{escape(where)}: free some (or write elsewhere: "
                      "--out) and run it again; what a stage had finished is kept", highlight=False, soft_wrap=True)
            return 74  # EX_IOERR
        path = crash_log(args, e)
        first = (str(e).splitlines() or [""])[0][:300]
        err.print(f"[bold red]error:[/] internal error {escape(type(e).__name__)}: {escape(first)} (the traceback "
                  f"is in {escape(str(path))}; please report it)", highlight=False, soft_wrap=True)
        return 70  # EX_SOFTWARE: not the input's fault (2)


def crash_log(args, exc: BaseException) -> Path:
    """Write ``exc``'s traceback to a log file and return its path: ``ARTIFACT_DIR/logs/`` for a command on an
    artifact directory (or on one --out/--name/--version already names), else ``.edgeplan/logs/`` here, else the
    temporary directory when neither can be written."""
    import tempfile
    import time
    import traceback

    artifact = getattr(args, "artifact_dir", None)
    if artifact is None and all(isinstance(getattr(args, k, None), str) for k in ("out", "name", "version")):
        artifact = Path(args.out) / args.name / args.version
    dirs = [Path(artifact) / "logs"] if artifact and (Path(artifact) / "model.json").is_file() else []
    dirs += [Path(".edgeplan") / "logs", Path(tempfile.gettempdir()) / "edgeplan-logs"]
    name = f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    text = f"edgeplan {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(exc))
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)
            return (d / name).resolve()
        except OSError:
            continue
    return Path("<no log: nowhere to write one>")


if __name__ == "__main__":
    sys.exit(main())
