"""Hostile frames at a real node's API (secret set): random bytes, lying length prefixes,
truncated and deeply nested msgpack, lying str/bin/array lengths, and well-framed
requests with random ops and wrongly typed args for every op.

After every example the node answers ``status``; after each test the node process is
alive and the pre-existing job (spec, version, runs) is exactly as before. Every reply
must be a well-formed ``{v, id, ok, result|error}`` with a known error code, and no
client input may produce an ``internal`` error (that would be a handler bug).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raftsched.core.errors import Conflict, InvalidArgument, UnknownJob
from tests.fuzz import (
    ARG_KEYS,
    OPEN_OPS,
    OPS,
    PROTECTED_JOB,
    Gen,
    RawConn,
    body_touches_protected,
    check_reply,
    envelope,
    frame,
    in_envelope,
    inert_spec,
    lying_lengths,
    nested_lists,
    nested_maps,
    packb,
    protected_spec,
    touches_protected,
)
from tests.support.harness import Cluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "fuzz-api-secret-0123456789abcdef"
SOCK_TIMEOUT = 5.0


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class FuzzNode:
    """One node with a secret, a protected job with one finished run, and its snapshot."""

    def __init__(self, tmp: str) -> None:
        self.cluster = Cluster(tmp, 1, secret=SECRET)
        self.addr = self.cluster.api["n1"]
        self.cluster.start_all()
        self.cluster.wait_leader()
        self.client = self.cluster.client(timeout=10.0)
        self.client.put_job(protected_spec(["true"]))
        self.client.trigger(PROTECTED_JOB)
        wait_until(lambda: self._finished(), 15, "the protected job's run to finish")
        self.before = self.snapshot()

    def _finished(self) -> bool:
        runs = self.client.runs(PROTECTED_JOB)["runs"]
        return bool(runs) and all(r["state"] == "succeeded" for r in runs)

    def snapshot(self) -> tuple[Any, Any]:
        job = self.client.get_job(PROTECTED_JOB)
        return packb(job), packb(self.client.runs(PROTECTED_JOB, limit=1000))

    def assert_serving(self) -> None:
        assert self.cluster.alive("n1"), "the node process died"
        st_ = self.client.status()
        assert st_["leader"] == "n1", st_["summary"]

    def assert_intact(self) -> None:
        self.assert_serving()
        assert self.snapshot() == self.before, "the protected job changed"
        with open(self.cluster.logs["n1"], encoding="utf-8", errors="replace") as f:
            text = f.read()
        assert "Traceback" not in text, "the node logged a traceback:\n" + text[-3000:]

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


@pytest.fixture(scope="module")
def node() -> Iterator[FuzzNode]:
    with tempfile.TemporaryDirectory(prefix="rs-fuzz-api-") as tmp:
        n = FuzzNode(tmp)
        try:
            yield n
        finally:
            n.close()


def _authed(node: FuzzNode) -> RawConn:
    conn = RawConn(node.addr, SOCK_TIMEOUT)
    conn.auth(SECRET)
    return conn


def _one_reply(node: FuzzNode, body: bytes) -> dict[str, Any]:
    """Send one frame on an authenticated connection; exactly one reply comes back."""
    with _authed(node) as conn:
        conn.send(frame(body))
        reply = conn.recv_frame()
    assert reply is not None, "the node closed the connection instead of answering"
    return reply


def _assert_not_internal(code: str, what: Any) -> None:
    assert code != "internal", f"client input produced an internal error: {what!r:.300}"


# ---------------------------------------------------------------- strategies

_leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=24)
           | st.binary(max_size=24)
           | st.sampled_from(["", "fz-1", "x" * 200, "1s", "* * * * *", "UTC", "true"]))
_keys = st.sampled_from(ARG_KEYS) | st.text(max_size=8)
values = st.recursive(_leaves, lambda c: st.lists(c, max_size=4)
                      | st.dictionaries(_keys, c, max_size=4), max_leaves=16)
ops = st.sampled_from(OPS + OPEN_OPS) | st.text(min_size=0, max_size=70)
requests = st.fixed_dictionaries(
    {"id": st.integers(0, 2**32) | st.text(max_size=8),
     "op": ops,
     "args": st.dictionaries(st.sampled_from(ARG_KEYS), values, max_size=4) | values})


# ---------------------------------------------------------------- tests


def test_random_ops_and_wrongly_typed_args_for_every_op(node: FuzzNode) -> None:
    @fuzz(70)
    @given(msg=requests)
    def run(msg: dict[str, Any]) -> None:
        if touches_protected(msg):
            return
        reply = _one_reply(node, packb(msg))
        code = check_reply(reply)
        _assert_not_internal(code, msg)
        if code != "protocol_error":
            assert reply["id"] == msg["id"]
        if not isinstance(msg["op"], str) or msg["op"] not in OPS + OPEN_OPS:
            assert code in ("invalid_argument", "protocol_error"), reply
        node.assert_serving()

    run()
    node.assert_intact()


def test_generated_and_mutated_inputs(node: FuzzNode) -> None:
    """The runner's generator (tests.fuzz.Gen), driven by hypothesis-drawn seeds."""

    @fuzz(50)
    @given(seed=st.integers(0, 2**32 - 1))
    def run(seed: int) -> None:
        gen = Gen(seed)
        body = gen.framed()
        if not body_touches_protected(body):
            reply = _one_reply(node, body)
            _assert_not_internal(check_reply(reply), body[:200])
        with RawConn(node.addr, SOCK_TIMEOUT) as conn:
            conn.send(gen.stream())
            for reply in conn.drain():
                code = check_reply(reply)
                # Unauthenticated: nothing but the open ops may ever succeed.
                assert code != "ok" or "result" in reply
                _assert_not_internal(code, "stream")
        node.assert_serving()

    run()
    node.assert_intact()


