"""The work done under the Raft lock in W5's shape, in one process (issue 13 item 1).

``python -m bench.lockwork``: 10,000 W5 cron jobs put in atomic 1,000-spec commands (a
job file is one command whatever its size; the API cuts other bulk puts into commands
of 25, ``raftsched.node.service.jobops.PUT_CHUNK``; ``from_wire``, which prepares the specs, is
timed on its own as ``put-prep``:
the replica runs it on the Raft thread but outside the lock), the same jobs updated by
``apply`` commands of 1,000 specs (``raftsched apply`` of a changed job file; its
``from_wire`` and ``ClusterState.prepare`` are ``apply-prep``), then 180
seconds of the leader's bounded plans (with six plans' jobs left out of each copy, as
in flight), each node's start and finish commands of the sizes the worker sends. Each
state access a node makes under the lock (the copy, the applies) is timed twice: wall
time and the thread's CPU time (``time.thread_time``). On a loaded host the two differ
by preemption, which no bound on the work can remove; the CPU column is the work.
Python's cyclic GC runs inside whatever allocates, often an apply: its collections are
listed too (with the node's thresholds, ``raftsched.node.node.GC_THRESHOLDS``).
"""

from __future__ import annotations

import gc
import time
from functools import partial
from typing import Any

from bench.cron_mix import DST_CHANGE_MS, raftsched_spec
from raftsched.core.codec import decode_command, encode_command
from raftsched.core.commands import Finish, FinishItem, Start, StartItem, from_wire
from raftsched.core.leader import MAX_JOBS_PER_PLAN, Capacity, LeaderContext, plan_from, plan_input
from raftsched.core.machine import ClusterState
from raftsched.node.leader.plans import MAX_PLANS_IN_FLIGHT
from raftsched.node.worker.worker import MAX_FINISH_BATCH, MAX_START_BATCH

S = 1000
#: Specs per put command: the most one command takes (an atomic put, an apply).
PUT_BATCH = 1000


def _ok(st: ClusterState, cmd: Any) -> None:
    # apply takes typed commands since 2026-12-05 (apply_map reads a map first); a
    # baseline tree's apply took the map.
    reply = getattr(st, "apply_map", st.apply)(cmd, 1)
    assert reply["ok"], reply
    st.take_effects()


def _apply(st: ClusterState, wire: dict[str, Any], parsed: Any) -> Any:
    if hasattr(st, "apply_map"):
        return st.apply(parsed, 1)
    return st.apply(wire, 1, parsed=parsed)  # a baseline tree's signature


def _prepared(st: ClusterState, wire: dict[str, Any]) -> Any:
    """What the replica does before it takes the lock (``prepare``: since 2026-12-02)."""
    cmd = from_wire(wire)
    if hasattr(st, "prepare"):
        st.prepare(cmd)
    return cmd


def _timed(out: list[tuple[float, float]], fn: Any, *args: Any) -> Any:
    a, c = time.perf_counter(), time.thread_time()
    value = fn(*args)
    out.append((time.perf_counter() - a, time.thread_time() - c))
    return value


