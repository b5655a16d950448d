"""Which node is at which Raft address: the node's one map, both ways."""

from __future__ import annotations

from collections.abc import Iterable


class AddressBook(dict[str, str]):
    """Raft address -> node id (a dict: ``get``, ``items``, ``update`` as usual), and
    :meth:`raft_of` for the other way. One per node: the process root builds it from the
    config file, and the membership refresh adds the replicated members' names to it in
    place, so every part that holds it sees them."""

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> AddressBook:
        """From ``(node id, raft address)`` pairs (the config file's nodes)."""
        return cls((raft, node_id) for node_id, raft in pairs)

    def node_of(self, raft: str | None) -> str | None:
        """The node id at Raft address ``raft`` (None: unknown, or no address)."""
        return self.get(raft) if raft else None

    def raft_of(self, node_id: str) -> str | None:
        """The Raft address of ``node_id`` (None: not a node this map knows)."""
        return next((addr for addr, nid in self.items() if nid == node_id), None)


__all__ = ["AddressBook"]
