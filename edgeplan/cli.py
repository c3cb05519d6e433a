"""``edgeplan``: the command line of the offline pipeline.

    edgeplan compile MODEL --name N --version V   ingest -> analyze -> int8 -> cut -> compile -> verify
    edgeplan analyze MODEL --json OUT             list the ONNX candidate partition points
    edgeplan verify ARTIFACT_DIR                  re-run the checks, print the table (exit 1 on failure)
    edgeplan ingest | build                       single stages (what dvc.yaml runs)
    edgeplan zoo list | zoo build NAME DIR        real architectures with seeded weights, no downloads
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from edgeplan.errors import EdgeplanError  # noqa: E402

console = Console(stderr=False, width=max(120, Console().width))
err = Console(stderr=True)


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


def cmd_ingest(args, params) -> int:
    out = _stages().ingest(args.model, args.name, args.version, Path(args.out), args.input_shape)
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
    if args.json:
        write_json_atomic(args.json, analysis)
        console.print(f"wrote {args.json}")
    return 0


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


def cmd_compile(args, params) -> int:
    st = _stages()
    with _progress() as update:
        update("ingest", 0, 1)
        root = st.ingest(args.model, args.name, args.version, Path(args.out), args.input_shape)
        update("ingest", 1, 1)
        result = st.build(root, params, update)
    print_build(result)
    with _progress() as update:
        report = st.verify(root, params, update)
    print_verify(report)
    console.print(f"artifacts in {root}")
    return 0 if report.ok and not result.errors else 1


def cmd_zoo(args, params) -> int:
    from edgeplan import zoo

    if args.zoo_cmd == "list":
        for name in zoo.NAMES:
            console.print(f"{name:<22} {zoo.describe(name)}")
        return 0
    path = zoo.build(args.name, Path(args.dir))
    console.print(f"wrote {path}")
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

    sp = sub.add_parser("compile", help="the whole model stage: ingest, analyze, int8, cut, compile, verify")
    model_args(sp, True)
    sp.set_defaults(func=cmd_compile)
    sp = sub.add_parser("ingest", help="write canonical model.onnx and model.json")
    model_args(sp, True)
    sp.set_defaults(func=cmd_ingest)
    sp = sub.add_parser("analyze", help="list the ONNX candidate partition points (single-tensor cuts)")
    model_args(sp, False)
    sp.add_argument("--json", help="write the candidates as analysis JSON to this file")
    sp.add_argument("--max-points", type=int, help="recorded in the JSON; the compile stage applies it")
    sp.set_defaults(func=cmd_analyze)
    sp = sub.add_parser("build", help="int8 conversion, matching, segments and Edge TPU compile of an ingested model")
    sp.add_argument("artifact_dir")
    sp.set_defaults(func=cmd_build)
    sp = sub.add_parser("verify", help="check every point of ARTIFACT_DIR; writes verify.json; exit 1 on failure")
    sp.add_argument("artifact_dir")
    sp.set_defaults(func=cmd_verify)
    sp = sub.add_parser("zoo", help="real architectures with seeded weights (no downloads)")
    zsub = sp.add_subparsers(dest="zoo_cmd", required=True)
    zsub.add_parser("list", help="list the zoo models")
    zb = zsub.add_parser("build", help="build a zoo model file into DIR")
    zb.add_argument("name")
    zb.add_argument("dir")
    sp.set_defaults(func=cmd_zoo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        from edgeplan.pipeline import params as params_mod

        params = params_mod.load(args.params)
        return args.func(args, params)
    except EdgeplanError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
