"""The fleet registry: device classes and devices (params.yaml ``fleet``, or the YAML file it names).

    fleet:
      device_classes:
        coral-usb-emulated:
          cpu: measured            # measured on the profiling machine, or predicted (another host)
          cores: null              # null: the profiling machine's cores
          ram_bytes: 8589934592
          accelerator: {kind: edgetpu-usb-emulated, onchip_param_bytes: 8388608,
                        link_bytes_per_s: 500000000, calibration_host: desktop}
          # multi-device (AutoDiCE), all optional: arch (default cpu), net_bytes_per_s, power_w {idle, active}
          # (modelled energy), cpu_quota (an emulated host's cgroup share of a core)
      devices:
        - {id: edge-0001, device_class: coral-usb-emulated, deployment: mobilenetv2-solo,
           work_pool: coral-usb-emulated, work_queue: default}   # host: where MPI reaches it (default: its id)

Every mistake is reported with its place in the file (``fleet.devices[2].device_class: ...``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgeplan.errors import RegistryError

ACCELERATOR_KINDS = ("edgetpu-usb", "edgetpu-usb-emulated", "none")
CPU_SOURCES = ("measured", "predicted")


@dataclass(frozen=True)
class Accelerator:
    kind: str
    onchip_param_bytes: int = 0
    link_bytes_per_s: float = 0.0
    calibration_host: str | None = None  # rows of the calibration table this emulated device is fitted on

    @property
    def emulated(self) -> bool:
        return self.kind.endswith("-emulated")

    @property
    def edgetpu(self) -> bool:
        return self.kind.startswith("edgetpu")


@dataclass(frozen=True)
class DeviceClass:
    name: str
    cpu: str
    cores: int
    ram_bytes: int
    accelerator: Accelerator
    # The speed probe's time (ms) per thread count on this class at its reference speed: measured CPU
    # times are scaled by reference / the run's probe. None: raw times.
    cpu_probe_ms: dict[int, float] | None = None
    # Multi-device (AutoDiCE): the CPU's architecture, the network link, power (modelled energy) and, for an
    # emulated host, its cgroup's share of a core.
    arch: str = "cpu"
    net_bytes_per_s: float | None = None
    power_w: dict[str, float] | None = None
    cpu_quota: float | None = None

    @property
    def threads(self) -> tuple[int, ...]:
        """Thread counts a suffix is profiled with: 1 (SwapLess s^CPU) through K."""
        return tuple(range(1, self.cores + 1))


@dataclass(frozen=True)
class Device:
    id: str
    device_class: str
    deployment: str | None
    work_pool: str
    work_queue: str = "default"
    host: str | None = None  # hostname or address MPI reaches it at (multi-device); None: its id


@dataclass(frozen=True)
class Fleet:
    device_classes: dict[str, DeviceClass]
    devices: tuple[Device, ...]

    def device_class(self, name: str) -> DeviceClass:
        if name not in self.device_classes:
            raise RegistryError(f"device class {name!r} is not in the fleet registry; known: "
                                f"{', '.join(sorted(self.device_classes)) or '(none)'} (params.yaml fleet.device_classes)")
        return self.device_classes[name]

    def device(self, device_id: str) -> Device:
        for d in self.devices:
            if d.id == device_id:
                return d
        raise RegistryError(f"device {device_id!r} is not in the fleet registry (params.yaml fleet.devices)")


def _get(d: dict, key: str, where: str, kind: type | tuple, required: bool = True, default=None):
    if key not in d or d[key] is None:
        if required:
            raise RegistryError(f"{where}.{key}: missing")
        return default
    v = d[key]
    if kind in (int, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RegistryError(f"{where}.{key}: expected a number, got {v!r}")
        if v < 0:
            raise RegistryError(f"{where}.{key}: must not be negative, got {v!r}")
        return int(v) if kind is int else float(v)
    if not isinstance(v, kind):
        raise RegistryError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {v!r}")
    return v


def _unknown(d: dict, known: set[str], where: str) -> None:
    extra = set(d) - known
    if extra:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(sorted(extra))} (known: {', '.join(sorted(known))})")


def _accelerator(d, where: str) -> Accelerator:
    if not isinstance(d, dict):
        raise RegistryError(f"{where}: expected a mapping")
    _unknown(d, {"kind", "onchip_param_bytes", "link_bytes_per_s", "calibration_host"}, where)
    kind = _get(d, "kind", where, str)
    if kind not in ACCELERATOR_KINDS:
        raise RegistryError(f"{where}.kind: {kind!r} is not one of {', '.join(ACCELERATOR_KINDS)}")
    if kind == "none":
        return Accelerator(kind)
    acc = Accelerator(
        kind,
        onchip_param_bytes=_get(d, "onchip_param_bytes", where, int),
        link_bytes_per_s=_get(d, "link_bytes_per_s", where, float),
        calibration_host=_get(d, "calibration_host", where, str, required=kind.endswith("-emulated")),
    )
    if acc.link_bytes_per_s <= 0:
        raise RegistryError(f"{where}.link_bytes_per_s: must be positive")
    return acc


def _device_class(name: str, d, where: str) -> DeviceClass:
    if not isinstance(d, dict):
        raise RegistryError(f"{where}: expected a mapping")
    _unknown(d, {"cpu", "cores", "ram_bytes", "accelerator", "cpu_probe_ms", "arch", "net_bytes_per_s", "power_w",
                 "cpu_quota"}, where)
    cpu = _get(d, "cpu", where, str)
    if cpu not in CPU_SOURCES:
        raise RegistryError(f"{where}.cpu: {cpu!r} is not one of {', '.join(CPU_SOURCES)}")
    cores = _get(d, "cores", where, int, required=cpu == "predicted")
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 1:
        raise RegistryError(f"{where}.cores: must be at least 1")
    probe = _get(d, "cpu_probe_ms", where, dict, required=False)
    if probe is not None:
        try:
            probe = {int(k): float(v) for k, v in probe.items()}
        except (TypeError, ValueError):
            raise RegistryError(f"{where}.cpu_probe_ms: expected thread count -> milliseconds, got {probe!r}") from None
        if any(v <= 0 for v in probe.values()):
            raise RegistryError(f"{where}.cpu_probe_ms: times must be positive")
    power = _get(d, "power_w", where, dict, required=False)
    if power is not None:
        _unknown(power, {"idle", "active"}, f"{where}.power_w")
        power = {k: _get(power, k, f"{where}.power_w", float) for k in ("idle", "active")}
    for k in ("net_bytes_per_s", "cpu_quota"):
        if d.get(k) is not None and _get(d, k, where, float) <= 0:
            raise RegistryError(f"{where}.{k}: must be positive")
    return DeviceClass(name, cpu, cores, _get(d, "ram_bytes", where, int),
                       _accelerator(d.get("accelerator", {"kind": "none"}), f"{where}.accelerator"), probe,
                       _get(d, "arch", where, str, False, "cpu"), _get(d, "net_bytes_per_s", where, float, False),
                       power, _get(d, "cpu_quota", where, float, False))


def load(params: dict, deployments: set[str] | None = None) -> Fleet:
    """The registry from ``params['fleet']`` (a mapping, or the path of a YAML file holding one)."""
    spec = params.get("fleet")
    where = "fleet"
    if isinstance(spec, (str, Path)):
        import yaml

        path = Path(spec)
        if not path.is_file():
            raise RegistryError(f"fleet: registry file {path} not found")
        spec, where = yaml.safe_load(path.read_text()) or {}, str(path)
    if not isinstance(spec, dict):
        raise RegistryError(f"{where}: expected a mapping with device_classes and devices")
    _unknown(spec, {"device_classes", "devices"}, where)
    classes_spec = _get(spec, "device_classes", where, dict)
    classes = {name: _device_class(name, d, f"{where}.device_classes.{name}") for name, d in classes_spec.items()}
    devices = []
    seen: set[str] = set()
    for i, d in enumerate(spec.get("devices") or []):
        w = f"{where}.devices[{i}]"
        if not isinstance(d, dict):
            raise RegistryError(f"{w}: expected a mapping")
        _unknown(d, {"id", "device_class", "deployment", "work_pool", "work_queue", "host"}, w)
        dev = Device(_get(d, "id", w, str), _get(d, "device_class", w, str), _get(d, "deployment", w, str, False),
                     _get(d, "work_pool", w, str), _get(d, "work_queue", w, str, False, "default"),
                     _get(d, "host", w, str, False))
        if dev.id in seen:
            raise RegistryError(f"{w}.id: {dev.id!r} appears twice")
        seen.add(dev.id)
        if dev.device_class not in classes:
            raise RegistryError(f"{w}.device_class: {dev.device_class!r} is not defined under "
                                f"{where}.device_classes (known: {', '.join(sorted(classes))})")
        if deployments is not None and dev.deployment is not None and dev.deployment not in deployments:
            raise RegistryError(f"{w}.deployment: {dev.deployment!r} is not a deployment in params.yaml "
                                f"(known: {', '.join(sorted(deployments)) or '(none)'})")
        devices.append(dev)
    return Fleet(classes, tuple(devices))
