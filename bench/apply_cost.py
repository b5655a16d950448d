"""A run's cost in the state machine alone: what every node pays for it, W1's shape.

    python -m bench.apply_cost                 # J=1,000 every-second jobs, 20 s
    python -m bench.apply_cost --jobs 5000 --seconds 10
    python -m bench.apply_cost --cron --jobs 10000 --seconds 120   # W5's cron mix

One process, no Raft, no network: J every-second jobs on three nodes' worth of
capacity; each simulated second the leader plans the due runs (``plan_input`` and
``plan_from``, as the leader loop does outside the lock), and every plan, start and
finish goes the way a replica applies a log entry (``replica.Replica.apply``): the
encoded command decoded, read into its typed form, prepared, applied, its effects
taken (encoding is left out of every figure). Starts and finishes in the worker's
batch sizes; every item must be accepted. Prints microseconds per run for each step
(one replica's share: a 3-node cluster pays the apply steps three times, the planning
once). The second of two passes is printed (the first warms the interpreter's
caches). Nothing is asserted; ``docs/scaling.md`` quotes it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.cron_mix import DST_CHANGE_MS, raftsched_spec
from raftsched.core.codec import decode_command, encode_command
from raftsched.core.commands import Finish, FinishItem, Start, StartItem, read
from raftsched.core.leader import LeaderContext, capacities, plan_from, plan_input
from raftsched.core.machine import ClusterState
from raftsched.core.model import RunState
from raftsched.node.worker.worker import MAX_FINISH_BATCH, MAX_START_BATCH

S = 1000
NODES = ("n1", "n2", "n3")
#: Milliseconds ahead the leader plans (the default ``lookahead``).
LOOKAHEAD_MS = 250


def _apply(st: ClusterState, blob: bytes) -> dict[str, Any]:
    """What a replica does with one committed entry."""
    parsed = read(decode_command(blob))
    st.prepare(parsed)
    reply: dict[str, Any] = st.apply(parsed, 1)
    st.take_effects()
    return reply


def _accepted(reply: dict[str, Any]) -> int:
    """How many of a start's or finish's items the state machine took (a refusal's
    path must not pass for the cost of a run)."""
    if not reply.get("ok"):
        raise RuntimeError(f"refused: {reply}")
    return sum(1 for r in reply.get("results", ()) if r and r[0])


def run(jobs: int, seconds: int, cron: bool = False) -> tuple[dict[str, float], int]:
    """Seconds spent per step over ``seconds`` simulated seconds, and the runs ended;
    ``cron``: W5's jobs (``bench.cron_mix``) over its DST change instead of W1's."""
    t0 = DST_CHANGE_MS - (seconds // 2 + 1) * S if cron else 1_800_000_000_000
    st = ClusterState()
    _apply(st, encode_command({"op": "leader", "at": t0, "node": "n1", "term": 1}))
    for n in NODES:
        _apply(st, encode_command({"op": "heartbeat", "at": t0, "node": n, "boot": 1,
                                   "slots": 1024, "queue": 4096, "tags": [], "api": ""}))
    specs = [raftsched_spec(i, "bench.noop:stamp") if cron else
             {"id": f"j{i:05d}", "schedule": {"every": "1s"}, "call": "bench.noop:stamp"}
             for i in range(jobs)]
    for k in range(0, jobs, 1000):
        _apply(st, encode_command({"op": "put_jobs", "at": t0, "atomic": True,
                                   "specs": specs[k:k + 1000]}))
    spent = {"leader plans": 0.0, "plan apply": 0.0, "start apply": 0.0, "finish apply": 0.0}
    runs = started = 0
    # From the jobs' first fire time on (the put's second): no catch-up in the figures.
    now = t0 + S
    while now < t0 + (1 + seconds) * S:
        while True:
            a = time.perf_counter()
            ctx = LeaderContext(node_id="n1", term=1, now_ms=now, lookahead_ms=LOOKAHEAD_MS,
                                since_ms=t0, boot_ms=t0, live=capacities(st))
            cmd = plan_from(plan_input(st, now + LOOKAHEAD_MS, skip_jobs=frozenset()), ctx)
            spent["leader plans"] += time.perf_counter() - a
            if cmd is None:
                break
            blob = encode_command(cmd)
            b = time.perf_counter()
            if not _apply(st, blob).get("ok"):
                raise RuntimeError("a plan was refused")
            spent["plan apply"] += time.perf_counter() - b
        for node in NODES:
            mine = [r for r in st.runs.values() if r.node == node and r.state == "assigned"]
            for k in range(0, len(mine), MAX_START_BATCH):
                blob = encode_command(Start(node=node, at=now, items=tuple(
                    StartItem(r.run_id, r.fence) for r in mine[k:k + MAX_START_BATCH])))
                b = time.perf_counter()
                reply = _apply(st, blob)
                spent["start apply"] += time.perf_counter() - b
                started += _accepted(reply)
            for k in range(0, len(mine), MAX_FINISH_BATCH):
                part = mine[k:k + MAX_FINISH_BATCH]
                blob = encode_command(Finish(node=node, at=now + 5, items=tuple(
                    FinishItem(r.run_id, r.fence, RunState.succeeded.value, None, "", "")
                    for r in part)))
                b = time.perf_counter()
                reply = _apply(st, blob)
                spent["finish apply"] += time.perf_counter() - b
                runs += _accepted(reply)
        now += S
    if started != runs:
        raise RuntimeError(f"{started} runs started, {runs} finished")
    return spent, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--cron", action="store_true", help="W5's cron jobs across its DST change")
    args = ap.parse_args()
    run(args.jobs, args.seconds, args.cron)
    spent, runs = run(args.jobs, args.seconds, args.cron)
    kind = "W5 cron" if args.cron else "every-second"
    print(f"J={args.jobs:,} {kind} jobs, {args.seconds} s simulated, {runs:,} runs")
    print("| step | µs per run |\n|---|---|")
    for name, s in spent.items():
        print(f"| {name} | {s * 1e6 / runs:.1f} |")
    applies = sum(s for name, s in spent.items() if name.endswith("apply"))
    print(f"| one replica's applies (each node pays these) | {applies * 1e6 / runs:.1f} |")


if __name__ == "__main__":
    main()
