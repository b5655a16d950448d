"""The boot checks of a node's data dir: the journal format check against pysyncobj's own
FileJournal, the directory lock, and the generated secret file."""

from __future__ import annotations

import os
import pickle
import stat
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FIRST_RECORD_OFFSET as PSO_FIRST_RECORD_OFFSET
from pysyncobj.journal import FileJournal

from raftsched.core.errors import ConfigError, CorruptJournal, DataDirLocked
from raftsched.node.datadir import FIRST_RECORD_OFFSET, DataDirLock, check_journal
from raftsched.wire.secretfile import (
    candidate_secrets,
    cluster_id,
    load_or_create_secret,
    read_secret_file,
    register,
    unregister,
)
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(60)


def _journal(path: str, entries: list[tuple[bytes, int, int]], term: int | None = None) -> None:
    j = FileJournal(path)
    for cmd, idx, t in entries:
        j.add(cmd, idx, t)
    if term is not None:
        j.setCurrentTerm(term, None)
    j._destroy()


def _entries(n: int, first: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(os.urandom(i % 50), first + i, term + i // 3) for i in range(n)]


def test_layout_constants_match_pysyncobj() -> None:
    assert FIRST_RECORD_OFFSET == PSO_FIRST_RECORD_OFFSET


def test_a_missing_journal_is_a_new_node(tmp_path: Any) -> None:
    assert check_journal(str(tmp_path / "raft.journal")) == 0


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(0, 60), first=st.integers(1, 10**6), term=st.integers(0, 1000))
def test_journals_pysyncobj_writes_pass(tmp_path_factory: Any, n: int, first: int,
                                        term: int) -> None:
    path = str(tmp_path_factory.mktemp("j") / "raft.journal")
    entries = _entries(n, first, term)
    _journal(path, entries, term=(entries[-1][2] if entries else term) + 1)
    assert check_journal(path) == n


def test_a_compacted_and_truncated_journal_passes(tmp_path: Any) -> None:
    path = str(tmp_path / "raft.journal")
    j = FileJournal(path)
    for cmd, idx, t in _entries(30):
        j.add(cmd, idx, t)
    j.deleteEntriesTo(10)
    j.deleteEntriesFrom(15)
    j.setCurrentTerm(50, None)
    j._destroy()
    assert check_journal(path) == 15


def _bad(path: str, problem: str) -> CorruptJournal:
    with pytest.raises(CorruptJournal) as err:
        check_journal(path)
    assert problem in str(err.value) and path in str(err.value)
    return err.value


def test_each_kind_of_damage_is_named_with_its_offset(tmp_path: Any) -> None:
    path = str(tmp_path / "raft.journal")
    _journal(path, _entries(10), term=10)
    good = open(path, "rb").read()

    def write(data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    write(good[:20])
    _bad(path, "shorter than the header")
    write(b"X" * 40 + good[40:])
    _bad(path, "bad header name")
    end = struct.unpack_from("<I", good, 36)[0]
    write(good[:36] + struct.pack("<I", len(good) + 1) + good[40:])
    _bad(path, "outside")
    second = FIRST_RECORD_OFFSET + struct.unpack_from("<I", good, FIRST_RECORD_OFFSET)[0] + 8
    data = bytearray(good)
    struct.pack_into("<I", data, second, 10**6)
    write(bytes(data))
    assert _bad(path, "does not fit").offset == second
    data = bytearray(good)
    struct.pack_into("<Q", data, second + 4, 77)  # index
    write(bytes(data))
    assert _bad(path, "follows").offset == second
    data = bytearray(good)
    struct.pack_into("<Q", data, second + 12, 13990913564861476515)  # term
    write(bytes(data))
    _bad(path, "term")
    write(good[:end - 4] + b"\xff\xff" + good[end - 2:])
    _bad(path, "trailer")
    write(good)
    assert check_journal(path) == 10


def test_terms_beyond_the_meta_term_are_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "raft.journal")
    _journal(path, _entries(10), term=2)  # entries reach term 4
    _bad(path, "beyond the current term 2")


def test_a_meta_file_that_would_run_code_is_refused_without_running_it(tmp_path: Any) -> None:
    path = str(tmp_path / "raft.journal")
    _journal(path, _entries(3), term=5)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> Any:
            return (open, (str(marker), "w"))

    with open(path + ".meta", "wb") as f:
        f.write(pickle.dumps({"currentTerm": Payload()}))
    with pytest.raises(CorruptJournal, match="unreadable meta") as err:
        check_journal(path)
    assert err.value.path == path + ".meta"
    assert not marker.exists()


def test_the_data_dir_lock_is_exclusive_and_names_the_holder(tmp_path: Any) -> None:
    first = DataDirLock(str(tmp_path))
    with pytest.raises(DataDirLocked) as err:
        DataDirLock(str(tmp_path))  # flock is per open file: refused in-process too
    assert err.value.pid == os.getpid() and str(tmp_path) in str(err.value)
    first.release()
    DataDirLock(str(tmp_path)).release()


def test_the_generated_secret_is_private_stable_and_shared(tmp_path: Any) -> None:
    secret, path = load_or_create_secret(str(tmp_path / "data"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(secret) >= 32
    assert load_or_create_secret(str(tmp_path / "data")) == (secret, path)
    assert cluster_id(secret) == cluster_id(secret) != cluster_id(secret + "x")
    assert secret not in cluster_id(secret)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="mode 0600"):
        read_secret_file(path)
    os.chmod(path, 0o600)


def test_clients_find_a_secret_through_the_address_pointer_only(tmp_path: Any) -> None:
    env = {"RAFTSCHED_RUNTIME_DIR": str(tmp_path / "rt")}
    secret, path = load_or_create_secret(str(tmp_path / "data"))
    assert candidate_secrets("127.0.0.1:7101", env) == []
    pointer = register("127.0.0.1:7101", path, env)
    assert stat.S_IMODE(os.stat(tmp_path / "rt").st_mode) == 0o700
    assert secret not in open(pointer).read()
    assert candidate_secrets("127.0.0.1:7101", env) == [secret]
    assert candidate_secrets("localhost:7101", env) == [secret]
    assert candidate_secrets("127.0.0.1:7102", env) == []
    unregister(pointer, str(tmp_path / "other-secret"))  # not ours: kept
    assert os.path.exists(pointer)
    unregister(pointer, path)
    assert candidate_secrets("127.0.0.1:7101", env) == []
    # A pointer directory other users may write is never trusted.
    register("127.0.0.1:7101", path, env)
    os.chmod(tmp_path / "rt", 0o777)
    assert candidate_secrets("127.0.0.1:7101", env) == []


def test_a_forked_child_never_keeps_the_directory_locked(tmp_path: Any) -> None:
    """pysyncobj forks a snapshot writer; released by the node, the lock must be free
    even while that child still runs."""
    lock = DataDirLock(str(tmp_path))
    pid = os.fork()
    if pid == 0:  # the child: outlive the parent's release for a while
        import time
        time.sleep(60)  # killed below; long enough to outlive a slow lock wait
        os._exit(0)
    try:
        lock.release()
        # (the child closes its copy in its at-fork hook, a moment after the fork; on a
        # loaded machine the child may get its first time slice late, hence 20 s)
        DataDirLock(str(tmp_path), wait_s=20).release()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_a_compacted_journal_needs_its_snapshot_and_a_damaged_snapshot_is_refused(
        tmp_path: Any) -> None:
    import gzip

    from raftsched.node.datadir import check_node_files

    journal, dump = tmp_path / "raft.journal", tmp_path / "raft.dump"
    _journal(str(journal), _entries(5, first=1), term=5)
    check_node_files(str(tmp_path), "raft.journal", "raft.dump")  # no snapshot yet: fine
    _journal(str(journal), [], term=5)
    journal.unlink()
    _journal(str(journal), _entries(5, first=100), term=5)  # compacted: starts at 100
    with pytest.raises(CorruptJournal, match="snapshot .* is missing"):
        check_node_files(str(tmp_path), "raft.journal", "raft.dump")
    with gzip.open(dump, "wb") as f:
        f.write(os.urandom(100_000))
    check_node_files(str(tmp_path), "raft.journal", "raft.dump")
    good = dump.read_bytes()
    for damaged in (good[:len(good) // 2], good[:200] + b"\0" * 50 + good[250:]):
        dump.write_bytes(damaged)
        with pytest.raises(CorruptJournal, match="damaged snapshot") as err:
            check_node_files(str(tmp_path), "raft.journal", "raft.dump")
        assert err.value.path == str(dump)


def test_journals_after_the_adapter_s_prefix_move_pass(tmp_path: Any) -> None:
    from raftsched.node.replica.compat import drop_journal_prefix

    path = str(tmp_path / "raft.journal")
    j = FileJournal(path)
    for cmd, idx, t in _entries(200):
        j.add(cmd, idx, t)
    assert drop_journal_prefix(j, 150)
    j.add(b"after", 201, 80)
    j.setCurrentTerm(80, None)
    j._destroy()
    assert check_journal(path) == 51
