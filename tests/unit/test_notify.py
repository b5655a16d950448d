"""Failure notifications in the pure core: the outcome's apply queues a delivery, the
leader's results move it on, the snapshot keeps it (and reads old ones without it),
specs are validated naming the field."""

from __future__ import annotations

import pytest

from raftsched.core.codec import decode_state, encode_state
from raftsched.core.errors import InvalidSpec
from raftsched.core.machine import ClusterState
from raftsched.core.model import JobSpec
from raftsched.core.notify import MAX_PENDING, due
from raftsched.core.notifydata import NotifySpec
from raftsched.wire import webhook
from tests.support.stateutil import T0, S, base, err, finish, ok, put, run_fire, start

pytestmark = pytest.mark.timeout(60)


def failed_run(st: ClusterState, job: str, sched: int = T0) -> str:
    run_fire(st, job, sched)
    run_id = f"{job}@{sched}"
    fence = st.runs[run_id].fence
    start(st, "n1", run_id, fence, sched)
    finish(st, "n1", run_id, fence, sched + S, outcome="failed", code=3, tail="x" * 5000)
    return run_id


def test_an_outcome_queues_one_delivery_and_results_move_it_on() -> None:
    st = base()
    put(st, "j", notify={"on": ["failed"], "url": "http://h/j"})
    put(st, "quiet")
    run_id = failed_run(st, "j")
    failed_run(st, "quiet")  # no job notify, no cluster default: nobody to tell
    key = f"{run_id}/failed"
    assert list(st.notify.pending) == [key]
    d = st.notify.pending[key]
    assert d.url == "http://h/j" and d.body["delivery"] == key
    assert d.body["run"]["exit_code"] == 3 and len(d.body["run"]["tail"]) == 1024
    assert "transitions" not in d.body["run"]
    assert [x.key for x in due(st, T0 + S, set(), 8)] == [key]
    assert due(st, T0 + S, {key}, 8) == []
    ok(st, {"op": "notified", "at": T0 + 2 * S, "items": [[key, False, "HTTP 500", T0 + 9 * S]]})
    assert due(st, T0 + 5 * S, set(), 8) == [] and st.notify.pending[key].attempts == 1
    view = st.run_views("j", 1)[0]
    assert view["run_id"] == run_id and "notify" not in view  # added by the node's reads
    assert st.notify.status[run_id]["state"] == "pending"
    ok(st, {"op": "notified", "at": T0 + 9 * S, "items": [[key, True, "", None]]})
    assert not st.notify.pending
    assert st.notify.status[run_id] == {"key": key, "state": "delivered", "attempts": 2,
                                        "at_ms": T0 + 9 * S, "error": ""}
    # A result committed twice (a leader change) is skipped.
    assert ok(st, {"op": "notified", "at": T0 + 10 * S,
                   "items": [[key, False, "late", None]]})["applied"] == 0
    assert st.totals["notify_delivered"] == 1


def test_cluster_default_missed_ranges_and_give_up() -> None:
    st = base()
    ok(st, {"op": "notify_default", "at": T0, "term": 1,
            "spec": {"url": "http://h/d", "on": ["missed", "failed"]}})
    put(st, "own", notify={"on": ["missed"]})  # the default's URL, its own outcomes
    ok(st, {"op": "plan", "at": T0 + 60 * S, "fires": [
        ["miss", "own", T0, T0 + 20 * S, 3, "missed", "no_leader"]]})
    ok(st, {"op": "plan", "at": T0 + 61 * S, "fires": [
        ["miss", "own", T0 + 30 * S, T0 + 30 * S, 1, "missed", "no_leader"]]})
    keys = list(st.notify.pending)
    assert keys == [f"own@{T0}/missed", f"own@{T0 + 30 * S}/missed"]
    body = st.notify.pending[keys[1]].body
    assert body["fire_times"] == {"first_ms": T0 + 30 * S, "last_ms": T0 + 30 * S, "count": 1}
    assert body["run"]["count"] == 4  # folded into the range record
    ok(st, {"op": "notified", "at": T0, "items": [[k, False, "timeout", None] for k in keys]})
    assert not st.notify.pending and st.totals["notify_failed"] == 2
    failed_run(st, "own", T0 + 90 * S)  # own.on excludes failed
    assert not st.notify.pending


