"""Issue 27 item 1: nothing the cluster acknowledged is lost, also to a power cut.

With ``[cluster] durability = "sync"`` (the default) an entry counts — a follower's
acknowledgement of it, the leader's own vote for its commit, a client's reply after
its apply — only once the journal bytes holding it are synced on that node.

Two proofs on real 3-node clusters (``journalhooks`` goes into the node processes):

* the journal trace of every node: no acknowledgement of an append and no commit a
  leader makes counting its own copy ahead of that node's last finished sync (and
  with ``durability = "none"`` the same check finds them: it can fail);
* a power cut: every node's journal loses what was not synced when it is SIGKILLed
  (``LossyFile``), all three are cut at once while writes are in flight, restarted,
  and every acknowledged put and delete is still there (``"none"`` loses them).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from raftsched.core.errors import RaftschedError
from raftsched.node.replica.raft import JOURNAL_FILE
from tests.support.harness import ROOT
from tests.support.journalhooks import hook_dir, violations

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _spec(job_id: str) -> dict[str, Any]:
    # Never due during the test: only the writes matter.
    return {"id": job_id, "schedule": {"every": "24h"}, "command": ["true"]}


def _hook_env(tmp: str, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([hook_dir(tmp), ROOT]), **extra}


class _Writers:
    """Clients putting (and deleting every third of) jobs as fast as they are answered;
    what is answered ok is acknowledged."""

    def __init__(self, cluster: Any, n_threads: int = 3) -> None:
        self.cluster = cluster
        self.stop = threading.Event()
        self.put_ok: set[str] = set()
        self.deleted_ok: set[str] = set()
        #: Deletes sent, answered or not: one the cut left unanswered may have committed.
        self.delete_sent: set[str] = set()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True)
                        for k in range(n_threads)]

    def __enter__(self) -> _Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def count(self) -> int:
        with self._lock:
            return len(self.put_ok)

    def _run(self, k: int) -> None:
        i = 0
        try:
            cl = self.cluster.client(timeout=5)
        except (OSError, RaftschedError):
            return
        with cl:
            while not self.stop.is_set() and i < 10_000:
                job = f"w{k}-{i:05d}"
                i += 1
                try:
                    cl.put_job(_spec(job))
                except (OSError, RaftschedError):
                    continue  # a cut node: not acknowledged
                with self._lock:
                    self.put_ok.add(job)
                if i % 3 == 0:
                    with self._lock:
                        self.delete_sent.add(job)
                    try:
                        cl.delete_job(job)
                    except (OSError, RaftschedError):
                        continue
                    with self._lock:
                        self.deleted_ok.add(job)


def _await(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def _all_jobs(cluster: Any) -> set[str]:
    with cluster.client(timeout=30) as cl:
        return {j["id"] for j in cl.list_jobs(limit=100_000)["jobs"]}


@pytest.mark.parametrize("mode", ["sync", "none"])
def test_no_node_acknowledges_an_entry_before_it_is_synced(cluster_factory, tmp_path,
                                                           mode: str) -> None:
    c = cluster_factory(3, cluster_extra={"durability": mode})
    traces = {nid: str(tmp_path / f"{nid}.trace") for nid in c.ids}
    c.start_all({nid: _hook_env(str(tmp_path), RS_TEST_JOURNAL_TRACE=traces[nid])
                 for nid in c.ids})
    c.wait_leader(30)
    with _Writers(c) as writers:
        _await(lambda: writers.count() >= 150, 60, "150 acknowledged puts")
    assert c.status(c.ids[0])["durability"]["mode"] == mode
    c.terminate_all()
    found = {nid: violations(path) for nid, path in traces.items()}
    acks = sum(counts.get("ack", 0) for _, counts in found.values())
    applies = sum(counts.get("apply", 0) for _, counts in found.values())
    assert acks > 100 and applies > 300, \
        f"{acks} acknowledgements, {applies} applies: the trace saw too little"
    bad = {nid: v[:3] for nid, (v, _) in found.items() if v}
    if mode == "sync":
        assert all(counts.get("sync", 0) > 0 for _, counts in found.values())
        assert not bad, f"acknowledged or committed before a sync: {bad}"
        commits = sum(counts.get("commit", 0) for _, counts in found.values())
        assert commits > 50, f"{commits} leader commits traced"
    else:
        # The same check on a cluster that never syncs finds what it looks for.
        assert bad, "durability = none and yet every acknowledgement followed a sync"


@pytest.mark.parametrize("mode", ["sync", "none"])
def test_a_power_cut_of_the_whole_cluster_loses_nothing_acknowledged(
        cluster_factory, tmp_path, mode: str) -> None:
    c = cluster_factory(3, cluster_extra={"durability": mode})
    env = {nid: _hook_env(str(tmp_path), RS_TEST_LOSSY_JOURNAL="1") for nid in c.ids}
    c.start_all(env)
    c.wait_leader(30)
    journals = [os.path.join(c.data_dir, nid, JOURNAL_FILE) for nid in c.ids]
    with _Writers(c) as writers:
        _await(lambda: writers.count() >= 120, 60, "120 acknowledged puts")
        # Every journal is the lossy one, and (with sync) its node has synced it.
        assert all(os.path.exists(j + ".lossy") for j in journals), journals
        if mode == "sync":
            assert all(c.status(nid)["durability"]["syncs"] > 0 for nid in c.ids)
        # Cut power to all three at once, writes in flight: what a node had not
        # synced is gone from its journal.
        for nid in c.ids:
            os.kill(c.pid(nid), signal.SIGKILL)
        writers.stop.set()
    for nid in c.ids:
        c.procs[nid].wait(10)
    acked_present = writers.put_ok - writers.delete_sent
    for nid in c.ids:
        c.start(nid, env[nid])
    c.wait_leader(60)
    jobs = _all_jobs(c)
    lost = sorted(acked_present - jobs)
    undeleted = sorted(writers.deleted_ok & jobs)
    if mode == "sync":
        assert not lost, f"{len(lost)} acknowledged puts lost by the power cut: {lost[:5]}"
        assert not undeleted, f"acknowledged deletes undone: {undeleted[:5]}"
    else:
        # The layer really drops unsynced writes: without syncs they are gone.
        assert lost, "durability = none kept every acknowledged put through a power cut"
