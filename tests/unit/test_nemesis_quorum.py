"""The nemesis report's attribution of unavailability (``tests/nemesis/quorum.py``): a
window counts from when a majority could answer again only if the faults themselves
left no running node reaching a majority; every other window counts whole."""

from __future__ import annotations

import math

import pytest

from tests.nemesis import quorum

pytestmark = pytest.mark.timeout(30)

N3 = ["n1", "n2", "n3"]
N5 = ["n1", "n2", "n3", "n4", "n5"]


@pytest.mark.parametrize(("nodes", "down", "cut", "majority"), [
    (N3, set(), set(), True),
    (N3, {"n1"}, set(), True),                      # one of three down: two remain
    (N3, {"n1", "n2"}, set(), False),               # a power cut of two
    (N3, {"n2"}, quorum.cuts("isolate_leader", ["n1"], N3), False),  # frozen + isolated
    (N3, set(), quorum.cuts("split", [["n1"], ["n2", "n3"]], N3), True),
    (N3, {"n2"}, quorum.cuts("one_way", ["n1", "n3"], N3), False),
    # A bridge: n2 reaches both sides although they cannot reach each other.
    (N3, set(), quorum.cuts("bridge", [["n1"], "n2", ["n3"]], N3), True),
    (N5, set(), quorum.cuts("bridge", [["n1", "n2"], "n3", ["n4", "n5"]], N5), True),
    (N5, {"n3"}, quorum.cuts("bridge", [["n1", "n2"], "n3", ["n4", "n5"]], N5), False),
    (N5, {"n1", "n2"}, set(), True),
])
def test_a_majority_is_a_running_node_that_reaches_more_than_half(
        nodes: list[str], down: set[str], cut: set[frozenset[str]], majority: bool) -> None:
    assert quorum.has_majority(nodes, down, cut) is majority


def test_overlapping_faults_leave_no_majority_only_while_both_hold() -> None:
    faults = [("freeze", ["n2"], 10.0, 16.0),
              ("isolate_leader", ["n3"], 12.0, 14.0),   # with n2 frozen: n1 alone
              ("slow", ["n1", "n2", "n3"], 11.0, 20.0),  # slows, cuts nothing
              ("clock", ["n1"], 0.0, 30.0),
              ("power_cut", ["n1", "n2"], 40.0, 42.5),
              ("kill", ["n1"], 42.0, 45.0),             # overlaps the cut: one gap
              ("restart_all", N3, 60.0, 0.0)]           # never healed
    assert quorum.no_majority(N3, faults) == [(12.0, 14.0), (40.0, 42.5), (60.0, math.inf)]


def test_a_window_overlapping_no_majority_counts_from_when_one_could_answer() -> None:
    gaps = [(12.0, 14.0), (40.0, 42.5), (60.0, math.inf)]
    windows = [(11.5, 4.0),    # 11.5-15.5: a majority again at 14, answered 1.5 s later
               (30.0, 1.5),    # an election with a majority all along: whole
               (41.0, 1.0),    # ended before the majority was back: nothing of it counts
               (61.0, 3.0)]    # never a majority again: whole
    assert quorum.attribute(windows, gaps) == {
        "no_majority": [(11.5, 1.5), (41.0, 0.0), (61.0, 3.0)],
        "other": [(30.0, 1.5)]}
