"""When did the nemesis itself leave the cluster with no majority a leader could reach?

Raft answers only while some running node reaches a majority of the members (itself
included) over links that carry messages both ways. The nemesis takes that away on
purpose: it kills, stops or freezes nodes, cuts links (a split, a bridge, a one-way
drop, an isolated leader), and two or three faults at once can leave no such node. A
window without an answer that overlaps such a time says nothing about elections until
the majority is back; from then on it is the cluster's own time to answer.

Faults arrive as ``(kind, targets, start, healed)`` with the targets as the nemesis
logs them (``healed`` 0: never healed). Kinds that slow, drop a share of packets or
step clocks leave every node running and every link up: they count here as nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import Any

#: Faults whose targets run nothing for their hold (killed, SIGSTOPped, frozen).
DOWN = frozenset({"kill", "kill_host", "stop", "freeze", "power_cut", "restart_all"})

Fault = tuple[str, Any, float, float]


def _names(x: Any) -> list[str]:
    return [x] if isinstance(x, str) else [str(n) for n in x]


def cuts(kind: str, targets: Any, nodes: Sequence[str]) -> set[frozenset[str]]:
    """The node pairs that cannot talk while a fault of ``kind`` holds."""
    if kind == "isolate_leader":
        return {frozenset((t, n)) for t in _names(targets) for n in nodes if n != t}
    if kind == "split":
        groups = [_names(g) for g in targets]
        return {frozenset((a, b)) for g, h in combinations(groups, 2) for a in g for b in h}
    if kind == "bridge":  # [[one side], the bridge node, [other side]]: the sides cut
        left, right = _names(targets[0]), _names(targets[-1])
        return {frozenset((a, b)) for a in left for b in right}
    if kind == "one_way":  # a drop one way breaks the pair's connections both ways
        a, b = _names(targets)[:2]
        return {frozenset((a, b))}
    return set()


def has_majority(nodes: Sequence[str], down: set[str], cut: set[frozenset[str]]) -> bool:
    """Does some running node reach a majority of ``nodes``, itself included?"""
    up = [n for n in nodes if n not in down]
    for v in up:
        reach = 1 + sum(1 for u in up if u != v and frozenset((u, v)) not in cut)
        if reach * 2 > len(nodes):
            return True
    return False


def no_majority(nodes: Sequence[str], faults: Iterable[Fault]) -> list[tuple[float, float]]:
    """The intervals ``(start, end)``, merged, in which the faults holding left no
    running node that reached a majority."""
    held = [(k, t, s, h if h else math.inf) for k, t, s, h in faults]
    edges = sorted({x for _, _, s, h in held for x in (s, h) if x != math.inf})
    out: list[tuple[float, float]] = []
    for a, b in zip(edges, [*edges[1:], math.inf], strict=True):
        down: set[str] = set()
        cut: set[frozenset[str]] = set()
        for kind, targets, s, h in held:
            if s <= a < h:
                if kind in DOWN:
                    down.update(_names(targets))
                else:
                    cut |= cuts(kind, targets, nodes)
        if not has_majority(nodes, down, cut):
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
    return out


def attribute(windows: Iterable[tuple[float, float]], gaps: list[tuple[float, float]]
              ) -> dict[str, list[tuple[float, float]]]:
    """Split the unavailability ``windows`` (start, length): ``no_majority`` windows
    overlap a gap of :func:`no_majority` and are given as (start, seconds from the end
    of the last gap they overlap to their own end: the cluster's time to answer once a
    majority could); ``other`` windows are everything else, whole."""
    out: dict[str, list[tuple[float, float]]] = {"no_majority": [], "other": []}
    for start, width in windows:
        end = start + width
        over = [g_end for g_start, g_end in gaps if g_start < end and g_end > start]
        if over:
            back = max(over)
            out["no_majority"].append((start, width if back == math.inf
                                       else max(0.0, end - max(start, back))))
        else:
            out["other"].append((start, width))
    return out
