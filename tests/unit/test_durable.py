"""Group commit's journal layer (raftsched.node.replica.durable) on a real pysyncobj journal
file: what is unsynced, when answers leave, and the renames that survive a power cut."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pysyncobj import serializer
from pysyncobj.journal import FileJournal

from raftsched.node.replica import durable
from raftsched.node.replica.durable import DurableSender, adopt, durable_replace

pytestmark = pytest.mark.timeout(30)


class _Transport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: str, message: dict[str, Any]) -> bool:
        self.sent.append((node, message))
        return True


def _answer(idx: int) -> dict[str, Any]:
    return {"type": "next_node_idx", "next_node_idx": idx + 1, "reset": False, "success": True}


def _journal(tmp_path: Any, sync: bool) -> Any:
    journal = adopt(FileJournal(str(tmp_path / "raft.journal")), sync=sync)
    assert journal is not None
    return journal


def _settle(journal: Any, sender: DurableSender) -> None:
    """Tick until the sync asked for is taken in (the worker syncs in its thread)."""
    for _ in range(200):
        sender.flush()
        journal.rs_worker.wait_idle()
        if not journal.rs_worker.busy() and not journal.rs_dirty:
            sender.flush()
            return
    raise AssertionError("the sync worker never finished")


def test_the_journal_overrides_are_what_pysyncobj_calls() -> None:
    """FileJournal calls ``self.__setLastRecordOffset`` at every change: the override
    under its mangled name is what marks the journal dirty."""
    for name in ("_FileJournal__setLastRecordOffset", "setCurrentTerm", "add", "clear",
                 "deleteEntriesFrom"):
        assert name in vars(durable.DurableJournal) and hasattr(FileJournal, name), name


def test_answers_to_appends_wait_for_one_sync_that_covers_them(tmp_path) -> None:
    journal = _journal(tmp_path, sync=True)
    transport = _Transport()
    sender = DurableSender(transport, journal)
    for idx in (1, 2, 3):
        journal.add(b"cmd", idx, 1)
        transport.send("leader", _answer(idx))  # through the wrapper: held, unsynced
    assert transport.sent == [] and journal.rs_dirty
    sender.flush()  # asks the worker; nothing is covered yet
    assert transport.sent == []
    _settle(journal, sender)
    assert [m["next_node_idx"] for _, m in transport.sent] == [2, 3, 4]
    assert journal.rs_worker.syncs == 1 and journal.rs_synced_index == 3
    # Clean: an answer leaves at once, with no sync.
    transport.send("leader", _answer(3))
    assert len(transport.sent) == 4 and journal.rs_worker.syncs == 1
    journal.rs_worker.close()


def test_other_messages_leave_at_once_and_the_held_answers_keep_their_order(tmp_path) -> None:
    journal = _journal(tmp_path, sync=True)
    transport = _Transport()
    sender = DurableSender(transport, journal)
    journal.add(b"cmd", 1, 1)
    transport.send("leader", _answer(1))
    # A leader's append need not wait for its own sync (it counts itself only later).
    transport.send("n3", {"type": "append_entries", "entries": []})
    assert [m["type"] for _, m in transport.sent] == ["append_entries"]
    _settle(journal, sender)
    journal.add(b"cmd", 2, 1)
    transport.send("leader", _answer(2))  # written since: waits for its own sync
    assert len(transport.sent) == 2
    _settle(journal, sender)
    assert [m["type"] for _, m in transport.sent] == ["append_entries", "next_node_idx",
                                                     "next_node_idx"]
    journal.rs_worker.close()


def test_a_truncation_during_a_sync_caps_what_that_sync_covers(tmp_path) -> None:
    journal = _journal(tmp_path, sync=True)
    transport = _Transport()
    sender = DurableSender(transport, journal)
    for idx in (1, 2, 3):
        journal.add(b"cmd", idx, 1)
    sender.flush()  # a sync of entries 1-3 in flight
    journal.deleteEntriesFrom(1)  # entries 2 and 3 replaced while it runs
    journal.add(b"new", 2, 2)
    journal.rs_worker.wait_idle()
    sender.flush()
    assert journal.rs_synced_index == 1  # not 3: the new entry 2 is not covered yet
    _settle(journal, sender)
    assert journal.rs_synced_index == 2
    journal.rs_worker.close()


def test_truncations_and_clears_count_as_unsynced_writes(tmp_path) -> None:
    journal = _journal(tmp_path, sync=True)
    for idx in (1, 2, 3):
        journal.add(b"cmd", idx, 1)
    journal.rs_sync()
    journal.deleteEntriesFrom(2)
    assert journal.rs_dirty and journal.rs_synced_index == 2
    journal.rs_sync()
    journal.clear()
    assert journal.rs_dirty and journal.rs_synced_index == 0
    journal.rs_worker.close()


def test_none_never_syncs_nor_holds_an_answer(tmp_path) -> None:
    journal = _journal(tmp_path, sync=False)
    transport = _Transport()
    sender = DurableSender(transport, journal)
    journal.add(b"cmd", 1, 1)
    transport.send("leader", _answer(1))
    sender.flush()
    assert len(transport.sent) == 1 and journal.rs_worker is None
    assert journal.rs_stats().mode == "none" and journal.rs_stats().syncs == 0


def test_a_synced_journal_reads_back_what_it_held(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    journal = adopt(FileJournal(path), sync=True)
    assert journal is not None
    for idx in (1, 2):
        journal.add(b"x" * idx, idx, 1)
    journal.setCurrentTerm(4, "n2")  # the meta file, synced and renamed
    journal.rs_sync()
    journal._destroy()
    again = FileJournal(path)
    assert [again[i][1] for i in range(len(again))] == [1, 2]
    assert again.getCurrentTerm() == 4 and again.getVotedForNodeId() == "n2"


def test_snapshots_are_renamed_into_place_durably(tmp_path) -> None:
    durable.install_durable_snapshots()
    assert serializer.atomicReplace is durable_replace
    tmp, final = tmp_path / "dump.tmp", tmp_path / "dump"
    tmp.write_bytes(b"snapshot")
    durable_replace(str(tmp), str(final))
    assert final.read_bytes() == b"snapshot" and not os.path.exists(tmp)


def test_snapshots_are_written_by_pysyncobj_at_the_fast_gzip_level_and_read_back(
        tmp_path) -> None:
    """pysyncobj's own serializer writes the snapshot (gzip level 9 by default: 1 s of
    CPU for a W1 storm's state, taken from a busy host); here it writes at level 1, and
    reads it back the same."""
    import gzip

    durable.install_durable_snapshots()
    path = str(tmp_path / "raft.dump")
    payload = ({"state": bytes(range(256)) * 4000}, ("e", 7, 1), ("e", 6, 1), set())
    s = serializer.Serializer(path, None, tryUseFork=False, serializer=None,
                              deserializer=None, serializeChecker=None)
    s.serialize(payload, 7)
    with open(path, "rb") as f:
        header = f.read(10)
    assert header[:2] == b"\x1f\x8b" and header[8] == 4, header  # XFL 4: fastest level
    assert s.deserialize() == payload
    # gzip itself is untouched for everyone else: its default is still level 9 (XFL 2).
    assert gzip.compress(b"x")[8] == 2