def test_raw_garbage_prefixes_and_truncated_frames(node: FuzzNode) -> None:
    prefix = st.one_of(
        st.binary(min_size=4, max_size=4),
        st.integers(0, 64).map(lambda n: n.to_bytes(4, "big")),
        st.sampled_from([0, 1 << 20, (1 << 20) + 1, 0x7FFFFFFF, 0xFFFFFFFF]).map(
            lambda n: n.to_bytes(4, "big")))

    @fuzz(40)
    @given(head=prefix, body=st.binary(max_size=80), authed=st.booleans(),
           cut=st.integers(0, 200), msg=requests)
    # Found by a run: an HTTP request line's first bytes get the node's HTTP 400.
    @example(head=b"DELE", body=b"", authed=False, cut=0,
             msg={"id": 0, "op": "put_job", "args": {}})
    def run(head: bytes, body: bytes, authed: bool, cut: int, msg: dict[str, Any]) -> None:
        for data in (head + body, frame(packb(msg))[:cut]):
            if authed and body_touches_protected(data[4:]):
                continue
            conn = _authed(node) if authed else RawConn(node.addr, SOCK_TIMEOUT)
            with conn:
                conn.send(data)
                for reply in conn.drain():
                    _assert_not_internal(check_reply(reply), data[:100])
        node.assert_serving()

    run()
    node.assert_intact()


@pytest.mark.parametrize("authed", [False, True])
def test_deep_nesting_and_lying_lengths(node: FuzzNode, authed: bool) -> None:
    bodies: list[bytes] = []
    for depth in (10_000, 100_000):
        bodies += [nested_lists(depth), nested_maps(depth)]
        bodies += [in_envelope(nested_lists(depth), w) for w in ("args", "spec", "specs")]
    # Around msgpack's limits (unpack stack and pack recursion, both near 1024 levels).
    for depth in (500, 1000, 1018, 1020, 1021, 1022, 1023, 1024, 1025, 1030, 2000):
        for w in ("spec", "specs", "id", "limit", "prefix", "rid", "args"):
            bodies.append(in_envelope(nested_lists(depth), w))
            bodies.append(in_envelope(nested_maps(depth), w))
    bodies += lying_lengths()
    bodies += [in_envelope(b, w) for b in lying_lengths() for w in ("args", "spec")]
    codes: dict[str, int] = {}
    conn = _authed(node) if authed else RawConn(node.addr, SOCK_TIMEOUT)
    try:
        for body in bodies:
            conn.send(frame(body))
            reply = conn.recv_frame()
            assert reply is not None, f"closed on a body of {len(body)} bytes"
            code = check_reply(reply)
            _assert_not_internal(code, body[:40])
            codes[code] = codes.get(code, 0) + 1
            if not authed:
                assert code in ("unauthenticated", "protocol_error"), reply
    finally:
        conn.close()
    assert codes.get("protocol_error", 0) >= len(lying_lengths()), codes
    node.assert_intact()


