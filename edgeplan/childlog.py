"""What the converters' child processes print, kept in the artifact's ``logs/`` instead of shown or dropped.

tf2onnx (the ingest child), onnx2tf and the TFLite quantizer (the int8 conversion's children) write warnings,
caught tracebacks and progress lines that look like failures to a user. Their output is captured, never shown; it
is appended here, one block per child (its command, exit status and output), so that a failure's one line can name
the file that holds the rest: ``ARTIFACT_DIR/logs/ingest.log`` (``ingest-failed.log`` when the ingest failed, so a
failed attempt never replaces the log of the model the directory holds) and ``ARTIFACT_DIR/logs/convert.log``.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

DIR = "logs"


def start(path: Path | None) -> None:
    """Begin ``path`` afresh: a stage that runs again logs its own run, not the one before."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def keep(path: Path | None, cmd: Sequence[str], returncode: int | None, stdout: str | bytes | None,
         stderr: str | bytes | None) -> None:
    """Append one child's command, exit status and output to ``path`` (nothing when ``path`` is None)."""
    if path is None:
        return
    text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (stdout, stderr) if x)
    status = "timed out" if returncode is None else f"exit {returncode}"
    args = (" ".join(str(c).split()) for c in cmd)  # a script given with -c: one line, cut short
    shown = " ".join(a if len(a) <= 120 else a[:120] + "..." for a in args)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {status}: {shown}\n{text}")
        if text and not text.endswith("\n"):
            f.write("\n")


def named(path: Path | None) -> str:
    """`` (converter output: PATH)`` for a failure's line, or nothing when no log was kept."""
    return f" (converter output: {path})" if path is not None and path.is_file() else ""
