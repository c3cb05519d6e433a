"""A fast subset of bench/reliability.py's kill-anywhere publish campaign: the publisher (a real forked process)
SIGKILLed before each of its store calls in turn (the store layer's fault hook) and at random times, on a local
store and on the moto S3 server; judged by plain reads and the signature library, then rerun."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgeplan.bundle import keys
from edgeplan.bundle.build import build

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def campaign(deployment_root, tmp_path_factory):
    sys.path.insert(0, str(BENCH))
    import reliability

    root, params = deployment_root
    d = tmp_path_factory.mktemp("reliability-keys")
    _, key_path, _ = keys.generate(d)
    return reliability, {"B": build(root, "solo", params)}, key_path, params


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_killed_publish_leaves_latest_whole_and_a_rerun_uploads_only_what_is_missing(campaign, kind, tmp_path,
                                                                                       request):
    reliability, bundles, key_path, params = campaign
    public = keys.load_signing_key(key_path).public
    if kind == "s3":
        uri, endpoint = f"s3://edgeplan/{request.node.name.replace('[', '-').rstrip(']')}", \
            request.getfixturevalue("s3_server")
    else:
        uri, endpoint = str(tmp_path / "store"), None
    r = reliability.run_trials(kind, uri, endpoint, bundles, key_path, public, params, trials=2, seed=5,
                               work=tmp_path, kinds=("first",))
    calls = r["publish"]["first"]["calls"]
    assert calls >= 5 and r["boundary_trials"] == calls and r["random_trials"] == 2
    assert r["killed"] >= calls  # every boundary trial was cut short
    assert r["violations"] == 0, r["violated"]
    # a first publish killed before any of its calls leaves no latest: its last call writes it
    assert {row["latest_after_kill"] for row in r["rows"] if row["kill"] == "boundary"} == {None}


def test_the_fault_hook_kills_before_the_nth_store_call(tmp_path):
    code = ("from edgeplan.store import open_store\n"
            f"s = open_store({str(tmp_path / 'store')!r})\n"
            "for i in range(5):\n"
            "    s.put(f'k{i}', b'x')\n")
    env = {**os.environ, "EDGEPLAN_STORE_KILL_AT": "3"}
    res = subprocess.run([sys.executable, "-c", code], env=env, check=False)
    assert res.returncode == -signal.SIGKILL
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["k0", "k1"]