def run(jobs: int = 10_000, seconds: int = 180) -> dict[str, list[tuple[float, float]]]:
    t0 = DST_CHANGE_MS - 3600 * S
    st = ClusterState()
    _ok(st, {"op": "leader", "at": t0, "node": "n1", "term": 1})
    for n in ("n1", "n2", "n3"):
        _ok(st, {"op": "heartbeat", "at": t0, "node": n, "boot": 1, "slots": 1024,
                 "queue": 4096, "tags": [], "api": ""})
    specs = [raftsched_spec(i, "bench.noop:stamp") for i in range(jobs)]
    out: dict[str, list[tuple[float, float]]] = {
        "put-prep": [], "put": [], "apply-prep": [], "apply": [], "copy": [], "plan": [],
        "start": [], "finish": []}
    for k in range(0, jobs, PUT_BATCH):
        wire = {"op": "put_jobs", "at": t0, "atomic": True, "specs": specs[k:k + PUT_BATCH]}
        put = _timed(out["put-prep"], from_wire, wire)
        _timed(out["put"], _apply, st, wire, put)
        st.take_effects()
    # `raftsched apply` of a changed job file: every job of a batch updated.
    for k in range(0, jobs, PUT_BATCH):
        wire = {"op": "apply", "at": t0, "specs": [dict(s, timeout="10m")
                                                   for s in specs[k:k + PUT_BATCH]]}
        put = _timed(out["apply-prep"], _prepared, st, wire)
        _timed(out["apply"], _apply, st, wire, put)
        st.take_effects()
    flying = frozenset(f"w5-{i:05d}" for i in range(0, MAX_PLANS_IN_FLIGHT
                                                    * MAX_JOBS_PER_PLAN * 5, 5))
    now = t0 + 5 * S
    while now < t0 + (5 + seconds) * S:
        while True:
            live = tuple(Capacity(node_id=n, tags=frozenset(r.tags), slots=r.slots,
                                  limit=r.slots + r.queue, load=len(st.by_node.get(n, ())))
                         for n, r in sorted(st.nodes.items()))
            ctx = LeaderContext(node_id="n1", term=1, now_ms=now, lookahead_ms=250,
                                since_ms=t0, boot_ms=t0, live=live)
            inp = _timed(out["copy"], partial(plan_input, st, now + 250, skip_jobs=flying))
            cmd = plan_from(inp, ctx)
            if cmd is None:
                break
            wire = decode_command(encode_command(cmd))
            parsed = from_wire(wire)  # outside the lock, as raft.py does
            _timed(out["plan"], _apply, st, wire, parsed)
            st.take_effects()
        for node in ("n1", "n2", "n3"):
            mine = [r for r in st.runs.values() if r.node == node and r.state == "assigned"]
            for k in range(0, len(mine), MAX_START_BATCH):
                items = tuple(StartItem(r.run_id, r.fence) for r in mine[k:k + MAX_START_BATCH])
                _timed(out["start"], st.apply, Start(node=node, items=items, at=now))
            for k in range(0, len(mine), MAX_FINISH_BATCH):
                items2 = tuple(FinishItem(r.run_id, r.fence, "succeeded", None, "", "")
                               for r in mine[k:k + MAX_FINISH_BATCH])
                _timed(out["finish"], st.apply, Finish(node=node, items=items2, at=now + 5))
            st.take_effects()
        now += S
    return out


def report(out: dict[str, list[tuple[float, float]]]) -> str:
    lines = []
    for name, xs in out.items():
        wall = sorted(x[0] * 1000 for x in xs)
        cpu = sorted(x[1] * 1000 for x in xs)

        def q(v: list[float], p: float) -> float:
            return v[min(len(v) - 1, int(len(v) * p))]
        lines.append(f"{name:10} n={len(xs):5}  wall p50 {q(wall, .5):5.2f} p99 {q(wall, .99):6.2f}"
                     f" max {wall[-1]:6.2f} | cpu p50 {q(cpu, .5):5.2f} p99 {q(cpu, .99):5.2f}"
                     f" max {cpu[-1]:5.2f} ms | wall > 20 ms: {sum(1 for v in wall if v > 20)}")
    return "\n".join(lines)


def _gc_probe() -> list[tuple[int, float]]:
    """Record (generation, CPU ms) of every collection from now on."""
    seen: list[tuple[int, float]] = []
    start = [0.0]

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            start[0] = time.thread_time()
        else:
            seen.append((info["generation"], (time.thread_time() - start[0]) * 1000))
    gc.callbacks.append(cb)
    return seen


if __name__ == "__main__":
    import sys

    from raftsched.node.node import GC_THRESHOLDS
    # `python -m bench.lockwork [SECONDS [T0,T1,T2]]`: a longer run reaches the middle
    # generation's collections; other thresholds compare against the node's.
    gc.set_threshold(*(tuple(int(x) for x in sys.argv[2].split(",")) if len(sys.argv) > 2
                       else GC_THRESHOLDS))  # as a node process sets it
    print(f"gc thresholds {gc.get_threshold()}")
    collections = _gc_probe()
    print(report(run(seconds=int(sys.argv[1]) if len(sys.argv) > 1 else 180)))
    for gen in (0, 1, 2):
        ms = [c for g, c in collections if g == gen]
        if ms:
            print(f"gc gen{gen}: {len(ms)} collections, cpu max {max(ms):.1f} ms, "
                  f"sum {sum(ms):.0f} ms")