def test_refused_commands_change_nothing_and_the_snapshot_keeps_it_all() -> None:
    st = base()
    put(st, "j", notify={"url": "http://h/j"})
    failed_run(st, "j")
    err(st, {"op": "notify_default", "at": T0, "term": 1, "spec": {"url": "ftp://x"}},
        "invalid_spec")
    err(st, {"op": "notify_default", "at": T0, "spec": None}, "invalid_argument")
    err(st, {"op": "notified", "at": T0, "items": "x"}, "invalid_argument")
    ok(st, {"op": "notify_default", "at": T0, "term": 1, "spec": {"url": "http://h/d"}})
    blob = encode_state(st)
    back = decode_state(blob)
    assert encode_state(back) == blob
    assert back.jobs["j"].spec == st.jobs["j"].spec and back.jobs["j"].spec.notify
    assert list(back.notify.pending) == list(st.notify.pending)
    assert back.notify.default == NotifySpec(url="http://h/d")
    # A state without notifications writes no notify key (what older readers had).
    plain = base()
    put(plain, "k")
    assert b"notify" not in encode_state(plain)


def test_spec_validation_names_the_field() -> None:
    spec = {"id": "j", "schedule": {"every": "1s"}, "command": ["true"]}
    with pytest.raises(InvalidSpec, match=r"notify\.on\[1\]: .*did you mean 'timed_out'"):
        JobSpec.from_spec(dict(spec, notify={"on": ["failed", "timeout"]}))
    with pytest.raises(InvalidSpec, match=r"notify\.ur: unknown field \(did you mean 'url'"):
        JobSpec.from_spec(dict(spec, notify={"ur": "http://x"}))
    with pytest.raises(InvalidSpec, match=r"notify\.url: must be an http"):
        JobSpec.from_spec(dict(spec, notify={"url": "file:///etc/passwd"}))
    job = JobSpec.from_spec(dict(spec, notify={"url": "https://h:8443/p?q=1"}))
    assert job.to_spec()["notify"] == {"on": ["failed", "timed_out", "lost", "missed", "shed"],
                                       "url": "https://h:8443/p?q=1"}
    assert "notify" not in JobSpec.from_spec(spec).to_spec()


def test_pending_deliveries_are_bounded(monkeypatch) -> None:
    from raftsched.core import notify
    monkeypatch.setattr(notify, "MAX_PENDING", 2)
    st = base()
    put(st, "j", notify={"url": "http://h/j"}, schedule={"every": "1s"})
    for i in range(3):
        failed_run(st, "j", T0 + i * S)
    assert len(st.notify.pending) == 2 and st.totals["notify_dropped"] == 1
    assert st.notify.status[f"j@{T0}"]["state"] == "dropped"
    assert MAX_PENDING == 10_000


def test_signatures_verify_only_with_the_key_and_time() -> None:
    key = webhook.notify_key("s3cret")
    assert len(key) == 64 and key != webhook.notify_key("other")
    sig = webhook.sign(key, 1000, b"{}")
    assert webhook.verify(key, "1000", sig, b"{}", now=1100)
    assert not webhook.verify(key, "1000", sig, b"{ }", now=1100)
    assert not webhook.verify(key, "1000", sig, b"{}", now=2000)
    assert not webhook.verify(webhook.notify_key("other"), "1000", sig, b"{}", now=1000)


def test_the_notify_commands_round_trip_and_name_bad_fields() -> None:
    from raftsched.core import commands as c
    from raftsched.core.errors import InvalidArgument
    for cmd in (c.NotifyResults(at=5, items=(("k", True, "", None), ("j", False, "e", 9))),
                c.NotifyDefault(at=5, term=3, spec={"url": "http://h"}),
                c.NotifyDefault(at=5, term=3, spec=None)):
        assert c.decode(cmd.encode()) == cmd
    with pytest.raises(InvalidArgument, match="^items"):
        c.from_wire({"op": "notified", "at": 1, "items": [["k", "yes", "", None]]})
    with pytest.raises(InvalidArgument, match="^term"):
        c.from_wire({"op": "notify_default", "at": 1, "spec": None})
