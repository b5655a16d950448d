"""Issue 16 item 7: the API is encrypted and mutually authenticated.

A loopback relay between a real client and a real node records every byte both ways:
with the secret alone (sealed frames) and with TLS, no job env value, no secret, no
part of a job spec crosses in the clear. Impostor nodes — one that does not ask for
the secret, one that accepts any proof but cannot prove the secret itself, one with
another secret, a TLS node with a certificate from another CA — are refused by the
client before it sends them anything of the job.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from raftsched.core.errors import Unauthenticated
from raftsched.wire import session
from raftsched.wire.api import ApiServer
from raftsched.wire.certs import create_ca, create_node, server_context
from raftsched.wire.client import Client
from tests.support.harness import ROOT, Cluster, free_ports, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = "relay-test-SECRET-4f1c9a77e2"
ENV_VALUE = "hunter2-very-secret-ENV"
MARKER = "specmarker7c1d"  # in the job id, the command and the env key
SPEC = {"id": f"job-{MARKER}", "schedule": {"at": "2099-01-01T00:00:00Z"},
        "command": ["sh", "-c", f"echo {MARKER}"], "env": {f"DB_PASSWORD_{MARKER}": ENV_VALUE}}


class Relay:
    """A TCP relay on loopback that forwards both ways and records every byte."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.recorded = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._spawn(self._accept)

    def _spawn(self, fn: Any, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                down, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            up = socket.create_connection(self.target, timeout=5)
            self._socks += [down, up]
            self._spawn(self._pump, down, up)
            self._spawn(self._pump, up, down)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            with self._lock:
                self.recorded += data
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for s in self._socks:
            s.close()
        for t in self._threads:
            t.join(5)

    def cleartext_leaks(self) -> list[str]:
        with self._lock:
            data = bytes(self.recorded)
        needles = {"env value": ENV_VALUE, "secret": SECRET, "spec marker": MARKER,
                   "env key": "DB_PASSWORD", "command": "echo "}
        return [name for name, text in needles.items() if text.encode() in data]


def _exercise(client: Client) -> None:
    """Every kind of request that carries or returns a spec or an env value."""
    assert client.put_job(SPEC)["created"] in (True, False)
    assert set(client.get_job(SPEC["id"])["spec"]["env"]) == set(SPEC["env"])  # values masked
    assert [j["id"] for j in client.list_jobs()["jobs"]] == [SPEC["id"]]
    client.put_jobs([dict(SPEC, id=f"job2-{MARKER}")], atomic=True)
    client.status()


def _tls_keys(certs_dir: str) -> dict[str, str]:
    return {"tls_cert": f"{certs_dir}/{{id}}.crt", "tls_key": f"{certs_dir}/{{id}}.key",
            "tls_ca": f"{certs_dir}/ca.crt"}


@pytest.fixture(scope="module")
def certs_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="rs-certs-") as tmp:
        create_ca(tmp)
        create_node(tmp, "n1")
        other = os.path.join(tmp, "other")
        create_ca(other, name="someone else's CA")
        create_node(other, "n1")
        yield tmp


@pytest.mark.parametrize("tls", [False, True], ids=["sealed", "tls"])
def test_a_relay_sees_no_env_value_secret_or_spec(tmp_path: Any, certs_dir: str,
                                                  tls: bool) -> None:
    extra: dict[str, str] = {}
    ca = None
    if tls:
        ca = os.path.join(certs_dir, "ca.crt")
        extra = _tls_keys(certs_dir)
    c = Cluster(str(tmp_path), 1, secret=SECRET, cluster_extra=extra, tls_ca=ca)
    relay = None
    try:
        c.start_all()
        c.wait_leader()
        host, port = c.api["n1"].rsplit(":", 1)
        relay = Relay((host, int(port)))
        with Client([f"127.0.0.1:{relay.port}"], secret=SECRET, timeout=10,
                    tls_ca=ca or "") as client:
            _exercise(client)
            assert client.role == "admin"
        assert len(relay.recorded) > 500, "the traffic went through the relay"
        assert relay.cleartext_leaks() == []
        if tls:
            assert relay.recorded.startswith(b"\x16\x03")  # a TLS handshake record
    finally:
        if relay is not None:
            relay.close()
        c.close()


