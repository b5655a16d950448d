"""Issue 29 item 6: Ctrl-C of ``raftsched local`` drains the runs before the nodes go.

It stopped every node at once: the idle ones left at once, the last one with a run lost
its quorum and killed the run (``lost (self-fenced)``), which came back as attempt 2 at
the next start. Now a run executing at Ctrl-C finishes and is recorded as what it was,
once; the next start undoes the drain and the cluster takes work again."""

from __future__ import annotations

import pytest

from raftsched.wire.client import Client
from tests.support.harness import read_witness, wait_until, witness_command
from tests.support.localproc import LocalProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

#: Long enough that, stopped all at once, the node running it loses its quorum (its
#: peers leave in a second or two) and fences itself (node timeout 3 s) before it ends.
RUN_S = 10


def _healthy(addrs: list[str]) -> None:
    with Client(addrs, timeout=5) as cl:
        wait_until(lambda: cl.status()["health"] == "ok", 60, "a healthy local cluster",
                   interval=0.5)


def test_ctrl_c_drains_a_running_run_which_is_recorded_once_as_it_ended(tmp_path):
    data_dir = str(tmp_path / "local")
    ran = str(tmp_path / "ran.jsonl")
    with LocalProcess(data_dir) as local:
        _healthy(local.addrs)
        with Client(local.addrs, timeout=10) as cl:
            cl.put_job({"id": "slow", "schedule": {"every": "24h"},
                        "command": witness_command(ran, sleep_s=RUN_S)})
            run_id = cl.trigger("slow")["run_id"]
            wait_until(lambda: read_witness(ran), 30, "the run executing")
        # Ctrl-C while it runs: local waits for it (bounded by the nodes' stop timeout).
        assert local.stop(timeout=90) == 0, local.lines[-30:]
        feed = list(local.lines)
    base = local.base

    # The outcome was committed before the nodes left: the next start shows it as it
    # ended (not lost, no attempt 2), and undoes the drain.
    with LocalProcess(data_dir, base=base) as again:
        _healthy(again.addrs)
        with Client(again.addrs, timeout=10) as cl:
            attempts = [r for r in cl.runs("slow")["runs"] if r["run_id"] == run_id]
            assert not [r for r in attempts if "self-fenced" in (r["reason"] or "")], attempts
            assert [(r["attempt"], r["state"]) for r in attempts] == [(1, "succeeded")], \
                attempts
            again.wait_line(r"undrained n1, n2, n3", 60, "the drain undone")
            assert not [n for n in cl.status()["nodes"] if n.get("draining")]
            # Work is placed again: a triggered run runs (a quick one: what it shows is
            # that the undrained cluster places work, not how long a run may take).
            cl.put_job({"id": "quick", "schedule": {"every": "24h"},
                        "command": witness_command(ran)})
            second = cl.trigger("quick")["run_id"]

            def done() -> bool:
                runs = [r for r in cl.runs("quick")["runs"] if r["run_id"] == second]
                return bool(runs) and runs[0]["state"] == "succeeded"

            wait_until(done, 40, "the run after the restart", interval=0.5)
        assert again.stop(timeout=90) == 0, again.lines[-30:]
    # The stop said what it waited for, and no node fenced itself.
    assert any("waiting for 1 run(s)" in line for line in feed), feed[-30:]
    assert not [line for line in feed if "self_fenced" in line], feed[-30:]
    # Leadership left the first node drained (if it led) and then stayed put: with every
    # node draining there is no one to hand it to (it went round, a change a second).
    stop_at = next(i for i, line in enumerate(feed) if "stopping: draining" in line)
    changes = {line.split("leader.changed")[1].strip() for line in feed[stop_at:]
               if "leader.changed" in line}
    assert len(changes) <= 1, feed[stop_at:]
    # Executed once each: the drained run was never run again.
    assert sorted(r["RUN_ID"] for r in read_witness(ran)) == sorted([run_id, second])
