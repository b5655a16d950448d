"""Issue 31 item 3: Raft messages sealed with AES-256-GCM-SIV instead of Fernet once
every member opens them (raftsched.node.replica.raftkeys). The seal must keep what
Fernet gave: nothing forged, altered or sealed under another secret opens; the
timestamp pysyncobj orders messages by is authenticated; a rotation's keyring opens
both secrets' messages; and a node opens both forms whichever it seals with (a rolling
upgrade switches nodes one at a time)."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import InvalidToken
from hypothesis import given
from hypothesis import strategies as st

from raftsched.node.replica.compat import derive_fernet, derive_key
from raftsched.node.replica.raftkeys import AEAD_VERSION, RaftKeyring

A = "first-secret-0123456789abcdef"
B = "second-secret-0123456789abcdef"


def _ring(*secrets: str, aead: bool = True) -> RaftKeyring:
    ring = RaftKeyring(list(secrets), derive_key)
    ring.aead = aead
    return ring


def _opened(ring: RaftKeyring, token: bytes) -> tuple[int, bytes]:
    """pysyncobj's order: the timestamp, then the plaintext of that very token."""
    at = ring.extract_timestamp(token)
    return at, ring.decrypt(token)


RING_A = _ring(A)


@given(data=st.binary(max_size=2000), at=st.integers(min_value=0, max_value=2**63 - 1))
def test_what_is_sealed_opens_to_the_same_bytes_and_timestamp(data: bytes, at: int) -> None:
    token = RING_A.encrypt_at_time(data, at)
    assert token[:1] == AEAD_VERSION
    assert _opened(RING_A, token) == (at, data)
    assert RING_A.decrypt(token) == data  # again, without the cached plaintext


def test_an_altered_truncated_or_foreign_token_never_opens() -> None:
    ring = _ring(A)
    token = ring.encrypt_at_time(b"append_entries", 7)
    for i in range(len(token)):  # every byte, the version and timestamp included
        bad = token[:i] + bytes([token[i] ^ 0x01]) + token[i + 1:]
        with pytest.raises(InvalidToken):
            ring.extract_timestamp(bad)
    for cut in (0, 1, 9, 21, len(token) - 1):
        with pytest.raises(InvalidToken):
            ring.extract_timestamp(token[:cut])
    with pytest.raises(InvalidToken):
        ring.extract_timestamp(_ring(B).encrypt_at_time(b"m", 7))
    with pytest.raises(InvalidToken):
        ring.decrypt(_ring(B).encrypt_at_time(b"m", 7))


def test_each_seal_draws_its_own_nonce() -> None:
    ring = _ring(A)
    assert ring.encrypt_at_time(b"m", 7) != ring.encrypt_at_time(b"m", 7)


def test_a_node_opens_both_forms_whichever_it_seals_with() -> None:
    fernet_ring, aead_ring = _ring(A, aead=False), _ring(A)
    plain = derive_fernet(A)  # what a node of an older release, given password=A, uses
    fernet_token = fernet_ring.encrypt_at_time(b"m", 5)
    assert plain.decrypt(fernet_token) == b"m"  # sealed for an older node: it opens it
    assert _opened(aead_ring, fernet_token) == (5, b"m")
    assert _opened(fernet_ring, aead_ring.encrypt_at_time(b"n", 6)) == (6, b"n")
    with pytest.raises(InvalidToken):  # why the seal waits for every member (node.py)
        plain.decrypt(aead_ring.encrypt_at_time(b"n", 6))


def test_a_rotation_s_keyring_opens_both_secrets_and_forgets_the_old_one() -> None:
    ring = _ring(A, B)  # step 1: accept B, seal with A
    assert _opened(_ring(A), ring.encrypt_at_time(b"m", 5)) == (5, b"m")
    assert _opened(ring, _ring(B).encrypt_at_time(b"m", 5)) == (5, b"m")
    ring.set([B])  # step 3: A is forgotten
    with pytest.raises(InvalidToken):
        ring.extract_timestamp(_ring(A).encrypt_at_time(b"m", 5))


def test_a_node_seals_with_the_aead_only_once_no_member_lacks_the_seal_feature() -> None:
    """node.Node._choose_seal, at each applied heartbeat: while a member's heartbeats do
    not list ``seal`` (an older release, mid-upgrade) the node keeps Fernet, which that
    member opens; once none lacks it, the AEAD, for good."""
    from types import SimpleNamespace

    from raftsched.core.cmdbase import SEAL_FEATURE
    from raftsched.node.node import Node

    lacking = ["n2"]
    asked: list[str] = []

    def missing(feature: str) -> list[str]:
        asked.append(feature)
        return list(lacking)

    ring = _ring(A, aead=False)
    node: Any = SimpleNamespace(raft=SimpleNamespace(keyring=ring),
                                features=SimpleNamespace(missing=missing))
    Node._choose_seal(node)
    assert ring.aead is False and asked == [SEAL_FEATURE]
    assert ring.encrypt_at_time(b"m", 1)[:1] == b"g"  # Fernet: n2 opens it
    lacking.clear()  # n2 upgraded: its heartbeat lists seal
    Node._choose_seal(node)
    assert ring.aead is True
    lacking.append("n4")
    Node._choose_seal(node)
    assert ring.aead is True and len(asked) == 2  # not read again once chosen
