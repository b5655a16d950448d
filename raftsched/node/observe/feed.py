"""A node's live feed: what its HTTP event streams (the dashboard's feed) carry.

Every node applies every committed effect, so any node's feed shows the whole cluster
(:func:`raftsched.node.observe.events.feed_event` says which effects, and how). A node also
feeds its own news that nothing committed can carry: a lost quorum commits nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from raftsched.core.effects import Effect
from raftsched.node.observe import events
from raftsched.node.observe.clock import now_ms

log = logging.getLogger("raftsched.node")

Subscriber = Callable[[dict[str, Any]], None]


class LiveFeed:
    """The subscribers of one node's feed; every method runs on the node's event loop."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._subscribers: set[Subscriber] = set()
        self._seq = 0

    def __bool__(self) -> bool:
        """Whether anyone listens (an effect is not even formatted otherwise)."""
        return bool(self._subscribers)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event_dict)`` (must not block) for every event from now on;
        returns the function that unsubscribes."""
        self._subscribers.add(callback)
        return lambda: self._subscribers.discard(callback)

    def effect(self, eff: Effect) -> None:
        self._seq += 1
        ev = events.feed_event(eff, node=self.node_id, seq=self._seq, ts_ms=now_ms())
        if ev is not None:
            self._send(ev)

    def own(self, event: str, fields: dict[str, Any]) -> None:
        """This node's own news (``quorum.lost``, ``quorum.back``)."""
        self._seq += 1
        self._send({"seq": self._seq, "ts_ms": now_ms(), "event": event,
                    "node": self.node_id, **fields})

    def _send(self, ev: dict[str, Any]) -> None:
        for callback in list(self._subscribers):
            try:
                callback(ev)
            except Exception:  # noqa: BLE001 - one bad subscriber must not stop the node
                log.exception("feed subscriber failed")


__all__ = ["LiveFeed"]
