"""The API handshake's and the Raft keyring's building blocks (issue 16 items 7-8)."""

from __future__ import annotations

import pytest
from cryptography.fernet import InvalidToken

from raftsched.core.errors import ProtocolError
from raftsched.node.replica.compat import derive_fernet, derive_key
from raftsched.node.replica.raftkeys import RaftKeyring
from raftsched.wire import session

A = "first-secret-0123456789abcdef"
B = "second-secret-0123456789abcdef"


def test_proofs_are_bound_to_both_nonces_and_to_a_direction() -> None:
    sn, cn = session.new_nonce(), session.new_nonce()
    key = A.encode()
    proof = session.client_proof(key, sn, cn)
    assert proof != session.client_proof(key, session.new_nonce(), cn)
    assert proof != session.client_proof(key, sn, session.new_nonce())
    # A node cannot reflect the client's proof back as its own.
    assert proof != session.server_proof(key, sn, cn)


def test_match_finds_the_credential_and_its_role() -> None:
    ring = session.keyring([A, B])
    sn, cn = session.new_nonce(), session.new_nonce()
    token = session.read_only_token(B)
    got = session.match(ring, session.client_proof(token.encode(), sn, cn), sn, cn)
    assert got is not None and got.role == session.READ
    got = session.match(ring, session.client_proof(A.encode(), sn, cn), sn, cn)
    assert got is not None and got.role == session.ADMIN
    assert session.match(ring, session.client_proof(b"other-secret-xyz", sn, cn), sn, cn) \
        is None
    assert A not in repr(ring) and "admin:" in repr(ring)


def test_sealed_frames_open_once_in_order_and_never_when_altered() -> None:
    sn, cn = session.new_nonce(), session.new_nonce()
    client = session.ciphers(A.encode(), sn, cn, server=False)
    server = session.ciphers(A.encode(), sn, cn, server=True)
    one, two = client.send.seal(b"one"), client.send.seal(b"two")
    assert b"one" not in one
    assert server.recv.open(one) == b"one"
    with pytest.raises(ProtocolError):
        server.recv.open(one)  # replayed
    assert server.recv.open(two) == b"two"
    reply = server.send.seal(b"reply")
    with pytest.raises(ProtocolError):
        client.recv.open(reply[:-1] + bytes([reply[-1] ^ 1]))  # altered
    other = session.ciphers(B.encode(), sn, cn, server=True)
    with pytest.raises(ProtocolError):
        other.recv.open(client.send.seal(b"x"))  # another secret's key


def test_a_read_only_token_names_its_cluster_and_not_its_secret() -> None:
    token = session.read_only_token(A)
    assert token.startswith("ro1.") and A not in token
    assert session.cluster_id(token) == session.cluster_id(A)
    assert session.read_only_token(A) == token and session.read_only_token(B) != token
    with pytest.raises(ProtocolError):
        session.parse_nonce("zz", "nonce")


def test_the_raft_keyring_speaks_pysyncobj_s_format_and_rotates() -> None:
    plain = derive_fernet(A)  # what a node with password=A uses
    ring = RaftKeyring([A], derive_key)
    assert plain.decrypt(ring.encrypt_at_time(b"m", 5)) == b"m"
    assert ring.decrypt(plain.encrypt_at_time(b"m", 5)) == b"m"
    assert ring.extract_timestamp(plain.encrypt_at_time(b"m", 7)) == 7
    ring.set([A, B])  # step 1: accept B, seal with A
    assert plain.decrypt(ring.encrypt_at_time(b"m", 5)) == b"m"
    assert ring.decrypt(derive_fernet(B).encrypt_at_time(b"m", 5)) == b"m"
    ring.set([B])  # step 3: A is forgotten
    with pytest.raises(Exception):  # noqa: B017 - cryptography's InvalidToken
        ring.decrypt(plain.encrypt_at_time(b"m", 5))


def test_the_keyring_verifies_a_received_token_once_and_still_refuses_a_forged_one() -> None:
    plain = derive_fernet(A)
    ring = RaftKeyring([A], derive_key)
    token = plain.encrypt_at_time(b"m", 7)
    # pysyncobj's order: the timestamp, then the plaintext of that very token.
    assert ring.extract_timestamp(token) == 7
    assert ring.decrypt(token) == b"m"
    other = plain.encrypt_at_time(b"n", 9)
    assert ring.extract_timestamp(other) == 9
    assert ring.decrypt(plain.encrypt_at_time(b"o", 9)) == b"o"  # not the cached one
    assert ring.decrypt(other) == b"n"
    assert ring.decrypt(other) == b"n"  # decrypted again, the cache taken once
    forged = token[:-4] + (b"AAAA" if token[-4:] != b"AAAA" else b"BBBB")
    with pytest.raises(InvalidToken):
        ring.extract_timestamp(forged)
    with pytest.raises(InvalidToken):
        ring.extract_timestamp(derive_fernet(B).encrypt_at_time(b"m", 7))
    big = plain.encrypt_at_time(b"m", 2**40 + 3)
    assert ring.extract_timestamp(big) == plain.extract_timestamp(big) == 2**40 + 3
