"""Each configured limit of ``[limits]`` is enforced, with its exact error code:
frame size (refused before the body is read), connections, idle timeout, jobs, spec size
(also inside a bulk put), output tail, and pending commands (RaftNode.submit)."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftsched.core.errors import LimitExceeded, Overloaded, UnknownJob
from raftsched.node.config.config import Timing
from raftsched.node.replica.raft import RaftNode
from raftsched.node.worker.capture import CUT_LINE, CUT_MARK
from tests.fuzz import FRAME, RawConn, check_reply, frame, packb
from tests.support.harness import Cluster, free_ports, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "limits-secret-0123456789abcdef"
MAX_FRAME = 8192
MAX_CONNECTIONS = 5
MAX_JOBS = 3
MAX_SPEC = 1024
TAIL = 1000
LIMITS = f"""
[limits]
max_frame_bytes = {MAX_FRAME}
max_connections = {MAX_CONNECTIONS}
idle_timeout = "1s"
max_jobs = {MAX_JOBS}
max_spec_bytes = {MAX_SPEC}
output_tail_bytes = {TAIL}
"""


@pytest.fixture(scope="module")
def node() -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="rs-limits-") as tmp:
        c = Cluster(tmp, 1, secret=SECRET)
        with open(c.config, "a", encoding="utf-8") as f:
            f.write(LIMITS)
        try:
            c.start_all()
            c.wait_leader()
            yield c
        finally:
            c.close()


@pytest.fixture
def cl(node: Cluster) -> Iterator[Any]:
    """A client on a node with no jobs; every job is removed again afterwards."""
    with node.client() as client:
        for job in client.list_jobs()["jobs"]:
            client.delete_job(job["id"])
        yield client
        for job in client.list_jobs()["jobs"]:
            client.delete_job(job["id"])


def _spec(job_id: str, **kw: Any) -> dict[str, Any]:
    return dict({"id": job_id, "schedule": {"at": "2099-01-01T00:00:00Z"},
                 "command": ["true"]}, **kw)


def _ids(client: Any) -> list[str]:
    return [j["id"] for j in client.list_jobs()["jobs"]]


def _open_served(addr: str, n: int) -> list[RawConn]:
    """``n`` connections that each got a pong (waits for slots earlier tests freed)."""
    held: list[RawConn] = []

    def fill() -> bool:
        for conn in held:
            conn.close()
        held.clear()
        for _ in range(n):
            conn = RawConn(addr, 5.0)
            held.append(conn)
            if not conn.request("ping")["ok"]:
                return False  # limit_exceeded: a slot not freed yet
        return True

    try:
        wait_until(fill, 10, f"{n} connections served at once")
    except BaseException:
        for conn in held:
            conn.close()
        raise
    return held


# ---------------------------------------------------------------- frames


@pytest.mark.parametrize("announced", [MAX_FRAME + 1, 1 << 20, 0xFFFFFFFF])
@pytest.mark.parametrize("authed", [False, True])
def test_frame_announcing_more_than_max_frame_bytes_is_refused_before_its_body(
        node: Cluster, announced: int, authed: bool) -> None:
    with RawConn(node.api["n1"], 5.0) as conn:
        if authed:
            conn.auth(SECRET)
        # Only the 4-byte header: the node must answer without waiting for the body
        # (waiting would end in the 1 s idle timeout with no reply at all).
        conn.send(FRAME.pack(announced))
        reply = conn.recv_frame()
        assert reply is not None, "closed without the frame_too_large reply"
        assert check_reply(reply) == "frame_too_large"
        assert reply["id"] is None
        # Sealed, the header counts the tag too (and cannot pass 2**32 - 1).
        said = min(announced + 16, 0xFFFFFFFF) - 16 if authed else announced
        assert f"{said}" in reply["error"]["message"]
        assert f"{MAX_FRAME}" in reply["error"]["message"]
        assert conn.is_closed_by_peer()


def test_frame_of_exactly_max_frame_bytes_is_served(node: Cluster) -> None:
    base = len(packb({"id": 1, "op": "ping", "args": {"pad": "x" * 1000}}))
    body = packb({"id": 1, "op": "ping", "args": {"pad": "x" * (1000 + MAX_FRAME - base)}})
    assert len(body) == MAX_FRAME
    with RawConn(node.api["n1"], 5.0) as conn:
        conn.send(frame(body))
        assert conn.recv_frame()["result"] == {"pong": True}


# ---------------------------------------------------------------- connections


def test_connection_beyond_max_connections_gets_limit_exceeded(node: Cluster) -> None:
    addr = node.api["n1"]
    held = _open_served(addr, MAX_CONNECTIONS)
    try:
        with RawConn(addr, 5.0) as extra:
            reply = extra.recv_frame()  # sent at accept, without any request
            assert reply is not None
            assert check_reply(reply) == "limit_exceeded"
            assert reply["id"] is None
            assert reply["error"]["message"].startswith("max_connections")
            assert extra.is_closed_by_peer()
        # The held ones still work; freeing one lets a new connection in.
        assert all(c.request("ping")["ok"] for c in held)
        held.pop().close()

        def admitted() -> bool:
            with RawConn(addr, 5.0) as conn:
                return conn.request("ping")["ok"]

        wait_until(admitted, 10, "a freed slot to admit a new connection")
    finally:
        for conn in held:
            conn.close()


def _closed_now(conn: RawConn) -> bool:
    """Has the node closed it (EOF)? Does not wait."""
    conn.sock.settimeout(0.01)
    try:
        return conn.sock.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except ConnectionResetError:
        return True
    finally:
        conn.sock.settimeout(5.0)


def test_idle_connection_is_closed_after_idle_timeout(node: Cluster) -> None:
    addr = node.api["n1"]
    silent, authed, slow, dribble, busy = _open_served(addr, 5)
    try:
        authed.auth(SECRET)
        # Slowloris: a header and half a body, then nothing.
        slow.send(FRAME.pack(100) + b"\x83" * 50)
        # A dribbler keeps sending, one byte of its frame per 0.2 s: still too slow.
        dribble.send(FRAME.pack(100))
        t0 = time.monotonic()
        closed: dict[str, float] = {}
        quiet = {"silent": silent, "authed": authed, "slow": slow, "dribble": dribble}
        # Meanwhile ``busy`` keeps talking: it must outlive them all.
        while time.monotonic() - t0 < 2.5 or len(closed) < len(quiet):
            # Idle, each closes ~1.0-1.3 s in; a loaded machine may be seconds late,
            # a missing timeout never closes them.
            assert time.monotonic() - t0 < 10.0, f"only {sorted(closed)} closed in 10s"
            assert busy.request("ping")["ok"]
            if "dribble" not in closed:
                try:
                    dribble.send(b"\xc0")
                except OSError:
                    pass  # closed: noticed below
            for name, conn in quiet.items():
                if name not in closed and _closed_now(conn):
                    closed[name] = time.monotonic() - t0
            time.sleep(0.2)
        assert all(0.8 <= t <= 8.0 for t in closed.values()), closed
    finally:
        for conn in (silent, authed, slow, dribble, busy):
            conn.close()


# ---------------------------------------------------------------- jobs and specs


def test_put_beyond_max_jobs_is_refused_and_changes_nothing(cl: Any) -> None:
    for i in range(MAX_JOBS):
        cl.put_job(_spec(f"j{i}"))
    before = packb(cl.list_jobs())
    with pytest.raises(LimitExceeded) as info:
        cl.put_job(_spec("one-too-many"))
    assert info.value.code == "limit_exceeded"
    assert info.value.message.startswith("max_jobs")
    # In bulk: each new spec is refused on its own, with the same code.
    results = cl.call("put_jobs", specs=[_spec("bulk-a"), _spec("bulk-b")])["results"]
    assert [r["error"]["code"] for r in results] == ["limit_exceeded"] * 2
    assert all(r["error"]["message"].startswith("max_jobs") for r in results)
    assert packb(cl.list_jobs()) == before
    with pytest.raises(UnknownJob):
        cl.get_job("one-too-many")
    # Updating an existing job at the limit is still allowed.
    assert cl.put_job(_spec("j0", paused=True))["version"] == 2


def _spec_of_size(job_id: str, size: int) -> dict[str, Any]:
    """A spec whose msgpack encoding is exactly ``size`` bytes (size >= ~400)."""
    pad = 300
    base = len(packb(_spec(job_id, env={"PAD": "v" * pad})))
    spec = _spec(job_id, env={"PAD": "v" * (pad + size - base)})
    assert len(packb(spec)) == size
    return spec


def test_spec_over_max_spec_bytes_is_refused(cl: Any) -> None:
    assert cl.put_job(_spec_of_size("fits", MAX_SPEC))["created"] is True
    for spec in (_spec_of_size("too-big", MAX_SPEC + 1),
                 _spec("huge-env", env={"BIG": "v" * 4000})):
        with pytest.raises(LimitExceeded) as info:
            cl.put_job(spec)
        assert info.value.code == "limit_exceeded"
        assert info.value.message.startswith("max_spec_bytes")
    assert _ids(cl) == ["fits"]


def test_bulk_put_cannot_smuggle_an_oversized_spec(cl: Any) -> None:
    """max_spec_bytes holds per spec in put_jobs too, not just for the batch total."""
    small = [_spec(f"small-{i}") for i in range(6)]
    huge = _spec("huge-env", env={"BIG": "v" * 2000})
    # The batch as a whole is under 7 x max_spec_bytes; one spec in it is not.
    assert len(packb([huge, *small])) < 7 * MAX_SPEC < len(packb(huge)) * 7
    with pytest.raises(LimitExceeded) as info:
        cl.call("put_jobs", specs=[huge, *small])
    assert info.value.code == "limit_exceeded"
    assert info.value.message.startswith("max_spec_bytes")
    assert _ids(cl) == []
    results = cl.call("put_jobs", specs=small[:2])["results"]
    assert [r["ok"] for r in results] == [True, True]


def test_output_keeps_only_the_configured_tail(cl: Any) -> None:
    out = "x" * 100_000 + "0123456789" * 10 + "TAIL-END"
    script = "import sys; sys.stdout.write('x' * 100000 + '0123456789' * 10 + 'TAIL-END')"
    cl.put_job(_spec("loud", command=[sys.executable, "-c", script]))
    cl.trigger("loud")
    runs = wait_until(lambda: [r for r in cl.runs("loud")["runs"] if r["state"] == "succeeded"],
                      20, "the loud job's run to succeed")
    # Marked where it was cut (inside the line of x), the mark counted in the limit.
    mark = CUT_MARK + CUT_LINE
    assert runs[0]["tail"] == mark + out[-(TAIL - len(mark)):]
    assert len(runs[0]["tail"].encode()) == TAIL


# ---------------------------------------------------------------- pending commands


def test_submit_beyond_max_pending_commands_raises_overloaded(tmp_path: Any) -> None:
    """A RaftNode whose only peer never answers has no leader: its first command waits,
    the second is refused at once."""
    port, dead_peer = free_ports(2)
    raft = RaftNode(self_addr=f"127.0.0.1:{port}", peers=[f"127.0.0.1:{dead_peer}"],
                    data_dir=str(tmp_path / "raft"), secret=None, timing=Timing(),
                    on_effects=lambda effects: None, max_pending=1)
    try:
        first = raft.submit({"op": "heartbeat", "at": 1})
        assert raft.pending == 1 and not first.done()
        with pytest.raises(Overloaded) as info:
            raft.submit({"op": "heartbeat", "at": 2})
        assert info.value.code == "overloaded"
        assert info.value.message.startswith("max_pending_commands")
        assert raft.pending == 1, "a refused command must not count as pending"
    finally:
        raft.destroy()
