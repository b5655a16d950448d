"""The backup file's envelope (node/service/backupfile.py): what it checks before a restore."""

from __future__ import annotations

import pytest

from raftsched.core.codec import encode_state
from raftsched.core.errors import CorruptBackup
from raftsched.core.machine import ClusterState
from raftsched.node.service.backupfile import decode_backup, encode_backup, read_header, seed_state


def backup() -> bytes:
    st = ClusterState()
    st.apply_map({"op": "put_job", "at": 1, "spec": {"id": "a", "schedule": {"every": "1s"},
                                                  "command": ["true"]}})
    st.apply_map({"op": "member", "action": "seed", "at": 2,
              "members": [{"node": "n1", "raft": "h:1", "api": "h:2"}]})
    return encode_backup(encode_state(st), cluster_id="c1", index=42, term=3, time_ms=5,
                         node="n1")


def test_round_trip_and_header():
    header, st = decode_backup(backup(), "f")
    assert (header["index"], header["term"], header["cluster_id"], header["node"]) == \
        (42, 3, "c1", "n1")
    assert list(st.jobs) == ["a"] and list(st.members) == ["n1"]
    seeded = seed_state(st)
    assert seeded.members == {} and seeded.leader.term == 0 and list(seeded.jobs) == ["a"]


@pytest.mark.parametrize(("mangle", "message"), [
    (lambda b: b[:-1], "truncated or damaged"),
    (lambda b: b[:20], "header line does not end"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
    (lambda b: b"x" + b, "not a raftsched backup"),
    (lambda b: b.replace(b'"format": 1', b'"format": 2'), "newer raftsched"),
    (lambda b: b.replace(b'"size"', b'"sizf"'), "header lacks"),
])
def test_damage_is_refused_naming_it(mangle, message):
    with pytest.raises(CorruptBackup, match=message) as info:
        read_header(mangle(backup()), "f.bak")
    assert str(info.value).startswith("f.bak: ") and "nothing was restored" in str(info.value)
