"""Issue 15 items 1 and 3, the pure parts: members from one line or the environment,
declarations built from functions, reconciled idempotently, and a callable's output tail."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import pytest

from raftsched.core.errors import ConfigError, InvalidSpec
from raftsched.core.machine import ClusterState
from raftsched.faces import declare, embedconf
from raftsched.node.config.peers import parse_peers
from raftsched.node.worker import capture
from tests.support.stateutil import ok

pytestmark = pytest.mark.timeout(30)

S = 1000
T0 = 20_000 * 86_400 * S
PEERS = "n1=127.0.0.1:7001/127.0.0.1:7101, n2=127.0.0.1:7002/127.0.0.1:7102,"\
        "n3=127.0.0.1:7003/127.0.0.1:7103/127.0.0.1:7203"


def tick(ctx: Any) -> None:
    """A module-level callable for the declarations below."""


# ---------------------------------------------------------------- members


def test_peers_line_gives_every_member_with_its_addresses() -> None:
    cfg = parse_peers(PEERS, data_dir="/tmp/x", workers=2)
    assert [n.id for n in cfg.nodes] == ["n1", "n2", "n3"]
    assert cfg.node("n2").raft == "127.0.0.1:7002" and cfg.node("n2").api == "127.0.0.1:7102"
    assert cfg.node("n3").metrics == "127.0.0.1:7203" and cfg.node("n1").workers == 2


@pytest.mark.parametrize("text, key", [
    ("", "RAFTSCHED_PEERS"),
    ("n1=127.0.0.1:7001", "RAFTSCHED_PEERS[0]"),
    ("n1=127.0.0.1:7001/127.0.0.1:7101,n2", "RAFTSCHED_PEERS[1]"),
    ("n1=127.0.0.1:7001/127.0.0.1:7101/a/b", "RAFTSCHED_PEERS[0]"),
    ("n1=127.0.0.1:99999/127.0.0.1:7101", "RAFTSCHED_PEERS[0].raft"),
])
def test_a_bad_peers_line_names_the_item(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_peers(text, data_dir="/tmp/x")
    assert err.value.key == key, err.value


def _resolve(environ: dict[str, str] | None = None, **kw: Any) -> Any:
    args: dict[str, Any] = {"config": None, "node_id": None, "peers": None, "data_dir": None,
                            "api": None, "raft": None, "workers": 4, "allow": ()}
    args.update(kw)
    return embedconf.resolve(environ=environ or {}, **args)


def test_environment_names_the_member_so_one_image_serves_every_replica(tmp_path) -> None:
    cfg, me = _resolve({"RAFTSCHED_PEERS": PEERS, "RAFTSCHED_NODE_ID": "n2"},
                       data_dir=str(tmp_path))
    assert me == "n2" and len(cfg.nodes) == 3 and cfg.data_dir == str(tmp_path)
    cfg, me = _resolve({}, data_dir=str(tmp_path))  # nothing: the single-node default
    assert me == "n1" and len(cfg.nodes) == 1 and cfg.nodes[0].api == "127.0.0.1:7191"


def test_arguments_win_over_the_environment_and_a_config_file_is_read(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\ndata_dir = "d"\n'
                    + "".join(f'[[nodes]]\nid = "m{i}"\nraft = "127.0.0.1:{7300 + i}"\n'
                              f'api = "127.0.0.1:{7400 + i}"\n' for i in (1, 2, 3)))
    cfg, me = _resolve({"RAFTSCHED_NODE_ID": "m1", "RAFTSCHED_PEERS": PEERS},
                       config=str(path), node_id="m3")
    assert me == "m3" and [n.id for n in cfg.nodes] == ["m1", "m2", "m3"]
    cfg, me = _resolve({"RAFTSCHED_CONFIG": str(path), "RAFTSCHED_NODE_ID": "m2"})
    assert me == "m2"


@pytest.mark.parametrize("environ, kw, key", [
    ({"RAFTSCHED_PEERS": PEERS}, {}, "node_id"),
    ({"RAFTSCHED_PEERS": PEERS, "RAFTSCHED_NODE_ID": "n9"}, {}, "RAFTSCHED_NODE_ID"),
    ({"RAFTSCHED_PEERS": PEERS}, {"node_id": "n9"}, "node_id"),
    ({}, {"peers": PEERS, "node_id": "n1", "api": "127.0.0.1:1"}, "api"),
])
def test_an_unclear_member_is_a_config_error_naming_it(environ, kw, key) -> None:
    with pytest.raises(ConfigError) as err:
        _resolve(environ, **kw)
    assert err.value.key.startswith(key), err.value


# ---------------------------------------------------------------- declarations


def test_a_declaration_is_the_function_s_import_path_and_its_policy() -> None:
    spec = declare.build_spec(tick, cron="*/5 * * * *", tz="Europe/Berlin", overlap="allow")
    assert spec == {"id": "tests.unit.test_declare.tick", "call": "tests.unit.test_declare:tick",
                    "schedule": {"cron": "*/5 * * * *", "tz": "Europe/Berlin"},
                    "overlap": "allow"}
    assert declare.build_spec(tick, id="t", every="1s")["schedule"] == {"every": "1s"}


@pytest.mark.parametrize("func, kw, field", [
    (lambda ctx: None, {"every": "1s"}, "call"),
    (tick, {}, "schedule"),
    (tick, {"every": "1s", "cron": "* * * * *"}, "schedule"),
    (tick, {"every": "1s", "tz": "UTC"}, "schedule.tz"),
    (tick, {"cron": "61 * * * *"}, "schedule"),
    (tick, {"every": "1s", "overlap": "sometimes"}, "overlap"),
    (tick, {"every": "1s", "command": ["true"]}, "command"),
])
def test_a_bad_declaration_fails_at_import_naming_the_field(func, kw, field) -> None:
    with pytest.raises(InvalidSpec) as err:
        declare.build_spec(func, **kw)
    assert str(err.value).startswith(field), err.value


def _put(st: ClusterState, at: int, specs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    reply = ok(st, {"op": "put_jobs", "at": at, "if_changed": True, "specs": specs})
    return [(r["job"], r["version"], r["created"], r["changed"]) for r in reply["results"]]


def test_identical_declarations_make_one_version_a_changed_one_exactly_one_more() -> None:
    st = ClusterState()
    spec = declare.build_spec(tick, id="t", every="1s")
    assert _put(st, T0, [spec]) == [("t", 1, True, True)]
    for i in range(3):  # three instances declare the same definition
        assert _put(st, T0 + i * S, [dict(spec)]) == [("t", 1, False, False)]
    changed = declare.build_spec(tick, id="t", every="2s")
    assert _put(st, T0 + 5 * S, [changed]) == [("t", 2, False, True)]
    assert _put(st, T0 + 6 * S, [changed]) == [("t", 2, False, False)]
    # A paused job declared again stays paused and gets no version for it.
    ok(st, {"op": "pause", "at": T0 + 7 * S, "job": "t"})
    assert _put(st, T0 + 8 * S, [changed]) == [("t", 3, False, False)]
    assert st.jobs["t"].spec.paused


class _FakeClient:
    """Just enough of the Client for reconcile: a state machine behind it."""

    def __init__(self) -> None:
        self.st = ClusterState()
        self.at = T0
        self.refuse_until = 0  # calls refused with "allowed prefix" first

    def call(self, op: str, **args: Any) -> Any:
        assert op == "put_jobs"
        self.at += S
        if self.refuse_until > 0:
            self.refuse_until -= 1
            return {"results": [{"ok": False, "error": {
                "code": "invalid_spec", "message": "call: module is not under an allowed prefix"}}
                for _ in args["specs"]]}
        return ok(self.st, {"op": "put_jobs", "at": self.at, "specs": args["specs"],
                            "if_changed": args["if_changed"]})

    def list_jobs(self, limit: int) -> Any:
        return {"jobs": [{"id": j, "spec": {"call": r.spec.call}} for j, r in self.st.jobs.items()]}

    def delete_job(self, job_id: str) -> Any:
        self.at += S
        return ok(self.st, {"op": "delete_job", "at": self.at, "job": job_id})


def test_reconcile_reports_undeclared_jobs_and_removes_them_only_with_prune() -> None:
    cl = _FakeClient()
    specs = [declare.build_spec(tick, id=f"j{i}", every="1m") for i in range(3)]
    rep = declare.reconcile(cl, specs)
    assert rep.created == ("j0", "j1", "j2") and rep.updated == rep.unchanged == ()
    rep = declare.reconcile(cl, specs[:2])
    assert rep.unchanged == ("j0", "j1") and rep.undeclared == ("j2",) and rep.pruned == ()
    assert "j2" in cl.st.jobs
    rep = declare.reconcile(cl, specs[:2], prune=True)
    assert rep.pruned == ("j2",) and "j2" not in cl.st.jobs


def test_declarations_wait_for_the_node_s_process_to_allow_their_module() -> None:
    cl = _FakeClient()
    cl.refuse_until = 2
    slept: list[float] = []
    spec = declare.build_spec(tick, id="t", every="1m")
    assert declare.put_declarations(cl, [spec], sleep=slept.append)[0]["created"]
    assert len(slept) == 2


# ---------------------------------------------------------------- output tail


def test_output_and_logging_of_a_run_land_in_its_tail_only() -> None:
    capture.install()
    tail = capture.Tail(4000)
    other = capture.Tail(4000)

    def body(_: Any) -> None:
        print("hello from the run")  # noqa: T201 - the output captured
        logging.getLogger("app").warning("careful")
        raise ValueError("boom")

    with pytest.raises(ValueError):
        capture.call(body, tail, None)
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(str(capture.call(
        lambda _: sys.stdout.write("elsewhere\n"), other, None))))
    thread.start()
    thread.join()
    print("not a run")  # noqa: T201 - output outside any run
    text = tail.text()
    assert "hello from the run" in text and "WARNING app: careful" in text
    assert "Traceback" in text and "ValueError: boom" in text
    assert "elsewhere" not in text and "not a run" not in text + other.text()


def test_a_tail_keeps_the_last_characters() -> None:
    tail = capture.Tail(10)
    for i in range(100):
        tail.write(f"{i:03d}")
    assert tail.text() == "".join(f"{i:03d}" for i in range(100))[-10:]


def test_a_declaration_put_is_written_as_version_3_so_an_older_node_stops_on_it() -> None:
    from raftsched.core.commands import PAST_AT_VERSION, PutJobs, from_wire
    from raftsched.node.service.jobops import put_version

    spec = declare.build_spec(tick, id="t", every="1s")
    cmd = PutJobs(specs=(spec,), if_changed=True, at=T0, v=put_version(True))
    wire = cmd.to_wire()
    assert wire["if_changed"] is True and cmd.v == PAST_AT_VERSION
    assert from_wire(dict(wire, v=cmd.v)).if_changed is True
    assert "if_changed" not in PutJobs(specs=(spec,), at=T0).to_wire()
