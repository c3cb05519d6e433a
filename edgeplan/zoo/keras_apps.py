"""Keras applications with seeded weights and calibrated batch-norm statistics, saved as ``.keras``."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def build(arch: str, size: int, out: Path, alpha: float | None = None, seed: int = 0,
          input_range: tuple[float, float] = (-1.0, 1.0)) -> Path:
    """``arch`` of ``keras.applications`` at ``size``, saved as ``out``.keras (kept if it exists); its batch-norm
    statistics calibrated on a random batch drawn from ``input_range`` (the range its inputs will have)."""
    path = out.with_name(f"{out.name}.keras")
    if path.is_file():
        return path
    import keras

    path.parent.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(seed)
    kwargs = {"alpha": alpha} if alpha is not None else {}
    ctor = getattr(keras.applications, arch)
    model = ctor(input_shape=(size, size, 3), weights=None, classifier_activation=None, **kwargs)
    calibrate_batch_norm(model, seed, input_range=input_range)
    tmp = path.with_name(f".{path.name}.tmp.keras")
    model.save(tmp)
    tmp.replace(path)
    return path


def expects_pixels(model) -> bool:
    """Whether the model starts with its own preprocessing (Rescaling or Normalization: MobileNetV3, EfficientNet,
    EfficientNetV2, ConvNeXt), which takes pixel values in [0, 255] rather than values around [-1, 1]."""
    import keras

    return any(isinstance(layer, (keras.layers.Rescaling, keras.layers.Normalization)) for layer in model.layers[:4])


def calibrate_batch_norm(model, seed: int, batch: int = 8, input_range: tuple[float, float] = (-1.0, 1.0)) -> None:
    """Set every BatchNormalization's moving statistics to those of one random batch.

    With momentum 0, one forward pass in training mode stores each layer's batch statistics; since the
    pass normalises with those same statistics, every layer sees inputs already normalised upstream.
    """
    import keras

    bns = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    shape = (batch, *model.inputs[0].shape[1:])
    x = np.random.default_rng(seed).uniform(*input_range, shape).astype("float32")
    model(x, training=True)
    for bn, m in zip(bns, saved):
        bn.momentum = m
