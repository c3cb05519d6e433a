"""The multi-device (AutoDiCE) front end on an artifact directory: its units and a verified split."""
from __future__ import annotations

from pathlib import Path

from edgeplan.errors import ArtifactError, SpecError
from edgeplan.plan.multidevice import spec, units


def load(root: Path, params: dict):
    """The float model, its weights left in ``model.onnx`` (``graph.model.load_mapped``: give
    ``folder=graph.model.weights_folder(root / "model.onnx")`` to what runs it), and the int8 graph, each read once, and two inputs like the calibration set's (seed offset 1,
    as the build's matching) to match the units on; matching's runs on them are also a split's float reference
    (``surgery.multidevice.split``)."""
    from edgeplan.graph.model import GraphView, load_mapped
    from edgeplan.quantize.calibration import CalibrationSpec, sample_inputs
    from edgeplan.quantize.tflite_graph import TfliteGraph

    for f in ("model.onnx", "model_int8.tflite"):
        if not (root / f).is_file():
            raise ArtifactError(f"{root / f}: missing; run `edgeplan compile` (or `edgeplan build {root}`) first")
    model = load_mapped(root / "model.onnx")
    view = GraphView(model)
    cal = CalibrationSpec.from_params(params["quantize"]["calibration"])
    xs = sample_inputs(cal, view.shape(view.input.name), 2, seed=cal.seed + 1)
    return model, TfliteGraph((root / "model_int8.tflite").read_bytes()), cal, xs


def find_units(root: Path, params: dict) -> units.Units:
    from edgeplan.graph.model import weights_folder

    model, graph, _, xs = load(root, params)
    return units.find(model, graph, xs, min_cosine=params["quantize"]["match_min_cosine"],
                      folder=weights_folder(root / "model.onnx"))


def platform_for(params: dict, platform_path: str | None, deployment: str | None) -> spec.Platform:
    """The platform spec from a file, else the registry's devices of ``deployment`` (in registry order)."""
    if platform_path:
        return spec.load_platform(Path(platform_path))
    if not deployment:
        raise SpecError("give --platform FILE or --deployment NAME (its devices in the fleet registry)")
    from edgeplan.profile import fleet as fleet_mod

    fleet = fleet_mod.load(params)
    ids = [d.id for d in fleet.devices if d.deployment == deployment]
    if not ids:
        raise SpecError(f"no device of the fleet registry serves deployment {deployment!r} (fleet.devices[].deployment)")
    return spec.from_fleet(fleet, ids)


def split(root: Path, params: dict, mapping_path: Path, platform: spec.Platform, out: Path) -> dict:
    from edgeplan.graph.model import weights_folder
    from edgeplan.surgery import multidevice

    model, graph, cal, xs = load(root, params)
    us = units.find(model, graph, xs, min_cosine=params["quantize"]["match_min_cosine"],
                    folder=weights_folder(root / "model.onnx"))
    mapping = spec.load_mapping(mapping_path, platform, us)
    return multidevice.split(root, us, mapping, platform, out, seed=cal.seed, loaded=(model, graph))
