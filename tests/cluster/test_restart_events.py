"""A node that starts again replays its journal: every leadership record since the last
snapshot is applied once more, in the same millisecond. Those were written to the log
and the live feed as ``leader.changed`` events, so a restarted cluster seemed to change
leader three or four times before its one real election. A record of a term older than
the node's own is history, not news: it is not an event."""

from __future__ import annotations

import pytest

from tests.support.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _leader_events(c, nid: str, skip: int) -> list[dict]:
    return [e for e in c.events(nid)[skip:] if e.get("event") == "leader.changed"]


def test_a_restarted_node_does_not_announce_the_leaders_of_past_terms(cluster_factory):
    c = cluster_factory(3)
    c.start_all()
    c.wait_leader(30)
    # A second leadership record in the journal, of a later term: a restart elects anew.
    c.terminate_all(15)
    c.start_all()
    c.wait_leader(30)
    wait_until(lambda: min(c.status(n)["term"] for n in c.ids) >= 2, 30, "a second term")
    before = max(c.status(n)["term"] for n in c.ids)
    c.terminate_all(15)
    seen = {n: len(c.events(n)) for n in c.ids}

    c.start_all()
    c.wait_leader(30)
    after = {n: c.status(n)["term"] for n in c.ids}
    wait_until(lambda: all(any(e["term"] >= after[n] for e in _leader_events(c, n, seen[n]))
                           for n in c.ids), 30, "every node announcing the leader it follows")
    for n in c.ids:
        terms = [e["term"] for e in _leader_events(c, n, seen[n])]
        # At most the last record of the term the node stopped in, then the new ones.
        assert all(t >= before for t in terms), (n, before, terms)
