"""Node._on_effects when handling one effect fails: the effects after it were not
handed on, so the worker looks at every claim and both loops are woken at once (a
claim must not wait for the worker's safety-net poll)."""

from __future__ import annotations

from typing import Any

import pytest

from raftsched.core.effects import RunStarted
from raftsched.node.node import Node


class _Claims:
    def __init__(self) -> None:
        self.noted: list[Any] = []
        self.all = 0

    def note(self, eff: Any, held: Any) -> None:
        self.noted.append(eff)

    def look_at_all(self) -> None:
        self.all += 1


class _Loop:
    def __init__(self) -> None:
        self.claims = _Claims()
        self.local: dict[str, Any] = {}
        self.woken = 0
        self.active = False

    def notify(self) -> None:
        self.woken += 1

    def wake(self) -> None:
        self.woken += 1


class _Metrics:
    def effect(self, eff: Any) -> None:
        raise RuntimeError("a metrics bug")


class _Node:
    """The attributes Node._on_effects reads, nothing else."""

    def __init__(self) -> None:
        self._said_stopped = False
        self.node_id = "n1"
        self.worker = _Loop()
        self.leader = _Loop()
        self.metrics = _Metrics()
        self.feed = None


def test_a_failed_effect_makes_the_worker_look_at_every_claim_and_wakes_both_loops() -> None:
    node = _Node()
    # RunStarted wakes neither loop by itself: only the failure can.
    effects = [RunStarted(run_id="j@1", node="n1", fence=1),
               RunStarted(run_id="j@2", node="n1", fence=2)]
    with pytest.raises(RuntimeError, match="a metrics bug"):
        Node._on_effects(node, effects)  # type: ignore[arg-type]
    assert node.worker.claims.noted == effects[:1]  # the second was never handed on
    assert node.worker.claims.all == 1
    assert node.worker.woken == 1 and node.leader.woken == 1
