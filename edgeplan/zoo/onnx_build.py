"""What the node-by-node zoo builders share: the model around a graph, and its file written once."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import helper


def finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    """``graph`` as an opset-17, IR-8 model (what the converters here take)."""
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def save_once(out: Path, make: Callable[[], onnx.ModelProto]) -> Path:
    """``out``.onnx, built by ``make`` unless it is there already."""
    path = out.with_name(f"{out.name}.onnx")
    if not path.is_file():
        onnx.save(make(), str(path))
    return path
