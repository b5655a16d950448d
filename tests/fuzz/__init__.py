"""Wire helpers and input generators shared by the API fuzz test and the by-hand runner.

``RawConn`` speaks the API's framing over a plain socket (every operation has a timeout)
so a test sees the exact reply frames; the builders make hostile msgpack by hand (deep
nesting, lying lengths); ``Gen`` is a fast ``random``-based generator of framed and
unframed inputs for ``python -m tests.fuzz.run_fuzz``.

Inputs never target :data:`PROTECTED_JOB` with a write, so a fuzz run can compare that
job before and after; jobs the fuzzer creates are paused, scheduled in 2099, run only
``true`` and require a tag no node has (one mutated field never makes one runnable).
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Iterator
from typing import Any

import msgpack

from raftsched.wire import session

FRAME = struct.Struct(">I")
#: Real ops served by the node's handler.
OPS = ("put_job", "get_job", "list_jobs", "delete_job", "pause", "resume", "trigger", "runs",
       "status", "put_jobs")
#: Ops answered by the API server itself.
OPEN_OPS = ("hello", "auth", "ping")
WRITE_OPS = frozenset({"put_job", "put_jobs", "delete_job", "pause", "resume", "trigger"})
ARG_KEYS = ("id", "spec", "specs", "limit", "prefix", "rid", "force", "catch_up", "mac",
            "proof", "cnonce")
#: The job a fuzz run must leave untouched.
PROTECTED_JOB = "keep"
#: Every error code the node may send; anything else in a reply is a finding.
KNOWN_CODES = frozenset({"invalid_spec", "invalid_argument", "unknown_job", "unknown_run",
                         "conflict", "limit_exceeded", "frame_too_large", "overloaded",
                         "protocol_error", "unauthenticated", "not_ready", "internal"})
FUZZ_JOB_IDS = tuple(f"fz-{i}" for i in range(8))


def protected_spec(cmd: list[str]) -> dict[str, Any]:
    """The spec of the job a fuzz run protects: one run a test triggers, no schedule soon."""
    return {"id": PROTECTED_JOB, "schedule": {"at": "2099-01-01T00:00:00Z"}, "command": cmd,
            "env": {"KEEP_TOKEN": "keep-env-value"}}


def inert_spec(job_id: str) -> dict[str, Any]:
    """A valid spec that can never run anything but ``true`` (see the module docstring)."""
    return {"id": job_id, "schedule": {"at": "2099-01-01T00:00:00Z"}, "command": ["true"],
            "paused": True, "tags": ["fuzz-nowhere"], "timeout": "5s",
            "misfire": {"policy": "skip", "grace": "1s", "max_catchup": 1},
            "retries": {"max": 0, "backoff": "1s", "backoff_max": "2s"},
            "overlap": "skip", "on_node_lost": "fail", "jitter": 0, "env": {"A": "b"}}


# ---------------------------------------------------------------- raw wire


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def frame(body: bytes) -> bytes:
    return FRAME.pack(len(body)) + body


def envelope(op: Any, args: Any = None, req_id: Any = 1) -> bytes:
    """A framed request (``args`` omitted when None)."""
    msg: dict[str, Any] = {"id": req_id, "op": op}
    if args is not None:
        msg["args"] = args
    return frame(packb(msg))


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


class RawConn:
    """One API connection driven byte by byte. ``recv_frame`` returns None on a clean EOF."""

    def __init__(self, addr: str, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(split_addr(addr), timeout=timeout)
        self.sock.settimeout(timeout)
        self._ids = iter(range(1, 1 << 62))
        #: After auth (protocol 2) every frame is sealed both ways; see :meth:`send`.
        self.ciphers: session.Ciphers | None = None
        self._pending = b""
        self._desynced = False

    def send(self, data: bytes) -> None:
        """Bytes as the node should see them. Once authenticated, each complete frame in
        ``data`` is sealed on its way (so fuzzed bodies reach the parser behind the
        cipher); an incomplete tail goes out with its header grown by the tag and its
        bytes as they are, and everything after it raw (the stream is broken anyway)."""
        if self.ciphers is None or self._desynced:
            self.sock.sendall(data)
            return
        buf = self._pending + data
        out = bytearray()
        while len(buf) >= FRAME.size:
            (size,) = FRAME.unpack(buf[:FRAME.size])
            if len(buf) < FRAME.size + size:
                break
            sealed = self.ciphers.send.seal(buf[FRAME.size:FRAME.size + size])
            out += FRAME.pack(len(sealed)) + sealed
            buf = buf[FRAME.size + size:]
        if buf:
            size = FRAME.unpack(buf[:FRAME.size])[0] if len(buf) >= FRAME.size else None
            if size is not None:
                out += FRAME.pack(min(size + session.SEAL_OVERHEAD, 0xFFFFFFFF)) + buf[FRAME.size:]
            else:
                out += buf
            self._desynced = True
        self._pending = b""
        self.sock.sendall(bytes(out))

    def _recv_exactly(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                if buf:
                    raise ConnectionError(f"EOF inside a frame after {len(buf)}/{n} bytes")
                return None
            buf += chunk
        return bytes(buf)

    def recv_frame(self) -> dict[str, Any] | None:
        header = self._recv_exactly(FRAME.size)
        if header is None:
            return None
        if header == b"HTTP":
            # Bytes that open like an HTTP request line get the node's one-line HTTP 400
            # (naming its HTTP port), then the close: never a frame (this header would
            # announce ~1.2 GB).
            rest = bytearray()
            while chunk := self.sock.recv(1 << 16):
                rest += chunk
            assert (header + rest).startswith(b"HTTP/1.0 400 "), bytes(header + rest)[:200]
            return None
        (size,) = FRAME.unpack(header)
        body = self._recv_exactly(size) if size else b""
        if body is None:
            raise ConnectionError("EOF after a frame header")
        if self.ciphers is not None:
            body = self.ciphers.recv.open(body)
        return msgpack.unpackb(body, raw=False)

    def request(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        req_id = next(self._ids)
        self.send(envelope(op, args if args is not None else {}, req_id))
        reply = self.recv_frame()
        if reply is None:
            raise ConnectionError(f"connection closed instead of answering {op}")
        return reply

    def auth(self, secret: str) -> None:
        """Protocol 2: both sides prove the secret; every later frame is sealed."""
        cnonce = session.new_nonce()
        hello = self.request("hello", {"cnonce": cnonce.hex()})
        snonce = bytes.fromhex(hello["result"]["nonce"])
        key = secret.encode()
        reply = self.request("auth", {"proof": session.client_proof(key, snonce, cnonce).hex()})
        if not reply.get("ok"):
            raise AssertionError(f"auth refused: {reply}")
        if reply["result"]["proof"] != session.server_proof(key, snonce, cnonce).hex():
            raise AssertionError("the node's proof is wrong")
        self.ciphers = session.ciphers(key, snonce, cnonce, server=False)

    def drain(self) -> list[dict[str, Any]]:
        """Half-close our side, then read every reply until the node closes."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = []
        while True:
            try:
                reply = self.recv_frame()
            except ConnectionResetError:
                break
            if reply is None:
                break
            out.append(reply)
        return out

    def is_closed_by_peer(self) -> bool:
        """True if the node has closed the connection (reads EOF; waits up to the timeout)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_reply(reply: Any) -> str:
    """Raise AssertionError unless ``reply`` is a well-formed reply; its code or "ok"."""
    assert isinstance(reply, dict), f"reply is not a map: {reply!r:.200}"
    assert reply.get("v") == 1, f"bad version: {reply!r:.200}"
    assert isinstance(reply.get("ok"), bool), f"no ok flag: {reply!r:.200}"
    rid = reply.get("id")
    assert rid is None or (isinstance(rid, (int, str)) and not isinstance(rid, bool)), \
        f"bad reply id: {reply!r:.200}"
    if reply["ok"]:
        assert set(reply) == {"v", "id", "ok", "result"}, f"extra keys: {sorted(reply)}"
        return "ok"
    assert set(reply) == {"v", "id", "ok", "error"}, f"extra keys: {sorted(reply)}"
    err = reply["error"]
    assert isinstance(err, dict) and set(err) - {"maybe_committed"} == {"code", "message"}, \
        f"bad error: {err!r:.200}"
    # A not_ready reply may say the command can still commit (and only says so).
    assert err.get("maybe_committed", True) is True and (
        "maybe_committed" not in err or err["code"] == "not_ready"), f"bad error: {err!r:.200}"
    assert isinstance(err["code"], str) and isinstance(err["message"], str), err
    assert err["code"] in KNOWN_CODES, f"unknown error code {err['code']!r}"
    assert len(err["message"]) <= 4096, f"error message of {len(err['message'])} chars"
    return err["code"]


# ---------------------------------------------------------------- hostile msgpack


def nested_lists(depth: int, leaf: bytes = b"\xc0") -> bytes:
    """``depth`` one-element arrays around ``leaf``, built as bytes (no recursion here)."""
    return b"\x91" * depth + leaf


def nested_maps(depth: int, leaf: bytes = b"\xc0") -> bytes:
    """``depth`` one-entry maps ``{"k": ...}`` around ``leaf``."""
    return b"\x81\xa1k" * depth + leaf


def lying_lengths() -> list[bytes]:
    """Small bodies whose str/bin/array/map/ext headers announce up to 4 GiB."""
    out = []
    for tag in (b"\xdb", b"\xc6", b"\xdd", b"\xdf", b"\xc9"):  # str32 bin32 arr32 map32 ext32
        for declared in (5, 1 << 16, 1 << 31, 0xFFFFFFFF):
            out.append(tag + FRAME.pack(declared) + b"abc")
    out.append(b"\xda\xff\xff" + b"x" * 10)  # str16
    out.append(b"\xd9\xff" + b"x")  # str8
    return out


def in_envelope(value_bytes: bytes, where: str = "args") -> bytes:
    """A request map whose ``where`` value is the raw msgpack ``value_bytes``."""
    # {"id": 1, "op": "put_job", <where>: <value>} with the value spliced in as bytes.
    head = b"\x83" + packb("id") + packb(1) + packb("op") + packb("put_job")
    if where == "args":
        return head + packb("args") + value_bytes
    # args = {"spec": <value>}
    return head + packb("args") + b"\x81" + packb(where) + value_bytes


# ---------------------------------------------------------------- random generator

_EDGE_INTS = (0, 1, -1, 2**7, 2**8, 2**15, 2**16, 2**31 - 1, 2**31, 2**32, 2**53, 2**63 - 1,
              -(2**63), 2**64 - 1, 100_000, 100_001, 10_000, 10_001, 5000, 5001)
_TEXTS = ("", "keep", "fz-1", "x" * 129, "a" * 5000, "\x00", "../../etc/passwd", "%s%n",
          "1h", "1s", "0s", "-1s", "99999999999d", "* * * * *", "@hourly", "61 * * * *",
          "UTC", "Mars/Olympus", "2099-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "true",
          "skip", "queue", "allow", "replace", "once", "all", "retry", "fail", "RAFTSCHED_X",
          "\ud7ff\ue000\U0010ffff", "é" * 40, "os:system", "raftsched:main", "ping", "auth")


class Gen:
    """Random inputs; each is ``("framed", body)`` (one complete frame body, answered by
    exactly one reply on an authenticated connection) or ``("stream", bytes)`` (raw bytes
    for a fresh connection)."""

    def __init__(self, seed: int, max_frame: int = 1 << 20) -> None:
        self.rng = random.Random(seed)
        self.max_frame = max_frame

    # -- values
    def text(self) -> str:
        r = self.rng
        k = r.random()
        if k < 0.4:
            return r.choice(_TEXTS)
        if k < 0.7:
            return "".join(r.choice("abcxyz-_.:019 ") for _ in range(r.randint(0, 12)))
        n = r.randint(0, 40)
        return "".join(chr(r.choice((r.randint(32, 126), r.randint(0, 0xD7FF),
                                      r.randint(0xE000, 0x10FFFF)))) for _ in range(n))

    def value(self, depth: int = 0) -> Any:
        r = self.rng
        k = r.randrange(12 if depth < 3 else 8)
        if k == 0:
            return None
        if k == 1:
            return r.random() < 0.5
        if k == 2:
            if r.random() < 0.5:
                return r.randint(-1000, 100_000)
            v = r.choice(_EDGE_INTS) * r.choice((1, 1, -1))
            return v if -(2**63) <= v < 2**64 else -v
        if k == 3:
            return r.choice((0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), 1e308))
        if k in (4, 5):
            return self.text()
        if k == 6:
            return r.randbytes(r.randint(0, 16))
        if k == 7:
            return msgpack.ExtType(r.randint(0, 127), r.randbytes(r.randint(0, 8))) \
                if r.random() < 0.5 else msgpack.Timestamp(r.randint(0, 2**32), 0)
        if k in (8, 9):
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        keys = ARG_KEYS + ("cron", "every", "at", "tz", "offset", "command", "env", "max")
        return {(r.choice(keys) if r.random() < 0.6 else self.text()): self.value(depth + 1)
                for _ in range(r.randint(0, 4))}

    # -- requests
    def valid_request(self) -> dict[str, Any]:
        r = self.rng
        op = r.choice(OPS)
        fz = r.choice(FUZZ_JOB_IDS)
        read_id = r.choice((PROTECTED_JOB, fz, "nope"))
        args: dict[str, Any] = {
            "put_job": {"spec": inert_spec(fz)},
            "put_jobs": {"specs": [inert_spec(r.choice(FUZZ_JOB_IDS))
                                   for _ in range(r.randint(1, 3))]},
            "get_job": {"id": read_id}, "runs": {"id": read_id, "limit": r.randint(1, 50)},
            "list_jobs": {"prefix": r.choice(("", "fz", "k")), "limit": r.randint(1, 100)},
            "delete_job": {"id": fz}, "pause": {"id": fz},
            "resume": {"id": fz, "catch_up": r.random() < 0.5},
            "trigger": {"id": fz, "force": r.random() < 0.5}, "status": {},
        }[op]
        if op in WRITE_OPS and r.random() < 0.3:
            args["rid"] = self.text()[:64] or "r"
        return {"id": r.randint(0, 2**32), "op": op, "args": args}

    def mutate(self, obj: Any, depth: int = 0) -> Any:
        """Replace, drop or add one thing somewhere inside ``obj``."""
        r = self.rng
        if isinstance(obj, dict) and obj and (depth < 4 and r.random() < 0.6):
            key = r.choice(list(obj))
            out = dict(obj)
            out[key] = self.mutate(obj[key], depth + 1)
            return out
        if isinstance(obj, list) and obj and (depth < 4 and r.random() < 0.6):
            i = r.randrange(len(obj))
            return obj[:i] + [self.mutate(obj[i], depth + 1)] + obj[i + 1:]
        k = r.random()
        if isinstance(obj, dict) and k < 0.3:
            out = dict(obj)
            if out and k < 0.15:
                out.pop(r.choice(list(out)))
            else:
                out[r.choice(ARG_KEYS) if r.random() < 0.5 else self.text()] = self.value()
            return out
        return self.value(depth)

    def mutated_spec(self) -> dict[str, Any]:
        """An inert spec with one field (maybe nested) replaced, dropped or added."""
        r = self.rng
        spec = inert_spec(r.choice(FUZZ_JOB_IDS))
        key = r.choice(list(spec) + ["schedule", "misfire", "retries", "call", "extra"])
        sub = spec.get(key)
        if isinstance(sub, dict) and r.random() < 0.7:
            sub = dict(sub)
            inner = r.choice(list(sub) + ["cron", "tz", "every", "offset", "unknown"])
            if r.random() < 0.2:
                sub.pop(inner, None)
            else:
                sub[inner] = self.value() if r.random() < 0.7 else self.text()
            spec[key] = sub
        elif r.random() < 0.15:
            spec.pop(key, None)
        else:
            spec[key] = self.value() if r.random() < 0.7 else self.text()
        if key == "command":
            spec["tags"] = ["fuzz-nowhere"]  # a mutated argv never becomes runnable
        return spec

    def request(self) -> dict[str, Any]:
        r = self.rng
        k = r.random()
        if k < 0.2:
            spec = self.mutated_spec()
            msg = {"id": r.randint(0, 1000), "op": "put_job", "args": {"spec": spec}} \
                if r.random() < 0.8 else {"id": 1, "op": "put_jobs", "args": {
                    "specs": [spec, inert_spec(r.choice(FUZZ_JOB_IDS))]}}
        elif k < 0.55:
            msg = self.mutate(self.valid_request())
        elif k < 0.85:
            op = r.choice(OPS + OPEN_OPS) if r.random() < 0.9 else self.text()
            args = {r.choice(ARG_KEYS): self.value() for _ in range(r.randint(0, 3))}
            msg = {"id": self.value() if r.random() < 0.1 else r.randint(0, 1000), "op": op,
                   "args": args if r.random() < 0.9 else self.value()}
        else:
            msg = self.value() if r.random() < 0.5 else self.mutate(
                {"id": 1, "op": r.choice(OPS), "args": {}})
        return msg

    def framed(self) -> bytes:
        r = self.rng
        k = r.random()
        if k < 0.75:
            msg = self.request()
            body = packb(msg)
        elif k < 0.9:
            body = bytearray(packb(self.valid_request()))
            for _ in range(r.randint(1, 4)):
                pos = r.randrange(len(body))
                op = r.randrange(3)
                if op == 0:
                    body[pos] = r.randrange(256)
                elif op == 1:
                    del body[pos:pos + r.randint(1, 8)]
                else:
                    body[pos:pos] = r.randbytes(r.randint(1, 8))
            body = bytes(body)
        elif k < 0.95:
            body = r.choice(lying_lengths())
            if r.random() < 0.5:
                body = in_envelope(body, r.choice(("args", "spec")))
        else:
            depth = r.choice((10, 500, 1000, 1020, 1022, 1023, 1024, 1025, 1100, 10_000))
            leaf = nested_lists(depth) if r.random() < 0.5 else nested_maps(depth)
            body = in_envelope(leaf, r.choice(("args", "spec", "specs"))) \
                if r.random() < 0.7 else leaf
        return body

    def stream(self) -> bytes:
        r = self.rng
        k = r.randrange(6)
        if k == 0:
            return r.randbytes(r.randint(0, 64))
        if k == 1:  # a lying prefix, short body
            return FRAME.pack(r.choice((0, 1, 7, 64, 1 << 16, self.max_frame,
                                        self.max_frame + 1, 0xFFFFFFFF))) + r.randbytes(
                r.randint(0, 32))
        if k == 2:  # truncated valid frame
            data = frame(packb(self.valid_request()))
            return data[:r.randrange(len(data))]
        if k == 3:  # several frames, then garbage
            data = b"".join(frame(self.framed()) for _ in range(r.randint(1, 4)))
            return data + r.randbytes(r.randint(0, 8))
        if k == 4:  # pipelined requests with no auth
            return b"".join(frame(packb(self.valid_request())) for _ in range(r.randint(1, 5)))
        # auth games: hello (with a nonce, a bad one or none) + bad proofs
        cnonce = r.choice((r.randbytes(32).hex(), self.text(), 7, None))
        parts = [envelope("hello", {"cnonce": cnonce} if cnonce is not None else {}, 1)]
        for i in range(r.randint(1, 5)):
            key = r.choice(("proof", "mac"))
            parts.append(envelope("auth", {key: r.choice((self.text(), "00" * 32,
                                                         r.randbytes(32).hex(), 5, None))},
                                  i + 2))
        parts.append(envelope("status", {}, 99))
        return b"".join(parts)

    def inputs(self) -> Iterator[tuple[str, bytes]]:
        while True:
            if self.rng.random() < 0.8:
                yield "framed", self.framed()
            else:
                yield "stream", self.stream()


def touches_protected(msg: Any) -> bool:
    """True if a decoded request is a write whose args mention the protected job."""
    if not isinstance(msg, dict) or not isinstance(op := msg.get("op"), str) \
            or op not in WRITE_OPS:
        return False
    return _mentions(msg.get("args"), PROTECTED_JOB)


def _mentions(value: Any, needle: str, depth: int = 0) -> bool:
    if depth > 50:
        return True  # too deep to tell: treat as touching, the caller skips it
    if isinstance(value, (str, bytes)):
        return (needle if isinstance(value, str) else needle.encode()) in value
    if isinstance(value, dict):
        return any(_mentions(k, needle, depth + 1) or _mentions(v, needle, depth + 1)
                   for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_mentions(v, needle, depth + 1) for v in value)
    return False


def body_touches_protected(body: bytes) -> bool:
    """``touches_protected`` for an encoded body (undecodable bodies are harmless)."""
    if PROTECTED_JOB.encode() not in body:
        return False
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - the node refuses it as protocol_error too
        return False
    return touches_protected(msg)
