"""A message sent while a sealed connection's key exchange is under way is held back.

With a secret, pysyncobj's outgoing connection is open (and takes messages) one round
trip before its key exchange ends; a message sent in that window carries no key, and
the peer drops the connection for it. A restarted node's pre-vote ask did so (a 1M
restart: its connection to the leader dropped at once, and came back only with the
next attempt, ``connectionRetryTime`` = 0.5 s, later). Real replicas, real loopback TCP,
ticked by the test (``tests/support/raftcluster.py``), so the window is held open
exactly: the peer is not ticked until the message has been sent.
"""

from __future__ import annotations

import pytest
from pysyncobj.tcp_connection import CONNECTION_STATE

from tests.support.raftcluster import Cluster

pytestmark = pytest.mark.timeout(120)


def _sync(c: Cluster, nid: str):
    return c.nodes[nid].sync


def _peer(c: Cluster, nid: str, other: str):
    transport = _sync(c, nid)._SyncObj__transport
    return transport, transport._nodeAddrToNode[c.addr[other]]


def test_a_message_sent_before_the_key_exchange_ends_does_not_cost_the_connection(
        cluster) -> None:
    c = cluster
    # pysyncobj connects from the higher address to the lower.
    hi, lo = sorted(c.nodes, key=lambda n: c.addr[n], reverse=True)[:2]
    transport, lo_node = _peer(c, hi, lo)
    connected = _sync(c, hi)._SyncObj__connectedNodes
    c.until(lambda: lo_node in connected, "first connection")

    # The connection drops (a peer restarting) and hi dials again at once; lo does not
    # run, so the exchange stops half way: open on hi's side, its key not answered.
    transport._connections[lo_node].disconnect()
    c.paused = set(c.nodes) - {hi}
    conn = c.until(lambda: (transport._connections[lo_node].state
                            == CONNECTION_STATE.CONNECTED) and transport._connections[lo_node],
                   "hi's half-open connection")
    assert lo_node not in connected
    attempt = transport._lastConnectAttempt[lo_node]

    # What a restarted node's pre-vote does in that window (pysyncobj's vote request too).
    assert transport.send(lo_node, {"type": "rs_ping"}) is False

    c.paused = set()
    c.until(lambda: lo_node in connected, "the exchange finished")
    # The same connection, never dropped and dialled again.
    assert transport._connections[lo_node] is conn
    assert conn.state == CONNECTION_STATE.CONNECTED
    assert transport._lastConnectAttempt[lo_node] == attempt
    c.run_for(0.3)
    assert lo_node in connected and transport._lastConnectAttempt[lo_node] == attempt
