"""The ingest stage's work, in a child process of ``stages.ingest``: ``SOURCE ZOO_DIR OUT_DIR NAME VERSION
[INPUT_SHAPE]`` builds a zoo model when SOURCE names one, converts it to the canonical ONNX (``graph/ingest``) and
writes ``OUT_DIR/model.onnx`` (with ``model.onnx.data`` beside it for a large model: ``artifacts.write_onnx``) and
``OUT_DIR/model.json``.

Why a child: loading a Keras model leaves its heap behind (VGG16: the process stayed ~1.5 GB above its start after
ingest, measured), and every later stage of ``edgeplan compile`` ran on top of it; a converter that crashes takes
only the child down. An EdgeplanError is reported as one line after ``ERROR_MARK`` (its class and message, JSON),
so the parent raises the same error.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ERROR_MARK = "edgeplan-ingest-error "


def main(argv: list[str]) -> int:
    from edgeplan.errors import EdgeplanError

    source, zoo_dir, out, name, version = argv[:5]
    shape = tuple(int(d) for d in argv[5].split(",")) if len(argv) > 5 and argv[5] else None
    try:
        from edgeplan.artifacts import write_onnx
        from edgeplan.graph.ingest import load_any
        from edgeplan.graph.model import GraphView
        from edgeplan.zoo import resolve

        model = load_any(resolve(source, Path(zoo_dir)), input_shape=shape)
        # the bytes hashed as they are written: graph.model.fingerprint without holding them (VGG16: +2.2 GB); a
        # model past 1 GiB of weights with them in model.onnx.data (protobuf reads no file over 2 GB)
        sha = write_onnx(Path(out) / "model.onnx", model)
        GraphView(model).info(name, version, source, sha).save(Path(out) / "model.json")
    except EdgeplanError as e:
        print(ERROR_MARK + json.dumps({"type": type(e).__name__, "message": str(e)}), file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
