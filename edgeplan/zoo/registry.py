"""The table of zoo models: name -> (builder, description)."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable

from edgeplan.errors import ModelNotFoundError
from edgeplan.zoo import alexnet, chain, digits, encoder, keras_apps, light, tiny, wide

_TABLE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "mobilenetv2_0.35_96": (partial(keras_apps.build, "MobileNetV2", 96, alpha=0.35), "Keras MobileNetV2 alpha 0.35, 96x96"),
    "mobilenetv1_224": (partial(keras_apps.build, "MobileNet", 224), "Keras MobileNet (v1) alpha 1.0, 224x224"),
    "mobilenetv2_224": (partial(keras_apps.build, "MobileNetV2", 224), "Keras MobileNetV2, 224x224"),
    "resnet50_299": (partial(keras_apps.build, "ResNet50", 299), "Keras ResNet50 (v1), 299x299"),
    "resnet50v2_224": (partial(keras_apps.build, "ResNet50V2", 224), "Keras ResNet50V2, 224x224"),
    "resnet50v2_299": (partial(keras_apps.build, "ResNet50V2", 299), "Keras ResNet50V2, 299x299"),
    "resnet101_224": (partial(keras_apps.build, "ResNet101", 224), "Keras ResNet101 (v1), 224x224"),
    "resnet152v2_299": (partial(keras_apps.build, "ResNet152V2", 299), "Keras ResNet152V2, 299x299 (60M parameters)"),
    "inceptionresnetv2_299": (partial(keras_apps.build, "InceptionResNetV2", 299),
                              "Keras InceptionResNetV2, 299x299 (56M parameters)"),
    "inceptionv3_299": (partial(keras_apps.build, "InceptionV3", 299), "Keras InceptionV3, 299x299"),
    "densenet121_224": (partial(keras_apps.build, "DenseNet121", 224), "Keras DenseNet121, 224x224"),
    "densenet201_224": (partial(keras_apps.build, "DenseNet201", 224), "Keras DenseNet201, 224x224"),
    "xception_299": (partial(keras_apps.build, "Xception", 299), "Keras Xception, 299x299"),
    "efficientnetb0_224": (partial(keras_apps.build, "EfficientNetB0", 224), "Keras EfficientNetB0, 224x224"),
    "vgg16_224": (partial(keras_apps.build, "VGG16", 224), "Keras VGG16, 224x224 (138M parameters)"),
    "vgg19_224": (partial(keras_apps.build, "VGG19", 224), "Keras VGG19, 224x224 (144M parameters)"),
    "light_squeezenet": (partial(light.build, "squeezenet"), "onnx model zoo SqueezeNet 1.0, re-weighted"),
    "light_resnet50": (partial(light.build, "resnet50"), "onnx model zoo ResNet50 v1, re-weighted"),
    "light_densenet121": (partial(light.build, "densenet121"), "onnx model zoo DenseNet121, re-weighted"),
    "light_inception_v1": (partial(light.build, "inception_v1"), "onnx model zoo GoogLeNet (LRN), re-weighted"),
    "alexnet_224": (alexnet.build, "AlexNet (torchvision layout), 224x224, built node by node"),
    "spatial_chain": (chain.build, "chain CNN, 3x45x45: stride-2 SAME and padded convs, dilation 2, max/avg pools"),
    "vit_encoder": (encoder.build, ("vision-transformer encoder, 3x224x224, 196 tokens of 192, 4 heads as branches "
                                    "(per-head projections), 4 blocks, built node by node")),
    "tiny_cnn": (partial(tiny.build, lrn=False), "8-layer residual CNN, 3x32x32, built node by node"),
    "wide_fc": (wide.build, "CNN with a VGG-like wide fully-connected head, 3x32x32, 1.3M parameters"),
    "wide_fc_2g": (partial(wide.build, width=16384, depth=3),
                   "wide_fc with three 16384-wide layers: 571M parameters, 2.28 GB (ONNX with external data)"),
    "tiny_cnn_lrn": (partial(tiny.build, lrn=True), "tiny_cnn with an LRN (no int8 kernel, no Edge TPU op)"),
    "digits_cnn": (digits.build, ("CNN trained here on scikit-learn's handwritten digits, 1x32x32; held-out "
                                  "quarter as its labelled evaluation set")),
}
# zoo models that ship a labelled evaluation set: name -> its path beside the built model
_EVAL_SETS = {"digits_cnn": digits.eval_path}

NAMES = tuple(_TABLE)


def describe(name: str) -> str:
    return _TABLE[name][1]


def build(name: str, workdir: Path) -> Path:
    """Build zoo model ``name`` into ``workdir`` (once; a second call reuses the file)."""
    if name not in _TABLE:
        raise ModelNotFoundError(f"zoo:{name}: no such zoo model; known: {', '.join(NAMES)}")
    workdir.mkdir(parents=True, exist_ok=True)
    return _TABLE[name][0](workdir / name)


def eval_set(name: str, workdir: Path) -> Path:
    """The labelled evaluation set (``.npz``: ``x`` NCHW float32, ``y`` labels) of zoo model ``name``, built
    with it (once)."""
    if name not in _EVAL_SETS:
        have = ", ".join(f"zoo:{n}" for n in _EVAL_SETS)
        raise ModelNotFoundError(f"zoo:{name}: no zoo model with a labelled evaluation set; known: {have}")
    build(name, workdir)
    return _EVAL_SETS[name](workdir / name)
