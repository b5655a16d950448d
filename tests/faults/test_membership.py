"""Membership changes with real processes while 20 every-second jobs run (issue 16
items 1-2): replace a dead node, grow 3 -> 5 and shrink 5 -> 3, with no fire time lost
or run twice; a removed node that comes back is refused, says so, and never leads.

Each test prints its figures: the scheduling lag of the runs (start minus fire time)
before and during the change, and the longest pause between two run starts."""

from __future__ import annotations

import collections
import os
import shutil
import time

import pytest

from raftsched.core.errors import RaftschedError
from tests.support.harness import (
    outcomes_by_fire_time,
    read_witness,
    wait_until,
    witness_command,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

JOBS = [f"m{i}" for i in range(20)]
SECRET = "membership-secret-0123456789"


def loaded_cluster(cluster_factory, tmp_path):
    """3 nodes running the 20 jobs; returns (cluster, witness path)."""
    c = cluster_factory(3, secret=SECRET)
    c.start_all()
    c.wait_leader()
    ran = str(tmp_path / "ran.jsonl")
    put_load(c, ran)
    return c, ran


def put_load(c, ran: str) -> None:
    with c.client() as cl:
        cl.put_jobs([{"id": j, "schedule": {"every": "1s"}, "overlap": "allow",
                      "misfire": {"policy": "all", "grace": "10s"},
                      "command": witness_command(ran)} for j in JOBS], atomic=True)
    wait_until(lambda: len(read_witness(ran)) >= 3 * len(JOBS), 60, "runs before the change")


def at_half_second() -> None:
    """Sleep to just after a whole second: on this loaded machine the runs of a fire
    time start 0.3-0.9 s after it and last ~0.1 s, so few are executing then."""
    time.sleep((1.1 - time.time() % 1.0) % 1.0)


def leaders_seen(c, among: list[str], removed: set[str], seen: set[str]) -> None:
    for nid in among:
        if c.alive(nid):
            try:
                leader = c.status(nid)["leader"]
            except (RaftschedError, OSError):
                continue
            seen.add(leader)
    assert not (seen & removed), f"a removed node led: {seen & removed}"


def check_load(c, ran: str, t_begin: float, t_end: float, survivors: list[str],
               killed: tuple[str, float] | None = None) -> dict:
    """Every fire time in [t_begin, t_end] ran exactly once; returns the figures.

    ``killed`` (node, time): a run that node was executing when it was SIGKILLed runs
    again elsewhere as attempt 2 (``on_node_lost = retry``, at-least-once by design),
    and so does a run a node stopped when it fenced itself (no quorum: a starved
    machine): counted apart, as ``retried_after_kill_or_fence``; any other second
    execution is doubled. A fire time a starved node recorded missed or lost with that
    reason (:data:`STARVED`) is counted as ``starved``: fewer than one instant's runs."""
    lo = (int(t_begin) + 1) * 1000
    hi = int(t_end) * 1000

    def all_ended() -> dict | None:
        with c.client(survivors, timeout=30) as cl:
            got = {j: cl.runs(j, limit=1000)["runs"] for j in JOBS}
        pending = [r for rs in got.values() for r in rs if r["scheduled_ms"] <= hi
                   and r["state"] in ("pending", "assigned", "started")]
        return None if pending else got

    # On this loaded machine a run may start seconds after its fire time.
    runs = wait_until(all_ended, 90, "every run of the window ended", interval=0.5)
    witness = read_witness(ran)
    executed = collections.Counter(r["RUN_ID"] for r in witness)
    doubled = {k: v for k, v in executed.items() if v > 1}
    retried = set()
    fenced = self_fenced_runs(c)
    by_run = collections.defaultdict(list)
    for r in witness:
        by_run[r["RUN_ID"]].append(r)
    for rid in list(doubled):
        recs = sorted(by_run[rid], key=lambda r: int(r["ATTEMPT"]))
        if len(recs) != 2 or int(recs[1]["ATTEMPT"]) <= int(recs[0]["ATTEMPT"]):
            continue
        # (A job process spawned just before the kill may write its line just after;
        # on a loaded machine a Python start can take seconds. The killed node is
        # not restarted before this check, so it cannot have started a run later.)
        after_kill = (killed is not None and recs[0]["NODE_ID"] == killed[0]
                      and recs[0]["t"] < killed[1] + 5.0)
        # A node starved of CPU for over a second (no quorum) fences itself and stops
        # its runs; under on_node_lost = retry the run is retried elsewhere: at least
        # once by design, and never two at a time (the retry began after the stop).
        node, stopped = fenced.get((rid, int(recs[0]["FENCE"])), (None, 0.0))
        after_fence = recs[0]["NODE_ID"] == node and recs[1]["t"] >= stopped
        if after_kill or after_fence:
            retried.add(rid)
            del doubled[rid]
    lost, twice, starved = [], [], []
    for j in JOBS:
        acc = outcomes_by_fire_time(runs[j])
        for t in range(lo, hi + 1, 1000):
            outcomes = acc.get(t, [])
            if len(outcomes) > 1:
                # A run started on the killed node is recorded lost there and retried
                # (attempt 2), whether attempt 1 had begun executing or not; so is one
                # a starved node stopped when it fenced itself.
                # (Its guard proves a killed node dead: "node crashed (certified)".)
                gone = RETRIED_LOSSES + (
                    (f"lost:node {killed[0]} ", "lost:node crashed (certified)")
                    if killed is not None else ())
                kept = [o for o in outcomes if not o.startswith(gone)]
                if len(kept) == 1:
                    retried.add(f"{j}@{t}")
                    outcomes = kept
            if len(outcomes) != 1:
                twice.append((j, t, outcomes)) if outcomes else lost.append((j, t))
            elif outcomes[0].startswith(STARVED):
                starved.append((j, t, outcomes[0]))
            elif not outcomes[0].startswith(("succeeded", "started")):
                lost.append((j, t, outcomes[0]))
            elif outcomes[0].startswith("succeeded") and executed[f"{j}@{t}"] != 1 \
                    and f"{j}@{t}" not in retried:
                lost.append((j, t, f"ran {executed[f'{j}@{t}']}x"))
    lag = sorted(r["t"] - _fire_s(r) for r in witness if lo / 1000 <= _fire_s(r) <= hi / 1000)
    before = sorted(r["t"] - _fire_s(r) for r in witness if _fire_s(r) < lo / 1000)
    starts = sorted(r["t"] for r in witness if lo / 1000 <= r["t"] <= hi / 1000 + 1)
    gap = max((b - a for a, b in zip(starts, starts[1:], strict=False)), default=0.0)
    figures = {"fire_times": len(JOBS) * ((hi - lo) // 1000 + 1), "lost": len(lost),
               "doubled": len(doubled), "retried_after_kill_or_fence": len(retried),
               "starved": len(starved),
               "lag_p50_before_s": round(before[len(before) // 2], 3),
               "lag_p50_s": round(lag[len(lag) // 2], 3), "lag_max_s": round(lag[-1], 3),
               "longest_pause_between_starts_s": round(gap, 3)}
    print(f"\nmembership figures: {figures}")
    assert not doubled, f"run ids executed more than once: {doubled}"
    assert not twice, f"fire times with two outcomes: {twice[:5]}"
    assert not lost, f"fire times not run exactly once: {lost[:10]}"
    # None expected (measured: 0 in every run, also beside a nemesis run); a node the
    # machine starves past its lease fences itself and misses the one or two runs it
    # held, never an instant's worth (a cluster that stopped scheduling would).
    assert len(starved) <= 2, f"fire times missed, the node starved: {starved[:10]}"
    return figures


#: Attempts a node gave up on its own when it could not reach the cluster (a machine
#: starved of CPU): ``on_node_lost = retry`` runs them again elsewhere.
RETRIED_LOSSES = ("lost:self-fenced", "lost:no lease")
#: What a fire time ends as when the machine starved the node that held it past the
#: job's grace (10 s here): recorded by that node with its reason, never silent.
STARVED = RETRIED_LOSSES + ("missed:late: past its grace on this node",)


def self_fenced_runs(c) -> dict[tuple[str, int], tuple[str, float]]:
    """(run id, fence) -> (node, when it stopped it, s) for each attempt a node stopped
    when it fenced itself (``run.finished`` lost, "self-fenced: ..."); one run may have
    several such attempts."""
    out = {}
    for nid in c.ids:
        for e in c.events(nid):
            if e.get("event") == "run.finished" and e.get("outcome") == "lost" \
                    and str(e.get("reason", "")).startswith("self-fenced"):
                out[(e["run_id"], int(e["fence"]))] = (e["node"], e["ts_ms"] / 1000)
    return out


def _fire_s(rec: dict) -> float:
    from datetime import datetime
    return datetime.fromisoformat(rec["SCHEDULED_AT"].replace("Z", "+00:00")).timestamp()


def expect_refused(c, nid: str) -> str:
    """``nid`` (removed) was started again: it stops with status 1 and says why."""
    assert c.procs[nid].wait(60) == 1
    text = open(c.logs[nid], encoding="utf-8").read()
    assert f"this node ({nid}) was removed from the cluster" in text, text[-2000:]
    return text


def test_replace_a_dead_node_under_load(cluster_factory, tmp_path):
    c, ran = loaded_cluster(cluster_factory, tmp_path)
    seen: set[str] = set()
    t_begin = time.time()
    at_half_second()
    t_kill = c.kill("n3")
    shutil.rmtree(os.path.join(c.tmp, "data", "n3"))
    c.new_node("n4")
    c.start("n4", join=True)
    wait_until(lambda: c.status("n4")["membership"]["joining"], 30, "n4 waits to join")
    with c.client(["n1", "n2"], timeout=90) as cl:
        t0 = time.time()
        added = cl.add_node("n4", raft=c.raft["n4"], api=c.api["n4"])
        t_add = time.time() - t0
        assert added["members"] == 4
        leaders_seen(c, ["n1", "n2", "n4"], {"n3"}, seen)
        t0 = time.time()
        removed = cl.remove_node("n3")
        t_remove = time.time() - t0
        assert removed == {"node": "n3", "raft": c.raft["n3"], "status": "removed",
                           "members": 3}
        wait_until(lambda: cl.status()["nodes"] and all(
            n["alive"] for n in cl.status()["nodes"] if n["node_id"] in ("n1", "n2", "n4")),
            30, "n4 alive in the cluster")
    time.sleep(3.0)
    t_end = time.time()
    figures = check_load(c, ran, t_begin, t_end, ["n1", "n2", "n4"], killed=("n3", t_kill))
    print(f"replace: add-node {t_add:.3f}s, remove-node {t_remove:.3f}s, {figures}")
    assert any(r["NODE_ID"] == "n4" for r in read_witness(ran)), "n4 took work"
    status = c.status("n1")
    assert status["membership"]["voting"] == sorted(c.raft[n] for n in ("n1", "n2", "n4"))
    assert any("n3 was removed" in p for p in status["membership"]["problems"])
    # n3 comes back (its old config, a wiped data dir): refused, and never leads.
    c.start("n3")
    expect_refused(c, "n3")
    leaders_seen(c, ["n1", "n2", "n4"], {"n3"}, seen)


def test_grow_to_five_and_shrink_back_to_three_under_load(cluster_factory, tmp_path):
    c, ran = loaded_cluster(cluster_factory, tmp_path)
    seen: set[str] = set()
    t_begin = time.time()
    timings = {}
    for nid in ("n4", "n5"):
        c.new_node(nid)
        c.start(nid, join=True)
        wait_until(lambda n=nid: c.status(n)["membership"]["joining"], 30, f"{nid} waits")
        with c.client(["n1", "n2", "n3"], timeout=90) as cl:
            t0 = time.time()
            assert cl.add_node(nid, raft=c.raft[nid], api=c.api[nid])["status"] == "active"
            timings[f"add {nid}"] = round(time.time() - t0, 3)
        wait_until(lambda n=nid: any(r["NODE_ID"] == n for r in read_witness(ran)), 60,
                   f"runs on {nid}")
        leaders_seen(c, c.ids, set(), seen)
    assert len(c.status("n1")["membership"]["voting"]) == 5
    # Shrink: the newest two leave (drained first, alive), then they try to come back.
    for nid in ("n5", "n4"):
        # One address with the whole budget: the remove drains the node first, which
        # under load can outlast a third of it, and the client would then send the same
        # remove to the next address while the first is still draining.
        with c.client(["n1"], timeout=150) as cl:
            t0 = time.time()
            assert cl.remove_node(nid)["status"] == "removed"
            timings[f"remove {nid}"] = round(time.time() - t0, 3)
        leaders_seen(c, ["n1", "n2", "n3"], {"n4", "n5"} & {nid}, seen)
    time.sleep(3.0)
    t_end = time.time()
    figures = check_load(c, ran, t_begin, t_end, ["n1", "n2", "n3"])
    print(f"grow/shrink: {timings}, {figures}")
    assert c.status("n1")["membership"]["voting"] == sorted(c.raft[n] for n in ("n1", "n2", "n3"))
    # A removed node that stayed up learns it (from a member) and stops.
    for nid in ("n4", "n5"):
        expect_refused(c, nid)
    # Restarted with its data dir intact, it is refused again and never leads.
    term = c.status("n1")["term"]
    c.start("n5")
    expect_refused(c, "n5")
    leaders_seen(c, ["n1", "n2", "n3"], {"n4", "n5"}, seen)
    assert c.status("n1")["term"] == term, "the removed node disturbed the leader"


def test_add_node_refuses_a_change_that_would_lose_the_quorum(cluster_factory, tmp_path):
    c = cluster_factory(3, secret=SECRET)
    c.start_all()
    c.wait_leader()
    c.kill("n3")
    c.new_node("n4")  # not started: nothing answers at its API address
    with c.client(["n1", "n2"]) as cl:
        wait_until(lambda: cl.status()["membership"]["members"], 20, "membership seeded")
        with pytest.raises(RaftschedError, match="needs 3 up to commit.*--join"):
            cl.add_node("n4", raft=c.raft["n4"], api=c.api["n4"])
        with pytest.raises(RaftschedError, match="n9: is not a member"):
            cl.remove_node("n9")
        with pytest.raises(RaftschedError, match="raft address .* is member n1"):
            cl.add_node("n5", raft=c.raft["n1"], api=c.api["n4"])
        assert len(cl.status()["membership"]["voting"]) == 3
    # The refused commands changed nothing; the cluster still writes.
    with c.client(["n1", "n2"]) as cl:
        cl.put_job({"id": "still", "schedule": {"every": "1h"}, "command": ["true"]})


def test_removing_the_leader_hands_leadership_over_first(cluster_factory, tmp_path):
    c = cluster_factory(3, secret=SECRET)
    c.start_all()
    leader = c.wait_leader()
    c.new_node("n4")
    rest = [n for n in ("n1", "n2", "n3") if n != leader]
    with c.client(rest, timeout=90) as cl:
        wait_until(lambda: cl.status()["membership"]["members"], 20, "membership seeded")
        # All three members are up and connected (add-node counts reachable members,
        # and a loaded machine can drop a connection for a moment): the fourth's entry
        # commits without it (3 of 4).
        wait_until(lambda: cl.status()["health"] == "ok", 30, "all three members reachable")
        cl.add_node("n4", raft=c.raft["n4"], api=c.api["n4"])
        assert cl.remove_node(leader)["status"] == "removed"
        # n4 starts only now, its file still listing the removed (and still running)
        # old leader, which campaigns: n4 takes no part in an election until the
        # leader has reached it.
        c.start("n4", join=True)
        new = c.wait_leader(30, among=rest + ["n4"])
        assert new != leader
        assert cl.status()["membership"]["voting"] == sorted(c.raft[n] for n in rest + ["n4"])
        cl.put_job({"id": "after", "schedule": {"every": "1h"}, "command": ["true"]})
    expect_refused(c, leader)
    events = [e.get("event") for e in c.events(leader)]
    assert "leader.transferred" in events or "leader.stepped_down" in events, events[-10:]
