"""`edgeplan profile emulator` and `edgeplan fleet`: what they print, and a broken registry refused."""
from __future__ import annotations

import yaml

from edgeplan.cli import main


def test_emulator_table(capsys):
    assert main(["profile", "emulator"]) == 0
    out = capsys.readouterr().out
    for model in ("mobilenet_v1_1.0", "mobilenet_v2_1.0", "inception_v1", "squeezenet", "resnet50_v1", "resnet50_v2",
                  "vgg19"):
        assert model in out
    for host in ("desktop", "rpi4b", "devboard"):
        assert host in out
    assert "leave-one-architecture-out" in out and "efficiency" in out and "dominant term" in out


def test_fleet_lists_classes_and_devices(capsys):
    assert main(["fleet"]) == 0
    out = capsys.readouterr().out
    assert "coral-usb-emulated" in out and "edge-0001" in out and "edgetpu-usb-emulated" in out


def test_broken_registry_is_refused(tmp_path, capsys):
    params = {"fleet": {"device_classes": {"c": {"cpu": "measured", "ram_bytes": 1,
                                                 "accelerator": {"kind": "none"}}},
                        "devices": [{"id": "d", "device_class": "nope", "work_pool": "p"}]}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["--params", str(tmp_path / "params.yaml"), "fleet"]) == 2
    assert "fleet.devices[0].device_class: 'nope' is not defined" in capsys.readouterr().err
