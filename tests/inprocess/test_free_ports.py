"""free_ports (raftsched/faces/launcher.py) hands a port out once per PORT_HOLD_S on
this machine, whichever process asks: parallel test workers (or a benchmark beside
them) choose ports before their nodes bind them, and two of them were once handed the
same one (a node then refused to start: "port in use")."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import pytest

from raftsched.faces.launcher import free_ports, reserve_ports
from tests.support.harness import ROOT

pytestmark = pytest.mark.timeout(60)

ASK = "from raftsched.faces.launcher import free_ports; print(*free_ports(40))"


def test_processes_asking_at_once_never_get_the_same_port():
    def ask(_: int) -> list[int]:
        out = subprocess.run([sys.executable, "-c", ASK], capture_output=True, text=True,
                             timeout=30, cwd=ROOT, check=True).stdout
        return [int(p) for p in out.split()]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(4)))
    every = [p for a in answers for p in a]
    assert all(len(a) == 40 for a in answers)
    assert len(set(every)) == len(every)


def test_a_port_handed_out_is_not_reserved_again():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert not reserve_ports(ports[:1])
    assert set(free_ports(3)).isdisjoint(ports)
