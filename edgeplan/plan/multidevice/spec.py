"""AutoDiCE's two specifications (§III-B, Fig. 2): the platform (devices, their cores and how to reach them)
and the mapping (which layers run on which device's cores).

Platform, the paper's text format extended by ``key=value`` fields (one device per line, ``#`` comments)::

    edge01, x86, slots=0-1, host=10.77.0.2, net=12500000, power=2.0/6.0, quota=1.0

or JSON ``{"devices": [{"name", "arch", "slots", "host", "net_bytes_per_s", "power_w": {"idle", "active"},
"cpu_quota"}]}``, or the fleet registry's devices (``from_fleet``). Mapping: JSON ``{key: [layer, ...]}``; a key
is ``<device>_<arch><cores>`` (Fig. 2's ``edge01_arm123``: cores 1, 2 and 3 of edge01; one digit per core) or
``<device>_<arch>`` (all its cores). The keys' order is the ranks' order. Layers are ONNX node names, validated
against the units the int8 model fuses: every node mapped exactly once, a unit never split.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgeplan.errors import SpecError

if TYPE_CHECKING:  # the runtime reads platforms without the pipeline (onnx, onnxruntime) installed
    from edgeplan.plan.multidevice.units import Units

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")  # a device: no '_' (it ends the device in a key)
_ARCH = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


@dataclass(frozen=True)
class Device:
    name: str
    arch: str
    slots: tuple[int, ...]
    host: str
    net_bytes_per_s: float | None = None
    power_w: dict[str, float] | None = None  # {"idle", "active"}: modelled energy only
    cpu_quota: float | None = None  # emulated hosts: the cgroup's share of one core per slot


@dataclass(frozen=True)
class Platform:
    devices: tuple[Device, ...]

    def device(self, name: str, where: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise SpecError(f"{where}: device {name!r} is not in the platform (devices: "
                        f"{', '.join(d.name for d in self.devices) or '(none)'})")

    def to_text(self) -> str:
        lines = []
        for d in self.devices:
            f = [d.name, d.arch, f"slots={_ranges(d.slots)}", f"host={d.host}"]
            if d.net_bytes_per_s is not None:
                f.append(f"net={d.net_bytes_per_s:g}")
            if d.power_w is not None:
                f.append(f"power={d.power_w['idle']:g}/{d.power_w['active']:g}")
            if d.cpu_quota is not None:
                f.append(f"quota={d.cpu_quota:g}")
            lines.append(", ".join(f))
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict:
        return {"devices": [{**asdict(d), "slots": list(d.slots)} for d in self.devices]}


@dataclass(frozen=True)
class Key:
    name: str
    device: str
    arch: str
    slots: tuple[int, ...]


@dataclass(frozen=True)
class Mapping:
    keys: tuple[Key, ...]  # rank order
    units: tuple[tuple[int, ...], ...]  # per key, its unit indices ascending
    unit_key: tuple[int, ...]  # per unit, its key's index


# ---------------------------------------------------------------------------------------------- platform
def _ranges(slots: tuple[int, ...]) -> str:
    out, i = [], 0
    while i < len(slots):
        j = i
        while j + 1 < len(slots) and slots[j + 1] == slots[j] + 1:
            j += 1
        out.append(f"{slots[i]}-{slots[j]}" if j > i else str(slots[i]))
        i = j + 1
    return ",".join(out)


def _slots(text: str, where: str) -> tuple[int, ...]:
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise SpecError(f"{where}: slots {text!r} is not a list of cores like 0-5 or 0,2") from None
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise SpecError(f"{where}: slots {text!r} must name each core once")
    return tuple(sorted(out))


def _positive(v, what: str, where: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {what} {v!r} is not a number") from None
    if not x > 0:
        raise SpecError(f"{where}: {what} must be positive, got {v!r}")
    return x


def _device(d: dict, where: str) -> Device:
    name, arch = d.get("name"), d.get("arch", "cpu")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"{where}: device name {name!r} must be letters, digits, '.' or '-' (no '_')")
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise SpecError(f"{where}: arch {arch!r} must be a word (x86, arm, cpu)")
    slots = d.get("slots")
    slots = _slots(slots, where) if isinstance(slots, str) else slots
    if not isinstance(slots, (list, tuple)) or not slots or not all(isinstance(s, int) and s >= 0 for s in slots) \
            or len(set(slots)) != len(slots):
        raise SpecError(f"{where}: slots must name each core once, got {slots!r}")
    power = d.get("power_w")
    if power is not None:
        if not isinstance(power, dict) or set(power) != {"idle", "active"}:
            raise SpecError(f"{where}: power_w must be {{idle, active}} watts, got {power!r}")
        power = {k: _positive(v, f"power_w.{k}", where) for k, v in power.items()}
    host = d.get("host", name)
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        raise SpecError(f"{where}: host {host!r} must be a hostname or address")
    net = d.get("net_bytes_per_s")
    quota = d.get("cpu_quota")
    return Device(name, arch, tuple(sorted(slots)), host,
                  None if net is None else _positive(net, "net_bytes_per_s", where), power,
                  None if quota is None else _positive(quota, "cpu_quota", where))


def _check(devices: list[Device], where: str) -> Platform:
    if not devices:
        raise SpecError(f"{where}: no devices")
    seen: set[str] = set()
    for d in devices:
        if d.name in seen:
            raise SpecError(f"{where}: device {d.name!r} appears twice")
        seen.add(d.name)
    return Platform(tuple(devices))


def parse_text(text: str, where: str) -> Platform:
    devices = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        at = f"{where}:{n}"
        if len(fields) < 3:
            raise SpecError(f"{at}: expected 'name, arch, slots=..., key=value ...', got {line!r}")
        d: dict = {"name": fields[0], "arch": fields[1]}
        rest = fields[2:]
        # slots=0,2 splits at the comma: glue bare numbers back onto the field before them
        merged: list[str] = []
        for f in rest:
            if merged and "=" not in f:
                merged[-1] += "," + f
            else:
                merged.append(f)
        for f in merged:
            k, eq, v = f.partition("=")
            k = k.strip()
            if not eq:
                raise SpecError(f"{at}: field {f!r} is not key=value")
            if k == "slots":
                d["slots"] = v.strip()
            elif k == "host":
                d["host"] = v.strip()
            elif k == "net":
                d["net_bytes_per_s"] = v.strip()
            elif k == "power":
                idle, _, active = v.partition("/")
                d["power_w"] = {"idle": idle.strip(), "active": active.strip()}
            elif k == "quota":
                d["cpu_quota"] = v.strip()
            elif k != "gpu":  # the paper's GPU field: no GPU here, accepted and ignored
                raise SpecError(f"{at}: unknown field {k!r} (slots, host, net, power, quota)")
        if "slots" not in d:
            raise SpecError(f"{at}: slots=... missing")
        devices.append(_device(d, at))
    return _check(devices, where)


def parse_json(doc, where: str) -> Platform:
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise SpecError(f"{where}: expected {{\"devices\": [...]}}")
    return _check([_device(d if isinstance(d, dict) else {}, f"{where}: devices[{i}]")
                   for i, d in enumerate(doc["devices"])], where)


def load_platform(path: Path) -> Platform:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: platform spec not found")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return parse_json(json.loads(text), str(path))
        except json.JSONDecodeError as e:
            raise SpecError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    return parse_text(text, str(path))


def from_fleet(fleet, device_ids: list[str]) -> Platform:
    """The registry's devices (in the order given): cores from their class, host/net/power/quota as registered."""
    out = []
    for i in device_ids:
        dev = fleet.device(i)
        cls = fleet.device_class(dev.device_class)
        out.append(_device({"name": dev.id, "arch": cls.arch, "slots": list(range(cls.cores)),
                            "host": dev.host or dev.id, "net_bytes_per_s": cls.net_bytes_per_s,
                            "power_w": cls.power_w, "cpu_quota": cls.cpu_quota}, f"fleet device {dev.id}"))
    return _check(out, "fleet")


