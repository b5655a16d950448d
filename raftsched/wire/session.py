"""Mutual authentication and frame encryption of an API connection (protocol 2).

The handshake is a mutual challenge-response modelled on SCRAM (RFC 5802): the client
sends ``hello`` with its nonce ``cn``, the node answers with its nonce ``sn``; the
client proves a credential with ``HMAC(K, "client" | sn | cn)``; the node, having
checked it against each credential it accepts, proves the same ``K`` with
``HMAC(K, "server" | sn | cn)``, and the client refuses a node whose proof is wrong or
missing (an impostor never learns anything it could replay: the proofs are bound to
both nonces). Neither the secret nor anything derived from it without a nonce ever
crosses the wire.

Without TLS, every frame after the node's ``auth`` reply is sealed with AES-256-GCM
(``cryptography``) under a key per direction from HKDF-SHA256(K, salt = sn | cn): fresh
keys per connection, so the 96-bit nonce is a plain frame counter that never repeats,
and a replayed, reordered, dropped or altered frame fails to open and ends the
connection. With TLS the frames travel inside TLS and are not sealed again.

Credentials: each admin secret ``S`` of the node's keyring (the first one is used, the
others are accepted during a rotation) and, derived from it, a **read-only token**
``ro1.<cluster id>.<HMAC(S, label)>`` that a client uses as its secret to read
(status, jobs, runs) but never to change anything. A credential is named in audit
events by a fingerprint (``admin:1a2b3c4d5e6f``), never by its value.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from raftsched.core.errors import ProtocolError
from raftsched.wire.credentials import Role, token

PROTOCOL = 2
NONCE_BYTES = 32
#: AES-GCM adds this many bytes (the tag) to every sealed frame.
SEAL_OVERHEAD = 16
ADMIN, READ = "admin", "read"
#: Ops a read-only credential may call (besides hello, auth and ping).
READ_OPS = frozenset({"status", "get_job", "list_jobs", "runs", "members", "next_fires",
                      "backfills",
                      "diff_apply",
                      "preview_put", "run_log"})
RO_PREFIX = "ro1."
_CLIENT_LABEL = b"raftsched v2 client proof"
_SERVER_LABEL = b"raftsched v2 server proof"
_KEYS_LABEL = b"raftsched v2 frame keys"
_FP_LABEL = b"raftsched credential fingerprint v1"
_ID_LABEL = b"raftsched cluster id v1"


def cluster_id(secret: str) -> str:
    """The cluster's id: 16 hex chars of HMAC-SHA256(secret, label); for a read-only
    token, the id written in it (that of the admin secret it was derived from)."""
    if secret.startswith(RO_PREFIX):
        parts = secret.split(".")
        if len(parts) == 3 and len(parts[1]) == 16:
            return parts[1]
    return hmac.new(secret.encode("utf-8"), _ID_LABEL, hashlib.sha256).hexdigest()[:16]


def read_only_token(secret: str) -> str:
    """The read-only token derived from an admin secret (stable, reveals nothing of it):
    the cluster id, then the HTTP API's read-only bearer token (one derivation,
    :mod:`raftsched.wire.credentials`), so one read-only credential serves both APIs."""
    return f"{RO_PREFIX}{cluster_id(secret)}.{token(secret, Role.read)}"


def fingerprint(secret: str) -> str:
    """12 hex chars naming a credential in events; an HMAC, so not a guessing aid."""
    return hmac.new(secret.encode("utf-8"), _FP_LABEL, hashlib.sha256).hexdigest()[:12]


@dataclass(frozen=True, slots=True, kw_only=True)
class Credential:
    """One credential a node accepts.

    :var name: how events name it: ``admin:<fingerprint>`` or ``read:<fingerprint>``.
    :var role: ``admin`` (everything) or ``read`` (:data:`READ_OPS` only).
    :var key: the secret's bytes (the HMAC and HKDF key); never logged.
    """

    name: str
    role: str
    key: bytes

    def __repr__(self) -> str:  # never the key, whatever prints it
        return f"Credential({self.name})"


def keyring(admin_secrets: list[str] | tuple[str, ...]) -> tuple[Credential, ...]:
    """Every credential the given admin secrets stand for: each one, then the read-only
    token of each. The first admin secret is the node's own (it proves it to peers)."""
    out = [Credential(name=f"{ADMIN}:{fingerprint(s)}", role=ADMIN, key=s.encode("utf-8"))
           for s in admin_secrets]
    for s in admin_secrets:
        token = read_only_token(s)
        out.append(Credential(name=f"{READ}:{fingerprint(token)}", role=READ,
                              key=token.encode("utf-8")))
    return tuple(out)


def new_nonce() -> bytes:
    return _secrets.token_bytes(NONCE_BYTES)


def client_proof(key: bytes, snonce: bytes, cnonce: bytes) -> bytes:
    return hmac.new(key, _CLIENT_LABEL + snonce + cnonce, hashlib.sha256).digest()


def server_proof(key: bytes, snonce: bytes, cnonce: bytes) -> bytes:
    return hmac.new(key, _SERVER_LABEL + snonce + cnonce, hashlib.sha256).digest()


def match(creds: tuple[Credential, ...], proof: bytes, snonce: bytes,
          cnonce: bytes) -> Credential | None:
    """The credential whose client proof ``proof`` is, or None (every one is compared,
    in constant time each)."""
    found = None
    for cred in creds:
        if hmac.compare_digest(client_proof(cred.key, snonce, cnonce), proof) and found is None:
            found = cred
    return found


def parse_nonce(value: object, what: str) -> bytes:
    """A hex nonce of the right length from the wire; ProtocolError otherwise."""
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != NONCE_BYTES:
        raise ProtocolError(f"{what} must be {NONCE_BYTES} bytes in hex")
    return raw


class FrameCipher:
    """AES-256-GCM sealing of one direction of one connection (counter nonces)."""

    __slots__ = ("_aead", "_counter")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0

    def seal(self, body: bytes) -> bytes:
        nonce = self._counter.to_bytes(12, "big")
        self._counter += 1
        return self._aead.encrypt(nonce, body, None)

    def open(self, sealed: bytes) -> bytes:
        nonce = self._counter.to_bytes(12, "big")
        try:
            body = self._aead.decrypt(nonce, sealed, None)
        except InvalidTag:
            raise ProtocolError("a sealed frame failed to open (altered, replayed or out "
                                "of order); closing") from None
        self._counter += 1
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class Ciphers:
    """The two directions of one connection's encryption.

    :var send: seals what this side sends.
    :var recv: opens what this side receives.
    """

    send: FrameCipher
    recv: FrameCipher


def ciphers(key: bytes, snonce: bytes, cnonce: bytes, *, server: bool) -> Ciphers:
    """This side's ciphers for a connection authenticated with ``key``."""
    material = HKDF(algorithm=hashes.SHA256(), length=64, salt=snonce + cnonce,
                    info=_KEYS_LABEL).derive(key)
    c2s, s2c = FrameCipher(material[:32]), FrameCipher(material[32:])
    return Ciphers(send=s2c, recv=c2s) if server else Ciphers(send=c2s, recv=s2c)
