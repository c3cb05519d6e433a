"""The per-machine conversion slots: held while a holder lives, free again the moment it is killed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from tasks import slots

HOLDER = "import sys, time; from tasks.slots import slot\nwith slot('t', 1):\n    print('held', flush=True)\n    time.sleep(600)\n"


def test_a_killed_holder_frees_its_slot(tmp_path, monkeypatch):
    monkeypatch.setattr(slots, "DIR", tmp_path)
    env = {**os.environ, "EDGEPLAN_SLOTS_DIR": str(tmp_path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    got = []

    def take():
        with slots.slot("t", 1, poll_s=0.05) as k:
            got.append(k)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    time.sleep(0.5)
    assert got == []  # the one slot is taken
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    t.join(timeout=5)
    assert got == [0]
    with slots.slot("t", 2) as a, slots.slot("t", 2) as b:  # two slots: both at once
        assert {a, b} == {0, 1}
