"""pysyncobj's encryption with a keyring, so the cluster secret rotates without downtime,
and a cheaper seal once every member reads it.

pysyncobj seals every Raft message with Fernet under a key derived from its single
``password`` (PBKDF2-SHA256, 100k rounds, a fixed salt) and opens with that key only.
A :class:`RaftKeyring` stands in for that encryptor: it seals with the first secret
of the node's keyring and opens what any of them sealed, and its secrets can be
replaced while connections are open (they all share this object). A rotation is then
three changes of every node's secret file, each applied to all nodes before the next:
``[old, new]`` (accept new), ``[new, old]`` (use new), ``[new]`` (forget old) — at every
moment every pair of nodes can read each other.

**The AEAD seal.** Fernet costs ~7 us per message even in a hot loop (base64, an HMAC
and AES-CBC, each its own call): a 3-node pysyncobj with a password idled at 0.8-1.1 %
of a core per node, 0.4-0.5 % without one (``bench/results/2026-12-05-idle-pacing.md``).
Once :attr:`RaftKeyring.aead` is set (the node sets it when every member's heartbeats
list the ``seal`` feature, so an older node is never sent what it cannot open), the
keyring seals with AES-256-GCM-SIV instead: one call each way, ~1.5 us. Its key is
derived (HKDF-SHA256) from the same PBKDF2 key as the Fernet one, so a secret means
one thing in both forms. Its nonce is random (96 bits): GCM-SIV stays secure when random
nonces repeat (RFC 8452), so no counter has to survive a restart. Token: one version
byte ``0x01`` (a Fernet token begins with ``g``, its base64 version byte), the 64-bit
big-endian timestamp pysyncobj orders messages by, the nonce, then the ciphertext and
its tag; the version and timestamp are authenticated as associated data. Both forms
are always opened, whichever this node seals with.
"""

from __future__ import annotations

import base64
import os
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: The AEAD token's version byte (never the first byte of a Fernet token, ``g``).
AEAD_VERSION = b"\x01"
_HEAD = struct.Struct(">cQ")  # version, timestamp: the associated data
_NONCE = 12
_HKDF_INFO = b"raftsched raft seal v1: AES-256-GCM-SIV"


def _aead_available() -> bool:
    """Whether cryptography's OpenSSL has AES-GCM-SIV (3.2 and later; a distribution's
    cryptography may link an older one): without it the node keeps Fernet and does not
    announce the ``seal`` feature, so no peer seals for it either."""
    try:
        AESGCMSIV(bytes(32))
    except Exception:  # noqa: BLE001 - UnsupportedAlgorithm, or anything else: no AEAD
        return False
    return True


AEAD_AVAILABLE = _aead_available()


def aead_key(pbkdf2_key: bytes) -> AESGCMSIV | None:
    """The AEAD of one secret, from the 32 bytes its Fernet key is made of (None where
    it is not available)."""
    if not AEAD_AVAILABLE:
        return None
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=_HKDF_INFO).derive(pbkdf2_key)
    return AESGCMSIV(key)


class RaftKeyring:
    """The encryptor pysyncobj's connections use (see the module docstring).

    :param secrets: the used secret first, then the ones still accepted.
    :param derive: ``password -> the 32-byte PBKDF2 key`` pysyncobj derives from it (so
        the first Fernet key is exactly the one a node with only ``password`` uses).
    """

    def __init__(self, secrets: Sequence[str], derive: Callable[[str], bytes]) -> None:
        self._derive = derive
        self._cache: dict[str, tuple[Fernet, AESGCMSIV | None]] = {}
        self._lock = threading.Lock()
        self._multi: MultiFernet
        self._aeads: tuple[AESGCMSIV, ...] = ()
        #: Seal with the AEAD (every member opens it); False: with Fernet.
        self.aead = False
        #: The token this thread last verified in :meth:`extract_timestamp`, and its
        #: plaintext (see there).
        self._last = threading.local()
        self.set(secrets)

    def set(self, secrets: Sequence[str]) -> None:
        """Replace the keyring (PBKDF2 runs here, not in the Raft thread's path)."""
        if not secrets:
            raise ValueError("a keyring needs at least one secret")
        with self._lock:
            pairs = []
            for secret in secrets:
                if secret not in self._cache:
                    raw = self._derive(secret)
                    self._cache[secret] = (Fernet(base64.urlsafe_b64encode(raw)),
                                           aead_key(raw))
                pairs.append(self._cache[secret])
            self._cache = {s: self._cache[s] for s in secrets}
            # One assignment each: a reader sees the old keyring or the new one (a
            # token sealed by either of two keyrings a rotation step apart opens).
            self._multi = MultiFernet([f for f, _ in pairs])
            self._aeads = tuple(a for _, a in pairs if a is not None)

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        if not (self.aead and self._aeads):
            return self._multi.encrypt_at_time(data, current_time)
        head = _HEAD.pack(AEAD_VERSION, current_time)
        nonce = os.urandom(_NONCE)
        return head + nonce + self._aeads[0].encrypt(nonce, data, head)

    def _open(self, token: bytes) -> tuple[int, bytes]:
        """(timestamp, plaintext) of a token in either form; InvalidToken if no key of
        the keyring opens it."""
        if token[:1] != AEAD_VERSION:
            plain = self._multi.decrypt(token)
            # Fernet: version byte, then the 64-bit big-endian timestamp (base64url, the
            # first 12 characters are those 9 bytes); the HMAC just verified covers them.
            return int.from_bytes(base64.urlsafe_b64decode(token[:12])[1:9], "big"), plain
        if len(token) < _HEAD.size + _NONCE + 16:
            raise InvalidToken
        head = token[:_HEAD.size]
        nonce = token[_HEAD.size:_HEAD.size + _NONCE]
        for aead in self._aeads:
            try:
                plain = aead.decrypt(nonce, token[_HEAD.size + _NONCE:], head)
            except InvalidTag:
                continue
            return _HEAD.unpack(head)[1], plain
        raise InvalidToken

    def extract_timestamp(self, token: bytes) -> int:
        """The verified token's timestamp. pysyncobj asks for it and then decrypts the
        same token, and each call verified it: every received Raft message was
        checked twice. It is verified and decrypted once, here, and the
        :meth:`decrypt` of that very token object that follows takes the plaintext
        (held by reference, so no other token can share its identity)."""
        at, plain = self._open(token)  # InvalidToken, as before, when no key opens it
        last = self._last
        last.token, last.plain = token, plain
        return at

    def decrypt(self, token: bytes, ttl: Any = None) -> bytes:
        last = self._last
        if ttl is None and getattr(last, "token", None) is token:
            plain: bytes = last.plain
            last.token = last.plain = None  # handed out once, not kept
            return plain
        if ttl is not None and token[:1] != AEAD_VERSION:
            return self._multi.decrypt(token, ttl)
        return self._open(token)[1]
