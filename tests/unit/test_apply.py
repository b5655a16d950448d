"""Declarative apply in the pure core (raftsched.core.apply) and the CLI's job-file
writer: unchanged jobs keep their version, a refused apply changes nothing, ``{keep =
true}`` keeps an env value, export's TOML reads back equal."""

from __future__ import annotations

import tomllib

import pytest

from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from raftsched.faces.cli_apply import exported, format_diff, toml_job
from tests.support.stateutil import T0, err, put, spec

pytestmark = pytest.mark.timeout(60)


def apply(st: ClusterState, specs, **kw):
    reply = st.apply_map({"op": "apply", "at": T0, "specs": specs, **kw})
    assert reply["ok"], reply
    return reply


def test_unchanged_jobs_keep_their_version_and_changes_are_one_command():
    st = ClusterState()
    put(st, "a")
    put(st, "b", env={"K": "v1"}, paused=True)
    reply = apply(st, [spec("a"), spec("b", env={"K": {"keep": True}}, paused=False)])
    assert reply == {"ok": True, "results": [], "unchanged": 2}
    assert st.jobs["a"].version == 1 and st.jobs["b"].version == 1
    assert st.jobs["b"].spec.paused  # an update keeps the paused state (pause/resume)
    reply = apply(st, [spec("a", timeout="5m"), spec("c")], prune=True)
    assert reply["results"] == [["update", "a", 2], ["create", "c", 1], ["remove", "b", 1]]
    assert sorted(st.jobs) == ["a", "c"]


def test_a_refused_apply_changes_nothing():
    st = ClusterState()
    put(st, "a")
    put(st, "b", env={"K": "v1"})
    base = {"op": "apply", "at": T0}
    err(st, dict(base, specs=[spec("a", timeout="5m"), spec("x", overlap="sometimes")]),
        "invalid_spec")
    reply = err(st, dict(base, specs=[spec("a", timeout="5m"), spec("a")]), "invalid_spec")
    assert "specs[1].id" in reply["error"]["message"]
    reply = err(st, dict(base, specs=[spec("b", env={"L": {"keep": True}})]))
    assert reply["error"]["message"].startswith("specs[0].env.L: {keep = true}")
    err(st, dict(base, specs=[spec("n", env={"K": {"keep": True}})]), "invalid_spec")
    err(st, dict(base, specs=[spec("a", timeout="5m")], expect={"a": 7}), "conflict")
    err(st, dict(base, specs=[spec("c"), spec("d")], max_jobs=3), "limit_exceeded")
    err(st, dict(base, specs=[spec("a")], prune="yes"), "invalid_argument")
    reply = apply(st, [spec("a", timeout="5m"), spec("b", env={"K": {"keep": True}})],
                  expect={"a": 1, "b": 1})
    assert reply["results"] == [["update", "a", 2]]
    assert st.jobs["b"].spec.env == {"K": "v1"}


def test_export_writes_toml_that_reads_back_to_the_same_spec():
    full = JobSpec.from_spec({
        "id": "x.y-z", "schedule": {"cron": "0 3 * * *", "tz": "Europe/Berlin"},
        "command": ["printf", 'a\tb "c" \\ é \x7f\x01'], "timeout": "5m",
        "retries": {"max": 2}, "tags": ["b", "a"], "env": {"TOKEN": "s"}})
    shown = full.redacted()
    out = exported(shown)
    assert out["env"] == {"TOKEN": {"keep": True}} and "overlap" not in out
    back = tomllib.loads(toml_job(out))
    assert back == out
    back["env"] = {"TOKEN": "s"}
    assert JobSpec.from_spec(back) == full
    many = tomllib.loads("".join("[[jobs]]\n" + toml_job(exported(s.redacted())) for s in
                                 (full, JobSpec.from_spec(spec("q")))))
    assert [j["id"] for j in many["jobs"]] == ["x.y-z", "q"]


def test_format_diff_is_a_unified_diff_with_a_summary():
    text = format_diff({"changes": [
        {"action": "update", "job": "a", "fields": ["timeout"], "version": 3,
         "before": {"id": "a", "timeout": "1h"}, "after": {"id": "a", "timeout": "5m"}},
        {"action": "remove", "job": "b", "fields": [], "version": 1,
         "before": {"id": "b"}, "after": None}], "unchanged": ["c"]})
    lines = text.splitlines()
    assert lines[:3] == ["update a: timeout", "--- cluster/a (version 3)", "+++ files/a"]
    assert '-timeout = "1h"' in lines and '+timeout = "5m"' in lines and ' id = "a"' in lines
    assert "+++ /dev/null" in lines
    assert lines[-1] == "0 to create, 1 to update, 1 to remove, 1 unchanged"


def test_new_commands_wait_until_every_member_announces_them() -> None:
    """A member whose heartbeats do not list ``apply``/``notify`` (an older release, in
    a rolling upgrade) would refuse those commands and part from the others' state."""
    from types import SimpleNamespace

    from raftsched.core.cmdbase import FEATURES
    from raftsched.core.codec import decode_state, encode_state
    from raftsched.core.commands import Heartbeat
    from raftsched.core.errors import Conflict
    from raftsched.core.records import NodeRecord
    from raftsched.node.service.applyops import Features

    st = ClusterState()
    for nid, features in (("n1", FEATURES), ("n2", None)):
        assert st.apply(Heartbeat(at=T0, node=nid, boot=1, slots=1, queue=0,
                                  features=features))["ok"]
    # No replicated membership yet: the config's members are checked.
    gate = Features(raft=SimpleNamespace(read=lambda fn: fn(st)),  # type: ignore[arg-type]
                    config_ids=("n1", "n2"))
    check_features = gate.check
    with pytest.raises(Conflict, match="n2 run an older raftsched"):
        check_features("apply", {"specs": [spec("a")]})
    with pytest.raises(Conflict, match="^notify: node"):
        check_features("put_job", {"spec": spec("a", notify={"url": "http://h"})})
    check_features("put_job", {"spec": spec("a")})  # nothing new in it
    # With a replicated membership, its active members are (n2 removed: not checked).
    from raftsched.core.records import MemberRecord
    st.members = {n: MemberRecord(node_id=n, raft="", api="", status=s, since_ms=0)
                  for n, s in (("n1", "active"), ("n2", "removed"))}
    check_features("apply", {"specs": [spec("a")]})
    st.members = {}
    back = decode_state(encode_state(st))
    assert back.nodes["n1"].features == FEATURES and back.nodes["n2"].features is None
    assert st.apply(Heartbeat(at=T0 + 1, node="n2", boot=2, slots=1, queue=0,
                              features=FEATURES))["ok"]
    check_features("apply", {"specs": [spec("a", notify={"url": "http://h"})]})
    # Rows of older snapshots (11 or 12 fields) still load, without features.
    old = NodeRecord.from_row(["n3", 1, 2, 1, 0, [], "", True, None, None, 7, False])
    assert old.features is None and old.pid == 7
    assert NodeRecord.from_row(old.to_row()).to_dict() == old.to_dict()


def test_a_keep_marker_outside_apply_is_refused_naming_apply() -> None:
    from raftsched.core.errors import InvalidSpec
    with pytest.raises(InvalidSpec, match=r"env\.K: \{keep = true\} .* `raftsched apply` only"):
        JobSpec.from_spec(spec("a", env={"K": {"keep": True}}))
