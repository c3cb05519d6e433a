"""Shared fixtures: real models built in code or from the onnx package's zoo, compiled once per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

from edgeplan.pipeline import params as params_mod  # noqa: E402
from edgeplan.pipeline import stages  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def params() -> dict:
    return params_mod.load(REPO / "params.yaml")


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory, params):
    """``compiled(zoo_name)`` -> (artifact dir, BuildResult, VerifyReport), built once per session."""
    root = tmp_path_factory.mktemp("artifacts")
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            d = stages.ingest(f"zoo:{name}", name, "1", root)
            result = stages.build(d, params)
            report = stages.verify(d, params)
            cache[name] = (d, result, report)
        return cache[name]

    return get