def test_a_tls_node_refuses_cleartext_and_says_how_to_connect(tmp_path: Any,
                                                               certs_dir: str) -> None:
    ca = os.path.join(certs_dir, "ca.crt")
    c = Cluster(str(tmp_path), 1, secret=SECRET, cluster_extra=_tls_keys(certs_dir), tls_ca=ca)
    try:
        c.start_all()
        c.wait_leader()
        env = dict(os.environ, RS_SECRET=SECRET,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("RAFTSCHED_TLS_CA", None)
        base = [sys.executable, "-m", "raftsched", "status", "--addr", c.api["n1"],
                "--secret-env", "RS_SECRET", "--timeout", "5"]
        ok = subprocess.run([*base, "--tls-ca", ca], env=env, capture_output=True,
                            text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        plain = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
        assert plain.returncode == 3 and "--tls-ca" in plain.stderr, plain.stderr
        other = subprocess.run([*base, "--tls-ca", os.path.join(certs_dir, "other", "ca.crt")],
                               env=env, capture_output=True, text=True, timeout=60)
        assert other.returncode == 1 and "not trusted" in other.stderr, other.stderr
        # The node lives on, and nothing of the secret reached its log.
        assert c.alive("n1")
        with open(c.logs["n1"], encoding="utf-8") as f:
            assert SECRET not in f.read()
    finally:
        c.close()


# ------------------------------------------------------------------ impostors

class Impostor:
    """A fake node on a thread that records every byte it is sent. ``mode``:
    ``open`` says auth_required false; ``liar`` asks for the secret, accepts any proof
    and answers with a proof it cannot compute; ``secret:<s>`` is a real ApiServer
    with another secret."""

    def __init__(self, mode: str, ssl_context: Any = None) -> None:
        self.mode = mode
        self.received = bytearray()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = free_ports(1)[0]
        if mode.startswith("secret:"):
            async def handler(op: str, args: dict[str, Any]) -> Any:
                self.received += msgpack.packb(args)
                return {}
            self.server: Any = ApiServer(handler=handler, host="127.0.0.1", port=self.port,
                                         secret=mode[7:], node_id="n1",
                                         ssl_context=ssl_context)
            self._run(self.server.start())
        else:
            self.server = self._run(asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                         ssl=ssl_context))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                header = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(header, "big"))
                self.received += header + body
                try:
                    req = msgpack.unpackb(body)
                except Exception:  # noqa: BLE001 - sealed bytes: answer nothing
                    continue
                op = req.get("op")
                if op == "hello":
                    result: Any = {"nonce": os.urandom(32).hex(), "node": "n1",
                                   "auth_required": self.mode != "open", "protocol": 2}
                elif op == "auth":
                    result = {"ok": True, "role": "admin", "sealed": True,
                              "proof": os.urandom(32).hex()}
                else:
                    result = {"job": "x", "version": 1, "created": True}
                out = msgpack.packb({"v": 1, "id": req.get("id"), "ok": True, "result": result})
                writer.write(len(out).to_bytes(4, "big") + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def _end(self) -> None:
        if isinstance(self.server, ApiServer):
            await self.server.close()
            return
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def close(self) -> None:
        self._run(self._end())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.mark.parametrize("mode", ["open", "liar", "secret:another-clusters-secret-99"])
def test_an_impostor_node_is_refused_before_it_gets_the_job(mode: str) -> None:
    imp = Impostor(mode)
    try:
        with Client([f"127.0.0.1:{imp.port}"], secret=SECRET, timeout=5, tls_ca="") as client:
            with pytest.raises(Unauthenticated) as info:
                client.put_job(SPEC)
        assert SECRET not in str(info.value)
        got = bytes(imp.received)
        for text in (ENV_VALUE, SECRET, MARKER):
            assert text.encode() not in got, (mode, text)
        assert b"put_job" not in got  # nothing after the handshake was sent at all
    finally:
        imp.close()


def test_a_tls_impostor_with_another_ca_is_refused(certs_dir: str) -> None:
    other = os.path.join(certs_dir, "other")
    ctx = server_context(os.path.join(other, "n1.crt"), os.path.join(other, "n1.key"))
    imp = Impostor(f"secret:{SECRET}", ssl_context=ctx)  # even with the right secret
    try:
        with Client([f"127.0.0.1:{imp.port}"], secret=SECRET, timeout=5,
                    tls_ca=os.path.join(certs_dir, "ca.crt")) as client:
            with pytest.raises(Unauthenticated, match="not trusted"):
                client.put_job(SPEC)
        assert bytes(imp.received) == b""
    finally:
        imp.close()


def test_a_read_only_token_reads_through_a_real_node_but_cannot_write(tmp_path: Any) -> None:
    c = Cluster(str(tmp_path), 1, secret=SECRET)
    try:
        c.start_all()
        c.wait_leader()
        with c.client() as admin:
            admin.put_job(SPEC)
        token = session.read_only_token(SECRET)
        with Client([c.api["n1"]], secret=token, timeout=10) as ro:
            assert ro.get_job(SPEC["id"])["id"] == SPEC["id"]
            assert ro.runs(SPEC["id"])["runs"] == [] and ro.status()["node"] == "n1"
            for call in (lambda: ro.put_job(dict(SPEC, id="ro-made")),
                         lambda: ro.delete_job(SPEC["id"]), lambda: ro.pause(SPEC["id"]),
                         lambda: ro.trigger(SPEC["id"]), lambda: ro.drain("n1")):
                with pytest.raises(Unauthenticated, match="admin credential"):
                    call()
        with c.client() as admin:
            assert [j["id"] for j in admin.list_jobs()["jobs"]] == [SPEC["id"]]
            assert admin.get_job(SPEC["id"])["paused"] is False
        wait_until(lambda: c.alive("n1"), 1, "n1 alive")
    finally:
        c.close()


def test_a_three_node_tls_cluster_checks_its_members_over_tls(tmp_path: Any,
                                                              certs_dir: str) -> None:
    """Nodes are clients of each other too (the member check): over TLS, with the CA
    of the config, each one finds its peers' configs equal."""
    for nid in ("n2", "n3"):
        if not os.path.exists(os.path.join(certs_dir, f"{nid}.crt")):
            create_node(certs_dir, nid)
    c = Cluster(str(tmp_path), 3, secret=SECRET, cluster_extra=_tls_keys(certs_dir),
                tls_ca=os.path.join(certs_dir, "ca.crt"))
    try:
        c.start_all()
        c.wait_leader()

        def matched(nid: str) -> set[str]:
            with open(c.logs[nid], encoding="utf-8") as f:
                text = f.read()
            return {peer for peer in c.ids if f"config matches peer {peer}" in text}

        wait_until(lambda: all(matched(n) == set(c.ids) - {n} for n in c.ids), 30,
                   "every node to match both peers' configs over TLS")
        assert not any(e.get("event") == "config.mismatch" for n in c.ids for e in c.events(n))
    finally:
        c.close()
