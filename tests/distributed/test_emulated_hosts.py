"""Emulated hosts (network + UTS namespaces, cpu cgroups, tbf-shaped veths to a bridge) built for real, a split
run over them with mpirun, failures named and everything removed afterwards."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgeplan.cli import main as edgeplan_main
from edgeplan.distributed import emulate, launch
from edgeplan.pipeline import multidevice as pipeline
from edgeplan.plan.multidevice import spec
from edgeplan.quantize import litert
from edgeplan.runtime.stream import invoke_named
from edgeplan.surgery import multidevice

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc") or not shutil.which("nsenter"),
                                reason="emulated hosts need root, iproute2's tc and nsenter")

NAME = "pytest-md"
PLATFORM = ("dev0, cpu, slots=0, net=1.25e6, quota=1.0\n"   # 10 Mbit/s links
            "dev1, cpu, slots=0, net=1.25e6, quota=1.0\n"
            "dev2, cpu, slots=0, net=1.25e6, quota=0.5\n")


def _ours() -> dict:
    t = emulate._tag(NAME)
    ns = [x for x in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
          if x.startswith(f"ep-{t}")]
    links = [x for x in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.split()
             if x.startswith(f"ep{t}")]
    procs = subprocess.run(["pgrep", "-af", "edgeplan.distributed.rank|prted"], capture_output=True, text=True).stdout
    return {"netns": ns, "links": links, "cgroup": (emulate.CPU_CGROUP / f"edgeplan-{t}").exists(),
            "procs": [x for x in procs.splitlines() if "pgrep" not in x]}


@pytest.fixture(scope="module")
def hosts(compiled, params, tmp_path_factory):
    emulate.down(NAME)
    plat = emulate.up(NAME, spec.parse_text(PLATFORM, "platform"))
    try:
        d, _, _ = compiled("tiny_cnn")
        us = pipeline.find_units(d, params)
        layers = [n for u in us.units for n in u.names]
        doc = {"dev0_cpu": layers[:4], "dev1_cpu": layers[4:10], "dev2_cpu": layers[10:]}
        out = tmp_path_factory.mktemp("emulated") / "md"
        multidevice.split(d, us, spec.parse_mapping(doc, plat, us), plat, out,
                          xs=np.zeros((1, 3, 32, 32), np.float32))
        yield d, out, plat
    finally:
        emulate.down(NAME)
        assert _ours() == {"netns": [], "links": [], "cgroup": False, "procs": []}


def test_hosts_have_their_names_shares_and_links(hosts):
    _, _, plat = hosts
    st = emulate.load(NAME)
    assert [h["address"] for h in st["hosts"]] == [d.host for d in plat.devices] == ["10.213.0.2", "10.213.0.3",
                                                                                     "10.213.0.4"]
    h = st["hosts"][2]
    name = subprocess.run(emulate.enter(h, ["hostname"]), capture_output=True, text=True).stdout.strip()
    assert name == "dev2"
    assert (Path(h["cgroup"]) / "cpu.cfs_quota_us").read_text().strip() == "5000"
    for a, b in (("dev0", "dev1"), ("dev2", "dev0")):
        rate = emulate.measure_link(st, a, b, 4_000_000)
        assert 0.9 * 1.25e6 <= rate <= 1.1 * 1.25e6, (a, b, rate)


def test_a_split_runs_over_the_hosts(hosts, tmp_path):
    d, out, _ = hosts
    t = json.loads((out / "tables.json").read_text())
    xs = np.random.default_rng(2).integers(-128, 127, (12, *t["input"]["shape"]), endpoint=True).astype(np.int8)
    np.save(tmp_path / "x.npy", xs)
    st = emulate.load(NAME)
    before = emulate.link_bytes(st)
    r = launch.run(out, frames=12, timeout_s=120, mpi_args=emulate.mpi_args(NAME),
                   extra=["--inputs", str(tmp_path / "x.npy"), "--out", str(tmp_path / "y.npy")])
    after = emulate.link_bytes(st)
    assert [k["host"] for k in r.summary["ranks"]] == ["dev0", "dev1", "dev2"]  # each rank in its own host
    i = r.command.index("--bind-to")  # unbound: each host's "core 0" is this machine's core 0
    assert r.command[i + 1] == "none" and r.command.count("--bind-to") == 1
    whole = litert.interpreter((d / "model_int8.tflite").read_bytes(), deterministic=False)
    want = np.stack([invoke_named(whole, {t["input"]["name"]: x})[t["output"]["name"]] for x in xs])
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    sent = {r: 0 for r in range(3)}
    for b in t["buffers"].values():
        sent[b["sender"]] += b["nbytes"] * len(b["receivers"]) * 12
    for r, dev in enumerate(("dev0", "dev1", "dev2")):
        assert after[dev]["tx"] - before[dev]["tx"] >= sent[r]  # the frames crossed the shaped links
    assert not _ours()["procs"]


def test_a_killed_rank_and_a_cut_link_are_named(hosts):
    _, out, _ = hosts
    with pytest.raises(launch.DistributedError, match=r"^rank 1 on 10\.213\.0\.3 failed"):
        launch.run(out, frames=40, timeout_s=60, deadline_s=5, mpi_args=emulate.mpi_args(NAME),
                   extra=["--fault", "1:3:kill"])
    assert not _ours()["procs"]
    st = emulate.load(NAME)
    bridge = st["bridge"]
    cut_at = []

    def cut():
        time.sleep(2.0)
        cut_at.append(time.perf_counter())
        subprocess.run(["ip", "-n", bridge, "link", "set", "b2", "down"], check=True)

    th = threading.Thread(target=cut)
    th.start()
    try:
        with pytest.raises(launch.DistributedError, match=r"lost host dev2 \(rank 2\)|rank 2 on 10\.213\.0\.4 (failed|stopped answering)"):
            launch.run(out, frames=100_000, timeout_s=60, deadline_s=3, mpi_args=emulate.mpi_args(NAME))
        detected = time.perf_counter() - cut_at[0]
    finally:
        th.join()
        subprocess.run(["ip", "-n", bridge, "link", "set", "b2", "up"], check=True)
    assert detected < 10
    assert not _ours()["procs"]


def test_cli_up_status_down(tmp_path, capsys, params):
    (tmp_path / "p.txt").write_text("solo, cpu, slots=0, net=1.25e7\n")
    assert edgeplan_main(["devices", "up", "--deployment", "pytest-cli", "--platform", str(tmp_path / "p.txt"),
                          "--subnet", "10.214.0.0/24"]) == 0
    try:
        assert "1 hosts up" in capsys.readouterr().out
        assert edgeplan_main(["devices", "up", "--deployment", "pytest-cli", "--platform",
                              str(tmp_path / "p.txt")]) == 2
        assert "are up already" in capsys.readouterr().err
        assert edgeplan_main(["devices", "status", "--deployment", "pytest-cli"]) == 0
        assert "10.214.0.2" in capsys.readouterr().out
    finally:
        assert edgeplan_main(["devices", "down", "--deployment", "pytest-cli"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not (emulate.STATE / "pytest-cli").exists()
