"""digits_cnn: a small CNN trained here, seeded, on scikit-learn's handwritten digits (1,797 labelled 8x8 scans
shipped in the package), upsampled 4x to 32x32. A stratified quarter is held out, never trained on: it is the
model's labelled evaluation set, ``digits_cnn.eval.npz`` beside the ``.keras`` file (``x``: float32 NCHW in
[0, 1], ``y``: int64 labels), which the accuracy gate reads as ``accuracy.dataset: zoo:digits_cnn``."""
from __future__ import annotations

from pathlib import Path

import numpy as np

SIZE = 32  # 8x8 scans, each pixel repeated 4x4
HELD_OUT = 0.25
EPOCHS = 20


def eval_path(out: Path) -> Path:
    return out.with_name(f"{out.name}.eval.npz")


def split(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_held_out, y_held_out)); x float32 NCHW (N, 1, 32, 32) in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)  # 0..16 grey levels
    x = np.kron(x, np.ones((SIZE // 8, SIZE // 8), np.float32))[:, None]
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=HELD_OUT, random_state=seed, stratify=y)
    return (xtr, ytr), (xte, yte)


def build(out: Path, seed: int = 0) -> Path:
    """Train (once: a second call reuses the files) and save ``out.keras`` and its held-out set."""
    path, held = out.with_name(f"{out.name}.keras"), eval_path(out)
    if path.is_file() and held.is_file():
        return path
    import keras

    path.parent.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(seed)
    (xtr, ytr), (xte, yte) = split(seed)
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 1)),
        layers.Conv2D(16, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(), layers.Dense(10),  # logits
    ], name="digits_cnn")
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(xtr.transpose(0, 2, 3, 1), ytr, epochs=EPOCHS, batch_size=32, shuffle=True, verbose=0)
    tmp = held.with_name(f".{held.name}.tmp.npz")
    np.savez(tmp, x=xte, y=yte)
    tmp.replace(held)
    tmp = path.with_name(f".{path.name}.tmp.keras")
    model.save(tmp)
    tmp.replace(path)
    return path