# ---------------------------------------------------------------------------------------------- mapping
def parse_key(key: str, platform: Platform) -> Key:
    device, sep, res = key.rpartition("_")
    if not sep:
        raise SpecError(f"mapping key {key!r}: expected <device>_<arch><cores>, like edge01_arm123 or edge01_x86")
    dev = platform.device(device, f"mapping key {key!r}")
    digits = res[len(dev.arch):]
    if not res.startswith(dev.arch) or not (digits.isdigit() or not digits):
        raise SpecError(f"mapping key {key!r}: device {device!r} is {dev.arch}: expected {device}_{dev.arch} "
                        f"or {device}_{dev.arch}<cores>")
    slots = tuple(int(c) for c in digits) if digits else dev.slots
    if len(set(slots)) != len(slots):
        raise SpecError(f"mapping key {key!r}: a core named twice")
    lacking = [s for s in slots if s not in dev.slots]
    if lacking:
        raise SpecError(f"mapping key {key!r}: device {device!r} has no core {lacking[0]} "
                        f"(cores {_ranges(dev.slots)})")
    return Key(key, device, dev.arch, tuple(sorted(slots)))


def parse_mapping(doc, platform: Platform, units: Units, where: str = "mapping") -> Mapping:
    """Validate a mapping against the platform and the model's units."""
    if not isinstance(doc, dict) or not doc:
        raise SpecError(f"{where}: expected a JSON object {{key: [layer, ...]}} with at least one key")
    keys, placed = [], {}
    for k, layers in doc.items():
        key = parse_key(k, platform)
        if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
            raise SpecError(f"{where}: key {k!r}: expected a list of layer names")
        if not layers:
            raise SpecError(f"{where}: key {k!r} maps no layer (a rank with nothing to run)")
        for layer in layers:
            if layer not in units.of_node:
                raise SpecError(f"{where}: key {k!r}: layer {layer!r} is not a node of the model")
            if layer in placed:
                raise SpecError(f"{where}: layer {layer!r} is mapped twice ({keys[placed[layer]].name!r} and {k!r}); "
                                "only vertical partitioning (one key per layer) is supported")
            placed[layer] = len(keys)
        keys.append(key)
    unmapped = [n for n in units.of_node if n not in placed]
    if unmapped:
        more = f" and {len(unmapped) - 3} more" if len(unmapped) > 3 else ""
        raise SpecError(f"{where}: layer(s) {', '.join(map(repr, unmapped[:3]))}{more} are mapped to no key")
    unit_key = []
    for u in units.units:
        first = u.names[0]
        for other in u.names[1:]:
            if placed[other] != placed[first]:
                raise SpecError(f"{where}: layers {first!r} ({keys[placed[first]].name}) and {other!r} "
                                f"({keys[placed[other]].name}) are one int8 op (unit {u.index}); map them together")
        unit_key.append(placed[first])
    per_key = tuple(tuple(u for u, k in enumerate(unit_key) if k == j) for j in range(len(keys)))
    return Mapping(tuple(keys), per_key, tuple(unit_key))


def load_mapping(path: Path, platform: Platform, units: Units) -> Mapping:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: mapping spec not found")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    return parse_mapping(doc, platform, units, str(path))


def mapping_doc(mapping: Mapping, units: Units) -> dict:
    """The mapping back as Fig. 2's JSON."""
    return {k.name: [n for u in mapping.units[j] for n in units.units[u].names] for j, k in enumerate(mapping.keys)}
