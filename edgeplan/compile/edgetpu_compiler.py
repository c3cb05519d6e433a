"""Adapter for the real ``edgetpu_compiler``: run it, parse its stdout and ``.log`` into ``CompileReport``s.

Flags used: ``-o`` output directory, ``-s`` show the operation table, ``-n`` number of segments,
``-a`` allow more than one Edge TPU subgraph; several models given at once are co-compiled (their
parameters share the on-chip cache, in the order given).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from edgeplan.artifacts import CompileReport, OperatorRow
from edgeplan.errors import CompilerError

_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2, "GB": 1000**3}
_SIZE = r"([\d.]+)\s*([KMG]?i?B)"
_ROW = re.compile(r"^([A-Z][A-Z0-9_\-]*)\s+(\d+)\s+(\S.*?)\s*$")


def find() -> str | None:
    return shutil.which("edgetpu_compiler")


def size_bytes(text: str) -> int:
    m = re.fullmatch(_SIZE, text.strip())
    if not m:
        raise ValueError(f"not a compiler size: {text!r}")
    return int(round(float(m.group(1)) * _UNITS[m.group(2)]))


def _field(block: str, label: str) -> str | None:
    m = re.search(rf"^{re.escape(label)}:\s*(.+?)\s*$", block, re.MULTILINE)
    return m.group(1) if m else None


def parse_table(text: str) -> tuple[OperatorRow, ...]:
    """Rows of every ``Operator  Count  Status`` table in ``text``."""
    rows = []
    in_table = False
    for line in text.splitlines():
        if re.match(r"^\s*Operator\s+Count\s+Status\s*$", line):
            in_table = True
            continue
        if not in_table:
            continue
        m = _ROW.match(line)
        if m:
            rows.append(OperatorRow(m.group(1), int(m.group(2)), m.group(3)))
        elif line.strip() and not line.startswith(" "):
            in_table = False  # the table ended ("Input model:", "...All other operators ...")
    return tuple(rows)


def parse_output(stdout: str, logs: dict[str, str] | None = None) -> list[CompileReport]:
    """One report per model section of the compiler's stdout (``Input model:`` ... up to the next one).

    ``logs`` maps an ``Operation log`` file name to its text; its table is used when stdout has none.
    """
    version = re.search(r"Edge TPU Compiler version\s+(\S+)", stdout)
    starts = [m.start() for m in re.finditer(r"^Input model:", stdout, re.MULTILINE)]
    if not starts:
        raise CompilerError("edgetpu_compiler output has no 'Input model:' section: " + stdout.strip()[-300:])
    names = []
    reports = []
    for k, start in enumerate(starts):
        block = stdout[start: starts[k + 1] if k + 1 < len(starts) else len(stdout)]
        model = _field(block, "Input model") or "?"
        names.append(model)
        onchip = _field(block, "On-chip memory used for caching model parameters")
        remaining = _field(block, "On-chip memory remaining for caching model parameters")
        offchip = _field(block, "Off-chip memory used for streaming uncached model parameters")
        total = int(_field(block, "Total number of operations") or 0)
        table = parse_table(block)
        log_name = _field(block, "Operation log")
        log_text = ""
        if logs and log_name:
            log_text = logs.get(log_name) or logs.get(Path(log_name).name, "")
            if not table and log_text:
                table = parse_table(log_text)
        tpu = _field(block, "Number of operations that will run on Edge TPU")
        cpu = _field(block, "Number of operations that will run on CPU")
        if tpu is None:
            mapped = sum(r.count for r in table if r.status == "Mapped to Edge TPU")
            tpu_ops = mapped if table and sum(r.count for r in table) == total else total
            cpu_ops = total - tpu_ops
        else:
            tpu_ops, cpu_ops = int(tpu), int(cpu or 0)
        first = next((r for r in table if r.status != "Mapped to Edge TPU"
                      and r.status != "More than one subgraph is not supported"), None)
        reports.append(
            CompileReport(
                compiler="edgetpu_compiler",
                compiler_version=version.group(1) if version else "unknown",
                model=model,
                onchip_param_bytes=size_bytes(onchip) if onchip else 0,
                offchip_param_bytes=size_bytes(offchip) if offchip else 0,
                onchip_remaining_bytes=size_bytes(remaining) if remaining else 0,
                subgraph_count=int(_field(block, "Number of Edge TPU subgraphs") or 0),
                total_ops=total,
                tpu_ops=tpu_ops,
                cpu_ops=cpu_ops,
                operators=table,
                first_unmapped={"op": first.op, "index": None, "status": first.status, "reason": first.status}
                if first else None,
                log=log_text,
            )
        )
    return [replace(r, cocompiled_with=tuple(n for n in names if n != r.model)) for r in reports]


def compile_models(
    paths: list[Path],
    out_dir: Path,
    *,
    allow_multiple_subgraphs: bool = False,
    num_segments: int | None = None,
    timeout: float = 600,
) -> list[tuple[CompileReport, Path]]:
    exe = find()
    if exe is None:
        raise CompilerError("edgetpu_compiler is not on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [exe, "-s", "-o", str(out_dir)]
    if allow_multiple_subgraphs:
        cmd.append("-a")
    if num_segments:
        cmd += ["-n", str(num_segments)]
    cmd += [str(p) for p in paths]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise CompilerError(f"edgetpu_compiler did not finish within {timeout:.0f} s on {paths}") from e
    if proc.returncode != 0:
        raise CompilerError(f"edgetpu_compiler failed on {[str(p) for p in paths]}: {(proc.stdout + proc.stderr).strip()[-500:]}")
    logs = {p.name: p.read_text() for p in out_dir.glob("*.log")}
    reports = parse_output(proc.stdout, logs)
    return [(r, out_dir / f"{Path(p).stem}_edgetpu.tflite") for r, p in zip(reports, paths)]
