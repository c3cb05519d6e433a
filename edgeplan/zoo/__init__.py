"""Real architectures built without downloads, with seeded weights that make outputs depend on inputs.

- Keras applications (``weights=None``, ``classifier_activation=None``: logits), batch-norm statistics
  calibrated on a random batch so activations neither vanish nor explode;
- the model-zoo graphs shipped in the onnx package (``onnx/backend/test/data/light``), whose weights are
  all the constant 0.02: re-weighted (He-normal convolutions and dense layers, batch-norm statistics
  calibrated on a random batch) and with their final softmax removed;
- tiny CNNs built node by node, for fast tests.

``zoo:NAME`` is accepted wherever a model path is (``edgeplan compile zoo:mobilenetv2_0.35_96``).
"""
from __future__ import annotations

from pathlib import Path

from edgeplan.zoo.registry import NAMES, build, describe, eval_set

__all__ = ["NAMES", "build", "describe", "eval_set", "resolve"]


def resolve(source: str, workdir: Path) -> Path:
    """A model path for ``source``: itself, or the file ``zoo:NAME`` builds into ``workdir``."""
    if not source.startswith("zoo:"):
        return Path(source)
    return build(source[4:], workdir)
