"""The fleet registry: the default validates; every mistake names its place."""
from __future__ import annotations

import copy
import os

import pytest
import yaml

from edgeplan.errors import RegistryError
from edgeplan.pipeline import params as params_mod
from edgeplan.profile import fleet


def test_default_registry():
    f = fleet.load(params_mod.DEFAULTS, {"mobilenetv2-solo"})
    c = f.device_class("coral-usb-emulated")
    assert c.cpu == "measured" and c.cores == len(os.sched_getaffinity(0))
    assert c.threads == tuple(range(1, c.cores + 1))
    assert c.accelerator.emulated and c.accelerator.onchip_param_bytes == 8 * 1024 * 1024
    assert f.device("edge-0001").work_pool == "coral-usb-emulated"


def _with(mutate):
    p = copy.deepcopy(params_mod.DEFAULTS)
    mutate(p["fleet"])
    return p


@pytest.mark.parametrize("mutate, message", [
    (lambda f: f["devices"][0].update(device_class="jetson"), r"fleet.devices\[0\].device_class: 'jetson' is not defined"),
    (lambda f: f["device_classes"]["coral-usb-emulated"].pop("ram_bytes"), r"coral-usb-emulated.ram_bytes: missing"),
    (lambda f: f["device_classes"]["coral-usb-emulated"]["accelerator"].update(kind="npu"), r"accelerator.kind: 'npu' is not one of"),
    (lambda f: f["device_classes"]["coral-usb-emulated"].update(cores="two"), r"cores: expected a number"),
    (lambda f: f["device_classes"]["coral-usb-emulated"].update(colour="red"), r"unknown key\(s\) colour"),
    (lambda f: f["devices"].append(dict(f["devices"][0])), r"devices\[1\].id: 'edge-0001' appears twice"),
    (lambda f: f["devices"][0].pop("work_pool"), r"devices\[0\].work_pool: missing"),
    (lambda f: f["device_classes"]["coral-usb-emulated"].update(cpu_probe_ms={1: -2}), r"cpu_probe_ms: times must be positive"),
    (lambda f: f["device_classes"]["coral-usb-emulated"].update(cpu_probe_ms={"one": 2}), r"cpu_probe_ms: expected thread count"),
])
def test_mistakes_are_named(mutate, message):
    with pytest.raises(RegistryError, match=message):
        fleet.load(_with(mutate), {"mobilenetv2-solo"})


def test_unknown_deployment():
    with pytest.raises(RegistryError, match=r"deployment: 'mobilenetv2-solo' is not a deployment"):
        fleet.load(params_mod.DEFAULTS, {"other"})


def test_missing_class_lookup():
    f = fleet.load(params_mod.DEFAULTS)
    with pytest.raises(RegistryError, match=r"device class 'rpi5' is not in the fleet registry; known: coral-usb-emulated"):
        f.device_class("rpi5")


def test_registry_in_its_own_file(tmp_path):
    path = tmp_path / "fleet.yaml"
    spec = copy.deepcopy(params_mod.DEFAULTS["fleet"])
    spec["device_classes"]["rpi4b-coral-usb-emulated"] = {
        "cpu": "predicted", "cores": 4, "ram_bytes": 4 * 1024**3,
        "accelerator": {"kind": "edgetpu-usb-emulated", "onchip_param_bytes": 8388608,
                        "link_bytes_per_s": 5e8, "calibration_host": "rpi4b"}}
    path.write_text(yaml.safe_dump(spec))
    f = fleet.load({"fleet": str(path)})
    assert f.device_class("rpi4b-coral-usb-emulated").threads == (1, 2, 3, 4)
    with pytest.raises(RegistryError, match=r"registry file .*nope.yaml not found"):
        fleet.load({"fleet": str(tmp_path / "nope.yaml")})


def test_predicted_class_needs_cores():
    def mutate(f):
        f["device_classes"]["coral-usb-emulated"].update(cpu="predicted", cores=None)
    with pytest.raises(RegistryError, match=r"cores: missing"):
        fleet.load(_with(mutate))
