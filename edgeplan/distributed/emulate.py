"""Emulated hosts for a multi-device split, on one Linux machine (root; iproute2, tc, nsenter, unshare).

Each device of the platform becomes a host: its own network namespace (``eth0``, an address on a private
subnet) and UTS namespace (its own hostname: Open MPI 5 hangs across namespaces that share one), a cpu cgroup
holding it to ``cpu_quota`` x its cores, and a veth to a bridge namespace with ``tbf`` both ways at its
``net_bytes_per_s`` (no ``netem`` in this kernel: links have bandwidth, no added delay). The machine itself
reaches the bridge over one more, unshaped veth: mpirun runs here and starts each host's daemon through
``agent`` (Open MPI's ssh agent: join the host's cgroup, then ``nsenter`` its namespaces — ``ip netns exec``
would remount /sys and hide the cgroups).

    edgeplan devices up --deployment NAME [--platform P]    build the hosts, write STATE/NAME/platform.txt
    edgeplan devices down --deployment NAME                 remove everything ``up`` made (recorded in state.json)

Everything made is recorded before it is made, so ``down`` (and a failed ``up``) removes exactly that.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from edgeplan.errors import EdgeplanError
from edgeplan.plan.multidevice.spec import Platform

STATE = Path(os.environ.get("EDGEPLAN_DEVICES_STATE", "/run/edgeplan/devices"))
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000  # CFS period: a quota enforced over 10 ms behaves like a slower core; over the default 100 ms
# a device runs at full speed, then stops for most of the period, and a pipeline of such devices stalls


class EmulationError(EdgeplanError):
    pass


def cpu_cgroup(path: Path, cores: float | None) -> Path:
    """A cpu cgroup (v1) at ``path`` holding its processes to ``cores`` CPUs over a PERIOD_US period (None: no cap;
    the kernel's smallest quota is 1 ms)."""
    path.mkdir(exist_ok=True)
    (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (path / "cpu.cfs_quota_us").write_text("-1" if cores is None else str(max(int(cores * PERIOD_US), 1000)))
    return path


def remove_cgroup(path: str | os.PathLike) -> None:
    """Remove a cgroup once its processes are gone (killed or exited ones leave it a moment after they are
    reaped); one still in use after 2.5 s stays."""
    for _ in range(50):
        try:
            if os.path.isdir(path):
                os.rmdir(path)
            return
        except OSError:
            time.sleep(0.05)


def _sh(*cmd: str, check: bool = True) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise EmulationError(f"{' '.join(cmd)}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def _tag(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:4]


def state_dir(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise EmulationError(f"deployment name {name!r} cannot name a state directory")
    return STATE / name


def _record(d: Path, state: dict) -> None:
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(d / "state.json")


def _tbf(ns: str, dev: str, bytes_per_s: float) -> None:
    bits = int(bytes_per_s * 8)
    # 10 ms of traffic (the kernel's timer at 1 Gbit/s), and never below two 64 KiB GSO packets: a packet larger
    # than the bucket is dropped, and TCP's retransmission timeout then costs 10-20 % of a short transfer
    burst = max(131_072, int(bytes_per_s / 100))
    _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bits}bit",
        "burst", str(burst), "latency", "100ms")


def up(name: str, platform: Platform, subnet: str = "10.213.0.0/24") -> Platform:
    """Build a host per device; returns the platform with each host replaced by its emulated address (also
    written to STATE/NAME/platform.txt, for ``edgeplan split --platform``)."""
    if os.geteuid() != 0:
        raise EmulationError("emulated hosts need root (network namespaces, tc, cgroups)")
    if not CPU_CGROUP.is_dir():
        raise EmulationError(f"{CPU_CGROUP}: no cpu cgroup (v1) to hold the hosts' CPU shares")
    d = state_dir(name)
    if (d / "state.json").exists():
        raise EmulationError(f"hosts for {name!r} are up already ({d}); `edgeplan devices down --deployment {name}`")
    net = ipaddress.ip_network(subnet)
    if net.num_addresses < len(platform.devices) + 3:
        raise EmulationError(f"subnet {subnet} is too small for {len(platform.devices)} hosts")
    taken = _sh("ip", "-o", "addr")
    root_addr = str(net.network_address + 1)
    if f" {root_addr}/" in taken:
        raise EmulationError(f"{root_addr} is already an address here: pick another --subnet")
    d.mkdir(parents=True, exist_ok=True)
    t = _tag(name)
    state: dict = {"name": name, "tag": t, "subnet": subnet, "root_veth": None, "bridge": None, "hosts": [],
                   "cgroup": str(CPU_CGROUP / f"edgeplan-{t}")}
    _record(d, state)
    try:
        bridge = f"ep-{t}-br"
        state["bridge"] = bridge
        _record(d, state)
        _sh("ip", "netns", "add", bridge)
        _sh("ip", "-n", bridge, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", bridge, "link", "set", "br0", "up")
        rv = f"ep{t}r"
        state["root_veth"] = rv
        _record(d, state)
        _sh("ip", "link", "add", rv, "type", "veth", "peer", "name", "root", "netns", bridge)
        _sh("ip", "addr", "add", f"{root_addr}/{net.prefixlen}", "dev", rv)
        _sh("ip", "link", "set", rv, "up")
        _sh("ip", "-n", bridge, "link", "set", "root", "master", "br0")
        _sh("ip", "-n", bridge, "link", "set", "root", "up")
        Path(state["cgroup"]).mkdir(exist_ok=True)
        hosts = []
        for i, dev in enumerate(platform.devices):
            ns, uts = f"ep-{t}-{i}", str(d / f"uts-{i}")
            addr = str(net.network_address + 2 + i)
            cg = str(Path(state["cgroup"]) / dev.name)
            h = {"device": dev.name, "netns": ns, "uts": uts, "address": addr, "cgroup": cg, "bridge_port": f"b{i}",
                 "net_bytes_per_s": dev.net_bytes_per_s, "cores": len(dev.slots), "cpu_quota": dev.cpu_quota}
            state["hosts"].append(h)
            _record(d, state)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", f"ep{t}v{i}", "netns", ns, "type", "veth", "peer", "name", f"b{i}", "netns", bridge)
            _sh("ip", "-n", ns, "link", "set", f"ep{t}v{i}", "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", bridge, "link", "set", f"b{i}", "master", "br0")
            _sh("ip", "-n", bridge, "link", "set", f"b{i}", "up")
            if dev.net_bytes_per_s:
                _tbf(ns, "eth0", dev.net_bytes_per_s)
                _tbf(bridge, f"b{i}", dev.net_bytes_per_s)
            Path(uts).touch()
            _sh("unshare", f"--uts={uts}", "hostname", dev.name)
            cpu_cgroup(Path(cg), None if dev.cpu_quota is None else dev.cpu_quota * len(dev.slots))
            hosts.append(replace(dev, host=addr))
        agent = d / "agent"
        agent.write_text(f"#!/bin/sh\nexec {sys.executable} -m edgeplan.distributed.emulate agent {name} \"$@\"\n")
        agent.chmod(0o755)
        out = Platform(tuple(hosts))
        (d / "platform.txt").write_text(out.to_text())
        state["up"] = True
        _record(d, state)
        return out
    except BaseException:
        down(name)
        raise


def load(name: str) -> dict:
    f = state_dir(name) / "state.json"
    if not f.is_file():
        raise EmulationError(f"no emulated hosts for {name!r} (`edgeplan devices up --deployment {name}`)")
    return json.loads(f.read_text())


def down(name: str) -> list[str]:
    """Remove everything ``up`` recorded: processes in the hosts, namespaces, veths, UTS files, cgroups."""
    d = state_dir(name)
    f = d / "state.json"
    if not f.is_file():
        return []
    state = json.loads(f.read_text())
    removed = []
    for h in state["hosts"]:
        pids = _sh("ip", "netns", "pids", h["netns"], check=False).split()
        cg_procs = Path(h["cgroup"]) / "cgroup.procs"
        if cg_procs.is_file():
            pids += cg_procs.read_text().split()
        for pid in set(pids):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if subprocess.run(["ip", "netns", "del", h["netns"]], capture_output=True).returncode == 0:
            removed.append(h["netns"])
        if os.path.exists(h["uts"]):
            _sh("umount", h["uts"], check=False)
            os.unlink(h["uts"])
        remove_cgroup(h["cgroup"])
    if state.get("cgroup") and os.path.isdir(state["cgroup"]):
        try:
            os.rmdir(state["cgroup"])
        except OSError:
            pass
    if state.get("root_veth"):
        _sh("ip", "link", "del", state["root_veth"], check=False)
    if state.get("bridge"):
        if subprocess.run(["ip", "netns", "del", state["bridge"]], capture_output=True).returncode == 0:
            removed.append(state["bridge"])
    for extra in ("agent", "platform.txt", "state.json.tmp"):
        (d / extra).unlink(missing_ok=True)
    f.unlink()
    try:
        d.rmdir()
    except OSError:
        pass
    return removed


def mpi_args(name: str) -> list[str]:
    """mpirun options that start each host's daemon inside it and keep MPI traffic on the emulated subnet."""
    state = load(name)
    agent = state_dir(name) / "agent"
    # no binding: every emulated host's "core 0" is this machine's core 0 (8 ranks bound there shared one core);
    # the hosts' cgroups hold each to its share
    return ["--prtemca", "plm_ssh_agent", str(agent), "--prtemca", "oob_tcp_if_include", state["subnet"],
            "--mca", "btl_tcp_if_include", state["subnet"], "--bind-to", "none"]


def host_for(state: dict, address: str) -> dict:
    for h in state["hosts"]:
        if address in (h["address"], h["device"]):
            return h
    raise EmulationError(f"{address!r} is not an emulated host of {state['name']!r}")


def enter(h: dict, argv: list[str]) -> list[str]:
    """``argv`` run inside host ``h``'s namespaces (the caller joins its cgroup)."""
    return ["nsenter", f"--net=/run/netns/{h['netns']}", f"--uts={h['uts']}", "--", *argv]


def join_cgroup(h: dict, pid: int | None = None) -> None:
    (Path(h["cgroup"]) / "cgroup.procs").write_text(str(pid or os.getpid()))


def link_bytes(state: dict) -> dict[str, dict[str, int]]:
    """Bytes each host's veth has sent and received so far."""
    out = {}
    for h in state["hosts"]:
        info = json.loads(_sh("ip", "-j", "-s", "-n", h["netns"], "link", "show", "eth0"))[0]["stats64"]
        out[h["device"]] = {"tx": int(info["tx"]["bytes"]), "rx": int(info["rx"]["bytes"])}
    return out


_PROBE = r"""
import socket, sys, time
mode, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 5599)); s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept(); got = 0; t0 = None
    while got < n:
        b = c.recv(1 << 20)
        if not b: break
        if t0 is None: t0 = time.perf_counter()
        got += len(b)
    print(got / (time.perf_counter() - t0), flush=True)
else:
    c = socket.create_connection((addr, 5599)); buf = b"\0" * (1 << 16); sent = 0
    while sent < n:
        c.sendall(buf); sent += len(buf)
    c.close()
"""


def measure_link(state: dict, src: str, dst: str, nbytes: int) -> float:
    """Bytes per second from host ``src`` to host ``dst`` (a TCP stream of ``nbytes``, timed at the receiver)."""
    a, b = host_for(state, src), host_for(state, dst)
    recv = subprocess.Popen(enter(b, [sys.executable, "-c", _PROBE, "recv", b["address"], str(nbytes)]),
                            stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "ready":
            raise EmulationError(f"link probe on {dst} did not start")
        subprocess.run(enter(a, [sys.executable, "-c", _PROBE, "send", b["address"], str(nbytes)]), check=True,
                       timeout=600)
        return float(recv.stdout.readline())
    finally:
        recv.kill()
        recv.wait()


def _agent(argv: list[str]) -> int:
    """Open MPI's ssh agent: ``agent NAME HOST COMMAND...`` runs COMMAND in HOST's cgroup and namespaces."""
    name, host, cmd = argv[0], argv[1], " ".join(argv[2:])
    h = host_for(load(name), host)
    join_cgroup(h)
    os.execvp("nsenter", enter(h, ["/bin/sh", "-c", cmd]))
    return 1


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "agent":
        sys.exit(_agent(sys.argv[2:]))
    print("usage: python -m edgeplan.distributed.emulate agent NAME HOST COMMAND...", file=sys.stderr)
    sys.exit(2)