def test_pipelined_burst_and_oversized_announcement(node: FuzzNode) -> None:
    """64 pipelined garbage frames then one announcing 4 GiB: all answered in order,
    then frame_too_large with no id, then EOF; the node is unaffected."""
    gen = Gen(7)
    bodies = []
    while len(bodies) < 64:
        body = gen.framed()
        if not body_touches_protected(body):
            bodies.append(body)
    with _authed(node) as conn:
        conn.send(b"".join(frame(b) for b in bodies) + (0xFFFFFFFF).to_bytes(4, "big"))
        replies = conn.drain()
    assert len(replies) == 65, [check_reply(r) for r in replies]
    for r in replies[:-1]:
        _assert_not_internal(check_reply(r), "burst")
    assert replies[-1]["error"]["code"] == "frame_too_large" and replies[-1]["id"] is None
    node.assert_intact()


def test_hello_and_auth_abuse_never_authenticates(node: FuzzNode) -> None:
    with RawConn(node.addr, SOCK_TIMEOUT) as conn:
        conn.send(envelope("auth", {"mac": "00" * 32}, 1))  # no hello yet
        conn.send(envelope("hello", {}, 2))
        conn.send(envelope("auth", {"mac": 12345}, 3))
        conn.send(envelope("auth", {"mac": "zz" * 300}, 4))
        conn.send(envelope("list_jobs", {}, 5))
        replies = conn.drain()
    codes = [check_reply(r) for r in replies]
    # The third failed auth ends the connection: list_jobs is never answered.
    assert codes == ["unauthenticated", "ok", "unauthenticated", "unauthenticated"], codes
    node.assert_intact()


def test_a_request_id_reused_for_another_request_is_a_conflict(node: FuzzNode) -> None:
    """Found by run_fuzz: the state machine answers a repeated rid with the first reply,
    and a rid reused for another op made the node fail with an internal KeyError (or,
    for another job of the same op, report that job's result as this one's)."""
    cl = node.client
    first = cl.call("put_job", spec=inert_spec("rid-a"), rid="reused-rid")
    assert first["created"] is True
    # A retry of the same request gets the same answer.
    assert cl.call("put_job", spec=inert_spec("rid-a"), rid="reused-rid") == first
    for op, kw in (("trigger", {"id": "rid-a", "force": True}),
                   ("put_jobs", {"specs": [inert_spec("rid-b")]}),
                   ("put_job", {"spec": inert_spec("rid-b")}),
                   ("pause", {"id": "rid-a"}), ("delete_job", {"id": "rid-a"})):
        with pytest.raises(Conflict) as info:
            cl.call(op, rid="reused-rid", **kw)
        assert info.value.code == "conflict" and "rid" in info.value.message
    with pytest.raises(UnknownJob):
        cl.get_job("rid-b")
    assert cl.get_job("rid-a")["version"] == 1
    cl.delete_job("rid-a")
    node.assert_intact()


def test_client_refuses_args_msgpack_cannot_carry(node: FuzzNode) -> None:
    """Found by the spec fuzzer: a TOML datetime or a JSON lone surrogate in a spec
    crashed the client (and `raftsched job put`) with a raw TypeError/UnicodeEncodeError."""
    import datetime as dt

    cl = node.client
    for bad in (dict(inert_spec("enc"), schedule={"at": dt.datetime(2026, 12, 1)}),
                dict(inert_spec("enc"), command=["echo", "\ud800"]),
                dict(inert_spec("enc"), env={"TOKEN": "keep-env-value\udfff"}),
                dict(inert_spec("enc"), jitter=2**70), dict(inert_spec("enc"), tags={1, 2})):
        with pytest.raises(InvalidArgument) as info:
            cl.put_job(bad)
        assert info.value.code == "invalid_argument"
        assert "keep-env-value" not in info.value.message
        assert cl.status()["leader"] == "n1"  # the same client goes on working
    with pytest.raises(UnknownJob):
        cl.get_job("enc")
    node.assert_intact()


def test_node_log_holds_no_secret(node: FuzzNode) -> None:
    with open(node.cluster.logs["n1"], encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert SECRET not in text and "keep-env-value" not in text
    assert os.path.getsize(node.cluster.logs["n1"]) < 5_000_000
