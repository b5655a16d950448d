"""Issue 16 item 8: the cluster secret rotates without downtime, read-only credentials,
and audit events naming the credential of every change.

Three real nodes read their secrets from a secret file. The file goes through the
three steps of a rotation — ``[old, new]``, ``[new, old]``, ``[new]`` — while two
clients, one holding the old secret and one the new, write every 0.2 s: no write fails
while its secret is accepted, Raft keeps committing at every step (the nodes seal Raft
traffic with the file's first secret and open either), and after the last step the old
secret and its read-only token are refused. Every write is in an ``audit`` event that
names the credential's fingerprint — never the secret.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from raftsched.core.errors import Unauthenticated
from raftsched.wire import session
from raftsched.wire.client import Client
from tests.support.harness import Cluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

OLD = "old-secret-of-the-cluster-0123456789"
NEW = "new-secret-of-the-cluster-9876543210"


def _write(path: str, secrets: list[str]) -> None:
    """As an operator should: a new file moved into place."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# the used secret first\n" + "\n".join(secrets) + "\n")
    os.replace(tmp, path)


class Writer:
    """A client that puts a job every 0.2 s and records each failure."""

    def __init__(self, c: Cluster, secret: str, name: str) -> None:
        self.client = Client([c.api[n] for n in c.ids], secret=secret, timeout=10)
        self.name = name
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(0.2):
            i += 1
            try:
                self.client.put_job({"id": f"w-{self.name}", "schedule": {"every": "1h"},
                                     "command": ["true"], "env": {"N": str(i)}})
                self.ok += 1
            except Exception as exc:  # noqa: BLE001 - recorded, asserted by the test
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.client.close()


def _step(c: Cluster, path: str, secrets: list[str]) -> None:
    """Write the file and wait until every node has reloaded it."""
    before = {n: len(_reloads(c, n)) for n in c.ids}
    _write(path, secrets)
    used = f"admin:{session.fingerprint(secrets[0])}"
    wait_until(lambda: all(len(_reloads(c, n)) > before[n] and _reloads(c, n)[-1]["used"] == used
                           for n in c.ids), 20, f"every node to use {used}")


def _reloads(c: Cluster, nid: str) -> list[dict[str, Any]]:
    return [e for e in c.events(nid) if e.get("event") == "secret.reloaded"]


def test_the_secret_rotates_in_three_steps_without_a_failed_write(tmp_path: Any) -> None:
    path = str(tmp_path / "secret")
    _write(path, [OLD])
    c = Cluster(str(tmp_path / "cluster"), 3, cluster_extra={"secret_file": path})
    c.secret = OLD  # the harness's own clients
    writers: list[Writer] = []
    try:
        c.start_all()
        c.wait_leader()
        old_w = Writer(c, OLD, "old")
        writers.append(old_w)
        wait_until(lambda: old_w.ok >= 3, 20, "the old secret's writer to write")
        _step(c, path, [OLD, NEW])  # 1: accept the new one
        new_w = Writer(c, NEW, "new")
        writers.append(new_w)
        wait_until(lambda: new_w.ok >= 5, 20, "the new secret's writer to write")
        _step(c, path, [NEW, OLD])  # 2: use the new one (Raft seals with it now)
        ok_before = (old_w.ok, new_w.ok)
        wait_until(lambda: old_w.ok >= ok_before[0] + 5 and new_w.ok >= ok_before[1] + 5, 20,
                   "both writers to go on writing")
        old_w.stop()
        assert old_w.failures == [], old_w.failures
        _step(c, path, [NEW])  # 3: forget the old one
        ok_before = (0, new_w.ok)
        wait_until(lambda: new_w.ok >= ok_before[1] + 5, 20, "the new writer to go on")
        new_w.stop()
        assert new_w.failures == [], new_w.failures
        # The old secret and its read-only token are refused now; the new ones work.
        for secret in (OLD, session.read_only_token(OLD)):
            with Client([c.api["n1"]], secret=secret, timeout=5) as cl, \
                    pytest.raises(Unauthenticated):
                cl.status()
        with Client([c.api[n] for n in c.ids], secret=session.read_only_token(NEW),
                    timeout=10) as ro:
            assert ro.get_job("w-new")["id"] == "w-new"
            with pytest.raises(Unauthenticated, match="admin credential"):
                ro.delete_job("w-new")
        # Raft still commits between the nodes (sealed with the new secret alone).
        with Client([c.api[n] for n in c.ids], secret=NEW, timeout=10) as cl:
            cl.put_job({"id": "after", "schedule": {"every": "1h"}, "command": ["true"]})
            assert all(cl.status()["leader"] in c.ids for _ in range(2))
        c.secret = NEW
        for nid in c.ids:
            wait_until(lambda n=nid: c.status(n)["jobs"] == 3, 10,
                       f"{nid} to have applied every job")
        # Audit: every write names its credential; no secret anywhere in the logs.
        audits = [e for n in c.ids for e in c.events(n) if e.get("event") == "audit"]
        by_cred = {e["credential"] for e in audits if e.get("op") == "put_job"
                   and e.get("outcome") == "ok"}
        assert {f"admin:{session.fingerprint(OLD)}",
                f"admin:{session.fingerprint(NEW)}"} <= by_cred, by_cred
        refused = [e for e in audits if e.get("op") == "delete_job"]
        assert refused == [], "a refused read-only write never reached the handler"
        assert all(e["targets"] for e in audits)
        for nid in c.ids:
            with open(c.logs[nid], encoding="utf-8") as f:
                text = f.read()
            assert OLD not in text and NEW not in text
    finally:
        for w in writers:
            w.stop()
        c.close()
