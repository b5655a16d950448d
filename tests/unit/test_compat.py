"""pysyncobj's internals that raftsched patches are checked before a node starts: a
rename in another release must fail loudly, never silently disable a patch."""

from __future__ import annotations

import pytest

from raftsched.node.replica import compat, prevote, raftsync


def test_the_installed_pysyncobj_is_the_pinned_one_with_every_patched_internal() -> None:
    compat.verify()
    compat.install()
    compat.install()  # idempotent


def test_another_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "VERSION", "0.3.18")
    with pytest.raises(compat.IncompatiblePysyncobj, match="needs pysyncobj 0.3.17"):
        compat.verify()


def test_a_renamed_private_method_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(compat.SyncObj, "_SyncObj__deleteEntriesFrom")
    with pytest.raises(compat.IncompatiblePysyncobj, match="_SyncObj__deleteEntriesFrom"):
        compat.verify()


def test_a_renamed_instance_attribute_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "_INSTANCE_ATTRS",
                        ((compat.SyncObj.__init__, ("_SyncObj__renamedLog",)),))
    with pytest.raises(compat.IncompatiblePysyncobj, match="_SyncObj__renamedLog"):
        compat.verify()


def test_the_log_safety_override_is_what_pysyncobj_calls() -> None:
    """Name mangling: an override only takes effect under the exact mangled name."""
    for name in ("_SyncObj__onMessageReceived", "_SyncObj__deleteEntriesFrom",
                 "_SyncObj__deleteEntriesTo", "_checkCommandsToApply",
                 "_SyncObj__applyLogEntries", "_doDestroy"):
        assert name in vars(raftsync.RaftSyncObj), name
        assert hasattr(compat.SyncObj, name), name
    # Pre-vote gates the deadline pysyncobj's tick reads, under its mangled name.
    assert isinstance(vars(prevote.PreVoteSyncObj)["_SyncObj__raftElectionDeadline"], property)
    assert issubclass(raftsync.RaftSyncObj, prevote.PreVoteSyncObj)


def test_only_the_raft_adapter_compat_and_its_journal_layer_import_pysyncobj() -> None:
    """raftsync.py and prevote.py are the patched SyncObj, durable.py its journal half
    (group commit subclasses FileJournal); the attributes they name are in compat's
    checked list."""
    import ast
    from pathlib import Path

    pkg = Path(compat.__file__).resolve().parents[2]
    importers = set()
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "pysyncobj" for n in names):
                importers.add(str(path.relative_to(pkg)))
    assert importers <= {"node/replica/raft.py", "node/replica/compat.py",
                         "node/replica/raftsync.py", "node/replica/prevote.py",
                         "node/replica/durable.py"}, importers
