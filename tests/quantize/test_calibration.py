"""Representative data: seeded random images, or a directory of .npy files, with clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from edgeplan.errors import CalibrationError
from edgeplan.quantize.calibration import CalibrationSpec, calibration_data, sample_inputs

SHAPE = (1, 3, 8, 8)


def test_random_is_seeded_and_in_range():
    spec = CalibrationSpec.from_params({"kind": "random", "low": 0.0, "high": 2.0, "samples": 5, "seed": 3})
    a, b = calibration_data(spec, SHAPE), calibration_data(spec, SHAPE)
    assert a.shape == (5, 3, 8, 8) and a.dtype == np.float32 and (a >= 0).all() and (a <= 2).all()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(sample_inputs(spec, SHAPE, 5, seed=4), a)


def test_npy_directory_of_samples_and_batches(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.normal(size=(3, 8, 8)).astype(np.float32))  # one sample
    np.save(tmp_path / "b.npy", rng.normal(size=(4, 3, 8, 8)).astype(np.float32))  # a batch
    spec = CalibrationSpec.from_params({"kind": "npy_dir", "path": str(tmp_path), "samples": 100})
    data = calibration_data(spec, SHAPE)
    assert data.shape == (5, 3, 8, 8)
    np.testing.assert_array_equal(data[0], np.load(tmp_path / "a.npy"))


def test_bad_calibration_input_names_the_file(tmp_path):
    np.save(tmp_path / "wrong.npy", np.zeros((8, 8, 3), np.float32))  # NHWC instead of NCHW
    spec = CalibrationSpec.from_params({"kind": "npy_dir", "path": str(tmp_path)})
    with pytest.raises(CalibrationError, match=r"wrong\.npy.*does not fit"):
        calibration_data(spec, SHAPE)
    with pytest.raises(CalibrationError, match="no .npy files"):
        calibration_data(CalibrationSpec.from_params({"kind": "npy_dir", "path": str(tmp_path / "none")}), SHAPE)
    with pytest.raises(CalibrationError, match="unknown keys"):
        CalibrationSpec.from_params({"kind": "random", "colour": "blue"})
    with pytest.raises(CalibrationError, match="'random' or 'npy_dir'"):
        CalibrationSpec.from_params({"kind": "imagenet"})
