"""Upgrades with real processes (issue 16 item 6): a node of this release replays a
journal written by an earlier one (tests/fixtures), and a node that meets a command
format it does not know stops and says so instead of skipping the entry."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest

from raftsched.core.codec import COMMAND_VERSIONS, packb
from tests.fixtures.formats import FIXTURES, expected, fixture_dir
from tests.support.harness import wait_until

#: A command version no release of this code reads.
NEWER_COMMAND_VERSION = max(COMMAND_VERSIONS) + 1

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "fixture-secret-0123456789"


def seed(c, name: str) -> str:
    """The fixture's journal as node n1's data dir; returns the journal path."""
    node_dir = os.path.join(c.tmp, "data", "n1")
    os.makedirs(node_dir, mode=0o700)
    for f in ("raft.journal", "raft.journal.meta"):
        shutil.copy(os.path.join(fixture_dir(name), "journal", f), os.path.join(node_dir, f))
    return os.path.join(node_dir, "raft.journal")


@pytest.mark.parametrize("name", FIXTURES)
def test_a_new_node_replays_an_old_release_journal(cluster_factory, name):
    c = cluster_factory(1, secret=SECRET)
    seed(c, name)
    c.start_all()
    c.wait_leader()
    exp = expected(name)
    with c.client() as cl:
        jobs = wait_until(lambda: (lambda js: js if len(js) == len(exp["jobs"]) else None)(
            cl.list_jobs()["jobs"]), 30, "the fixture's jobs")
        # Keys a later release adds to the view (``done``) may join; none may go.
        assert [{k: v for k, v in j.items() if k in want} for j, want in
                zip(jobs, exp["jobs"], strict=True)] == exp["jobs"]
        for job_id, runs in exp["runs"].items():
            # Likewise for run views (``executed_ms``): every key the fixture has, equal.
            got = cl.runs(job_id, limit=1000)["runs"]
            assert [{k: v for k, v in r.items() if k in want} for r, want in
                    zip(got, runs, strict=True)] == runs
        cl.resume("every-1s")  # and the cluster goes on from it
        wait_until(lambda: any(r["created_ms"] > max(x["created_ms"] for x in
                                                     exp["runs"]["every-1s"])
                               for r in cl.runs("every-1s")["runs"]), 30, "a new run")


def test_a_node_stops_at_a_command_format_it_does_not_know(cluster_factory):
    from pysyncobj.journal import FileJournal

    c = cluster_factory(1, secret=SECRET)
    path = seed(c, FIXTURES[-1])
    journal = FileJournal(path)
    try:
        command, idx, term = journal[len(journal) - 1]
        regular = next(journal[i] for i in range(len(journal) - 1, -1, -1)
                       if journal[i][0][:1] == b"\x00")
        func_id, _args = pickle.loads(regular[0][1:])[:2]
        newer = packb({"op": "read", "at": 1, "v": NEWER_COMMAND_VERSION})
        journal.add(b"\x00" + pickle.dumps((func_id, (newer,)), protocol=2), idx + 1, term)
        journal.flush()
    finally:
        journal._destroy()
    c.start("n1")
    assert c.procs["n1"].wait(60) == 1
    log = open(c.logs["n1"], encoding="utf-8").read()
    assert f"command format v{NEWER_COMMAND_VERSION} was written by a newer raftsched" in log
    assert "upgrade raftsched on this node" in log and "node.refused" in log
