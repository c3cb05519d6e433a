"""Rebuild ``data/coral_usb_workloads.json``: the Edge TPU workload of each architecture in the calibration
table (``data/coral_usb_benchmarks.csv``), from edgeplan's own int8 conversion of the same architecture.

    python -m edgeplan.profile.calibration WORKDIR     # about 8 minutes here (seven int8 conversions; VGG19
                                                       # peaks at 8.3 GB)
    python -m edgeplan.profile.calibration --fit-only  # refit data/coral_usb_fit.json from the shipped rows

Each architecture is built by the zoo (seeded weights: latency does not depend on weight values), ingested
and converted to int8 like any model; its workload counts every op as mapped (the published figures are
of models compiled wholly for the Edge TPU) with the 8 MiB cache filled in op order.
"""
from __future__ import annotations

import argparse
import hashlib
from dataclasses import asdict
from pathlib import Path

from edgeplan import __version__
from edgeplan.artifacts import write_json_atomic
from edgeplan.profile.tpu_model import FIT_JSON, WORKLOADS_JSON, fit_document

# calibration-table architecture@input -> zoo model of the same architecture and input size
ARCHITECTURES = {
    "mobilenet_v1_1.0@224": "mobilenetv1_224",
    "mobilenet_v2_1.0@224": "mobilenetv2_224",
    "inception_v1@224": "light_inception_v1",
    "squeezenet@224": "light_squeezenet",
    "resnet50_v1@299": "resnet50_299",
    "resnet50_v2@299": "resnet50v2_299",
    "vgg19@224": "vgg19_224",
}


def build(workdir: Path, out: Path = WORKLOADS_JSON, progress=print) -> dict:
    from edgeplan.graph.model import load as load_model
    from edgeplan.pipeline import params as params_mod
    from edgeplan.pipeline import stages
    from edgeplan.profile.features import tpu_workload
    from edgeplan.quantize import convert
    from edgeplan.quantize.calibration import CalibrationSpec, calibration_data
    from edgeplan.quantize.tflite_graph import TfliteGraph
    from edgeplan.scratch import scratch

    params = params_mod.DEFAULTS
    spec = CalibrationSpec.from_params(params["quantize"]["calibration"])
    result = {"generated_by": f"edgeplan {__version__}: python -m edgeplan.profile.calibration", "workloads": {}}
    for key, zoo_name in ARCHITECTURES.items():
        progress(f"{key}: zoo:{zoo_name}")
        root = stages.ingest(f"zoo:{zoo_name}", zoo_name, "1", workdir / "artifacts")
        int8 = root / "model_int8.tflite"
        if not int8.is_file():
            model = load_model(root / "model.onnx")
            shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
            with scratch("calib") as tmp:
                data = convert.to_int8_tflite(root / "model.onnx", calibration_data(spec, shape), tmp,
                                              params["quantize"]["timeout_s"])
            int8.write_bytes(data)
        data = int8.read_bytes()
        work = tpu_workload(TfliteGraph(data), None)
        result["workloads"][key] = {"zoo": zoo_name, "int8_sha256": hashlib.sha256(data).hexdigest(),
                                    "workload": asdict(work)}
        progress(f"  {asdict(work)}")
    write_json_atomic(out, result)
    return result


def write_fit(out: Path = FIT_JSON) -> dict:
    """Fit the emulated Edge TPU on the shipped rows and write ``data/coral_usb_fit.json``."""
    doc = {"generated_by": f"edgeplan {__version__}: python -m edgeplan.profile.calibration --fit-only",
           **fit_document()}
    write_json_atomic(out, doc)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", type=Path, nargs="?", help="where the zoo models and their int8 conversions are kept")
    ap.add_argument("--out", type=Path, default=WORKLOADS_JSON)
    ap.add_argument("--fit-only", action="store_true", help="only refit the shipped rows (data/coral_usb_fit.json)")
    args = ap.parse_args()
    if not args.fit_only:
        if args.workdir is None:
            ap.error("WORKDIR is needed to rebuild the workloads (or --fit-only)")
        build(args.workdir, args.out)
        print(f"wrote {args.out}")
    write_fit()
    print(f"wrote {FIT_JSON}")


if __name__ == "__main__":
    main()
