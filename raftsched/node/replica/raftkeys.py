"""pysyncobj's encryption with a keyring, so the cluster secret rotates without downtime.

pysyncobj seals every Raft message with Fernet under a key derived from its single
``password`` (PBKDF2-SHA256, 100k rounds, a fixed salt) and opens with that key only.
A :class:`RaftKeyring` stands in for that encryptor: it seals with the first secret
of the node's keyring and opens what any of them sealed (``MultiFernet``), and its
secrets can be replaced while connections are open (they all share this object). A
rotation is then three changes of every node's secret file, each applied to all
nodes before the next: ``[old, new]`` (accept new), ``[new, old]`` (use new),
``[new]`` (forget old) — at every moment every pair of nodes can read each other.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.fernet import Fernet, MultiFernet


class RaftKeyring:
    """The encryptor pysyncobj's connections use (see the module docstring).

    :param secrets: the used secret first, then the ones still accepted.
    :param derive: pysyncobj's own ``password -> Fernet`` (so the first key is exactly
        the one a node with only ``password`` uses).
    """

    def __init__(self, secrets: Sequence[str], derive: Callable[[str], Fernet]) -> None:
        self._derive = derive
        self._cache: dict[str, Fernet] = {}
        self._lock = threading.Lock()
        self._multi: MultiFernet
        #: The token this thread last verified in :meth:`extract_timestamp`, and its
        #: plaintext (see there).
        self._last = threading.local()
        self.set(secrets)

    def set(self, secrets: Sequence[str]) -> None:
        """Replace the keyring (PBKDF2 runs here, not in the Raft thread's path)."""
        if not secrets:
            raise ValueError("a keyring needs at least one secret")
        with self._lock:
            fernets = []
            for secret in secrets:
                if secret not in self._cache:
                    self._cache[secret] = self._derive(secret)
                fernets.append(self._cache[secret])
            self._cache = {s: self._cache[s] for s in secrets}
            self._multi = MultiFernet(fernets)  # one assignment: readers see old or new

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return self._multi.encrypt_at_time(data, current_time)

    def extract_timestamp(self, token: bytes) -> int:
        """The verified token's timestamp. pysyncobj asks for it and then decrypts the
        same token, and each call verified its HMAC: every received Raft message was
        checked twice. It is verified and decrypted once, here, and the
        :meth:`decrypt` of that very token object that follows takes the plaintext
        (held by reference, so no other token can share its identity)."""
        plain = self._multi.decrypt(token)  # InvalidToken, as before, when no key opens it
        last = self._last
        last.token, last.plain = token, plain
        # Fernet: version byte, then the 64-bit big-endian timestamp (base64url, the
        # first 12 characters are those 9 bytes); the HMAC just verified covers them.
        return int.from_bytes(base64.urlsafe_b64decode(token[:12])[1:9], "big")

    def decrypt(self, token: bytes, ttl: Any = None) -> bytes:
        last = self._last
        if ttl is None and getattr(last, "token", None) is token:
            plain: bytes = last.plain
            last.token = last.plain = None  # handed out once, not kept
            return plain
        return self._multi.decrypt(token, ttl)
