"""Issue 27 item 2 on real processes: a follower SIGSTOPped for 5 s, ten times, under
20 every-second jobs, never deposes the working leader (pre-vote, Raft thesis §9.6).

Before pre-vote the same pause, five times, moved a 3-node cluster from term 1 to 17:
a follower that wakes from a pause has passed its election timeout and campaigns
with a higher term before it reads the leader's waiting appends. The in-process test
(:mod:`test_prevote`) pauses a replica exactly and also shows the failure with
pre-vote off; this one pauses a real node process and reads the term every node
reports, and that the jobs ran all along. With ``RAFTSCHED_PREVOTE=0`` in the
environment (the nodes inherit it) it fails at the first pause (term 1 -> 2 or 3).

The nodes use election timeouts of 1-2 s, as the in-process test does, so that the
only thing that can move the term is the pause: with the defaults (200-600 ms) a
loaded CI host that does not run the leader for a few hundred milliseconds causes
an election of its own, which pre-vote does not claim to prevent (the leader really
was silent).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

PAUSES = 10
PAUSE_S = 5.0


def _terms(c: Any) -> dict[str, int]:
    out = {}
    for nid in c.ids:
        try:
            out[nid] = int(c.status(nid, timeout=5)["term"])
        except Exception:  # noqa: BLE001 - a node not answering right now: asked again
            continue
    return out


def test_ten_five_second_pauses_of_a_follower_change_no_term(cluster_factory) -> None:
    c = cluster_factory(3, timing={"election_timeout_min": "1s",
                                   "election_timeout_max": "2s",
                                   "connection_timeout": "2s"})
    c.start_all()
    leader = c.wait_leader(30)
    with c.client(timeout=30) as cl:
        cl.put_jobs([{"id": f"tick{i:02d}", "schedule": {"every": "1s"},
                      "command": ["true"]} for i in range(20)])
    term0 = c.status(leader)["term"]
    follower = next(n for n in c.ids if n != leader)
    for k in range(PAUSES):
        c.signal(follower, signal.SIGSTOP)
        time.sleep(PAUSE_S)  # the fault itself: a pause of exactly this long
        c.signal(follower, signal.SIGCONT)
        # Back and caught up: it answers and reports the leader's term.
        deadline = time.monotonic() + 20
        while True:
            terms = _terms(c)
            if len(terms) == 3 and len(set(terms.values())) == 1:
                break
            assert time.monotonic() < deadline, f"pause {k + 1}: nodes report {terms}"
            time.sleep(0.1)
        assert set(terms.values()) == {term0}, \
            f"pause {k + 1} of {PAUSES}: term {term0} -> {terms}"
        assert c.wait_leader(10) == leader
    # The jobs ran all along (on the two live nodes while the follower was stopped).
    with c.client(timeout=30) as cl:
        runs = cl.runs("tick00", limit=200)["runs"]
    ok = [r for r in runs if r["state"] == "succeeded"]
    assert len(ok) >= PAUSES * PAUSE_S * 0.8, f"{len(ok)} succeeded runs of tick00"
