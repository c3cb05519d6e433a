"""Shared fixtures: real models built in code or from the onnx package's zoo, compiled once per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
# a fresh Prefect home's ephemeral server migrates its database first: slow on a busy 2-core machine
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# `edgeplan run` in tests uses Prefect's ephemeral server unless a test asks for the local one (which outlives
# the command: tests/flows/test_compile_model.py starts, reuses and stops it)
os.environ.setdefault("EDGEPLAN_PREFECT_SERVER", "ephemeral")

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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-protocol server on loopback (moto's server mode), its endpoint URL; credentials are set in
    the environment for boto3's standard chain. One bucket, ``edgeplan``, exists."""
    from edgeplan.store.moto_server import moto_server

    with moto_server(log=tmp_path_factory.mktemp("moto") / "server.log") as server:
        yield server.url


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real `prefect server start` on loopback with its own home; yields (api_url, env for clients)."""
    from edgeplan.pipeline.prefect_server import prefect_server as start

    with start(tmp_path_factory.mktemp("prefect-server")) as server:
        yield server


@pytest.fixture(scope="session")
def deployment_root(compiled, tmp_path_factory):
    """Artifacts of tiny_cnn (compiled, verified, profiled) and deployment ``solo``'s plan; (root, params)."""
    import shutil

    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.profile import cpu, fleet, run

    root = tmp_path_factory.mktemp("bundle-artifacts")
    src, _, _ = compiled("tiny_cnn")
    shutil.copytree(src, root / "tiny_cnn" / "1")
    p = params_mod.load(None)
    run.profile(root / "tiny_cnn" / "1", fleet.load(p).device_class("coral-usb-emulated"),
                cpu.Settings(repeats=10, span_s=0.3, budget_s=1))
    p["deployments"] = [{"name": "solo", "device_class": "coral-usb-emulated",
                         "models": [{"name": "tiny_cnn", "version": "1", "rate": 40.0}]}]
    p["fleet"]["devices"] = [{"id": "edge-7", "device_class": "coral-usb-emulated", "deployment": "solo",
                              "work_pool": "coral-usb-emulated"}]
    plan_swapless(root, "solo", p)
    return root, p


@pytest.fixture
def modern_keras(tmp_path):
    """A Keras 3 model with the blocks of ConvNeXt / MobileNetV3 / EfficientNet: a grouped convolution (Keras 3
    compiles it with XLA: a function call in the converted graph), LayerNormalization, exact GELU (Erfc),
    hard-swish, SiLU and a squeeze-excite gate."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 8))
    h = keras.layers.Conv2D(8, 3, padding="same", groups=8)(inp)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    h = keras.layers.Activation("gelu")(h)
    h = keras.layers.Conv2D(16, 1, activation="hard_swish")(h)
    s = keras.layers.GlobalAveragePooling2D(keepdims=True)(h)
    s = keras.layers.Conv2D(16, 1, activation="sigmoid")(keras.layers.Conv2D(4, 1, activation="silu")(s))
    h = keras.layers.Multiply()([h, s])
    h = keras.layers.GlobalAveragePooling2D()(h)
    km = keras.Model(inp, keras.layers.Dense(5)(h))
    km.save(tmp_path / "modern.keras")
    return tmp_path / "modern.keras", km
