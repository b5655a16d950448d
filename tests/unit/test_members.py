"""The replicated membership (core/members.py): seeded once from the config, changed
one node at a time, removed ids never reused and never given work again."""

from __future__ import annotations

from raftsched.core.codec import decode_state, encode_state
from raftsched.core.machine import ClusterState

SEED = [{"node": f"n{i}", "raft": f"127.0.0.1:700{i}", "api": f"127.0.0.1:710{i}"}
        for i in (1, 2, 3)]


def member(st, action, node, raft="127.0.0.1:7004", api="127.0.0.1:7104", at=10):
    return st.apply_map({"op": "member", "action": action, "node": node, "raft": raft, "api": api,
                     "at": at})


def seeded() -> ClusterState:
    st = ClusterState()
    assert st.apply_map({"op": "member", "action": "seed", "members": SEED, "at": 1})["seeded"]
    return st


def test_seed_applies_once_and_add_needs_it():
    st = ClusterState()
    assert member(st, "add", "n4")["error"]["code"] == "conflict"
    st = seeded()
    again = st.apply_map({"op": "member", "action": "seed", "members": SEED[:1], "at": 2})
    assert again == {"ok": True, "seeded": False, "members": 3}
    assert sorted(st.members) == ["n1", "n2", "n3"]


def test_add_is_idempotent_and_refuses_taken_addresses():
    st = seeded()
    assert member(st, "add", "n4")["status"] == "active"
    assert member(st, "add", "n4")["ok"]  # the same again: nothing changes
    assert "already a member" in member(st, "add", "n4", api="x:1")["error"]["message"]
    assert "member n1's" in member(st, "add", "n5", raft="127.0.0.1:7001",
                                   api="127.0.0.1:7105")["error"]["message"]
    bad = st.apply_map({"op": "member", "action": "add", "node": "../x", "raft": "a:1",
                    "api": "b:1", "at": 1})
    assert bad["error"]["code"] == "invalid_argument" and "member.node" in \
        bad["error"]["message"]


def test_remove_releases_its_runs_refuses_its_heartbeats_and_never_reuses_the_id():
    st = seeded()
    hb = {"op": "heartbeat", "node": "n3", "boot": 1, "slots": 2, "queue": 0, "tags": [],
          "api": "127.0.0.1:7103", "at": 5}
    assert st.apply_map(hb)["ok"]
    assert member(st, "remove", "n3", raft="127.0.0.1:7003", api="127.0.0.1:7103")["ok"]
    assert st.nodes["n3"].alive is False and st.nodes["n3"].draining is True
    refused = st.apply_map(dict(hb, at=6))
    assert refused["error"]["code"] == "conflict" and "removed" in refused["error"]["message"]
    assert st.nodes["n3"].alive is False
    assert "ids are not reused" in member(st, "add", "n3", raft="h:1",
                                          api="h:2")["error"]["message"]
    assert "already removed" in member(st, "remove", "n3")["error"]["message"]
    assert st.apply_map({"op": "transfer", "to": "n3", "at": 7})["error"]["code"] == "conflict"
    member(st, "remove", "n2", raft="127.0.0.1:7002", api="127.0.0.1:7102")
    assert "last member" in member(st, "remove", "n1", raft="127.0.0.1:7001",
                                   api="127.0.0.1:7101")["error"]["message"]


def test_membership_survives_a_snapshot_and_old_snapshots_have_none():
    st = seeded()
    member(st, "add", "n4")
    member(st, "remove", "n1", raft="127.0.0.1:7001", api="127.0.0.1:7101")
    back = decode_state(encode_state(st))
    assert {k: v.to_dict() for k, v in back.members.items()} == \
        {k: v.to_dict() for k, v in st.members.items()}
    assert decode_state(encode_state(ClusterState())).members == {}


def test_a_transfer_to_a_member_before_its_first_heartbeat_is_taken_and_unknown_ids_are_not():
    # Right after a cluster starts, a member's first heartbeat may not have committed
    # yet; an operator's transfer to it was refused as "not a node of the cluster".
    st = ClusterState()
    assert st.apply_map({"op": "transfer", "to": "n2", "at": 1})["error"]["code"] == \
        "invalid_argument"
    st = seeded()
    assert "n2" not in st.nodes
    assert st.apply_map({"op": "transfer", "to": "n2", "at": 2})["ok"]
    refused = st.apply_map({"op": "transfer", "to": "n9", "at": 3})
    assert refused["error"]["code"] == "invalid_argument" and "to" in refused["error"]["message"]
    member(st, "remove", "n2", raft="127.0.0.1:7002", api="127.0.0.1:7102", at=4)
    assert st.apply_map({"op": "transfer", "to": "n2", "at": 5})["error"]["code"] in \
        ("invalid_argument", "conflict")
