"""The lease: how long a node acts on its last acknowledged heartbeat, and from when
the leader may therefore hand a disconnected node's started runs on.

Pure arithmetic on the configured node timeout (every node has the same), used by the
node (spawn gate, self-fence, guard deadline) and by the leader (release) so the two
sides of the argument cannot drift apart. The argument, in docs/concepts.md ("The
lease"): all times below count from the *send* time of the node's newest heartbeat the
cluster acknowledged, on the node's monotonic clock (its guard shares the host's).

- ``lease_ms``: the node spawns a run only within this of it (node/worker/gate.py) and
  at this age stops its runs itself (SIGTERM; SIGKILL ``kill_grace_ms`` later).
- ``guard_after_ms``: the guard SIGKILLs every job process group still there (the
  node frozen, its loop stalled); it polls every ``GUARD_POLL_MS``.
- ``lease_end_ms``: by then no process of the node runs and none will be spawned
  before the node has applied whatever the cluster committed meanwhile.
- ``release_after_ms``: the leader's wait, on its own monotonic clock, from the moment
  it applied that heartbeat (after its send): ``lease_end_ms`` scaled by the allowed
  clock-rate difference between two hosts, plus a margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: Two hosts' monotonic clocks may run this much apart in rate (NTP keeps them within
#: 500 ppm; 1 % leaves room for a VM's clock).
DRIFT = 0.01
#: The node's loop may see its own lease end this late (its heartbeat loop ticks every
#: 100 ms once a heartbeat is overdue).
FENCE_TICK_MS = 100
#: The guard looks at its deadline this often.
GUARD_POLL_MS = 50
#: Slack for the guard's or the node's loop running late on a loaded host (the kill
#: comes then), for the SIGKILL to take effect, and for the leader's 50 ms ticks.
MARGIN_MS = 250


def lease_ms(node_timeout_ms: int) -> int:
    """How long a heartbeat's acknowledgement lets a node spawn runs: half the node
    timeout, so a heartbeat or two lost, or an election, do not stop it."""
    return node_timeout_ms // 2


def idle_heartbeat_ms(node_timeout_ms: int, heartbeat_ms: int) -> int:
    """The heartbeat period of an idle node, one that has held no run since its previous
    heartbeat: a third of the node timeout (never shorter than ``heartbeat_ms``).

    Each heartbeat is a log entry every node appends, syncs and applies: at 0.5 s, three
    nodes' heartbeats were 6 of an idle cluster's 6.2 entries per second and most of
    its leader's CPU. An idle node needs no fresh lease (it has nothing to spawn), only
    to stay alive in the leader's eyes: two heartbeats may still be lost per node
    timeout. It is busy again (and heartbeats every ``heartbeat_ms``) as soon as a run
    is assigned to it, before it may spawn that run."""
    return max(heartbeat_ms, node_timeout_ms // 3)


#: How often an idle node's heartbeat entry is refreshed once every member reads Raft
#: contact as an idle node's liveness (``contact_heartbeat_ms``), in node timeouts.
CONTACT_REFRESH_TIMEOUTS = 10


def contact_heartbeat_ms(node_timeout_ms: int) -> int:
    """The heartbeat period of an idle node once every member lists the ``contact``
    feature: ten node timeouts (30 s by default).

    Between two, the node's Raft thread is what says it lives: the leader reads a
    follower that holds no run as alive while that follower answers its appends (it
    does every 300-400 ms by default, ``replica/pacing.py``), and the node reads its
    quorum from its leader's appends (or, leading, from a majority's answers). A
    heartbeat entry was still 3 of an idle cluster's 3.2 entries per second, each
    appended, synced and applied by every node: ~0.5 % of a core on the leader. The
    refresh keeps the node's record (its last heartbeat, clock skew) from growing older
    than this; a node that holds a run heartbeats at the busy period as before, and
    only its heartbeats count then."""
    return node_timeout_ms * CONTACT_REFRESH_TIMEOUTS


def contact_fits(node_timeout_ms: int, heard_every_s: float) -> bool:
    """Whether Raft contact heard every ``heard_every_s`` at the latest (a follower's
    answer interval, plus how often the leader reads them) leaves room in the node
    timeout to read an idle node's liveness from it: three such intervals per timeout.
    Else (a timing far from the defaults) idle nodes keep their heartbeats."""
    return heard_every_s * 3 <= node_timeout_ms / 1000


def majority_contact_age(peer_ages: list[float], voters: int) -> float | None:
    """A leader's contact with a quorum: seconds since enough of its ``peer_ages`` (since
    each follower last answered it) answered to make a majority of ``voters`` with
    itself; None when too few peers are known. A lone node is its own quorum (0)."""
    needed = voters // 2  # followers it needs beside itself
    if needed <= 0:
        return 0.0
    if len(peer_ages) < needed:
        return None
    return sorted(peer_ages)[needed - 1]


def fence_after_ms(node_timeout_ms: int, period_ms: int, heartbeat_ms: int) -> int:
    """How long after its newest acknowledged heartbeat's send a node heartbeating every
    ``period_ms`` counts its quorum lost and stops its runs: the lease, plus what a
    longer (idle) period adds, so a heartbeat in flight is given as long to commit as a
    busy node's. The spawn gate keeps the lease itself (an idle node whose lease ran
    out spawns only after its next acknowledgement)."""
    return lease_ms(node_timeout_ms) + max(0, period_ms - heartbeat_ms)


def kill_grace_ms(node_timeout_ms: int) -> int:
    """A self-fenced run's SIGTERM-to-SIGKILL grace."""
    return lease_ms(node_timeout_ms) // 4


def guard_after_ms(node_timeout_ms: int) -> int:
    """The guard's deadline: just after the node's own SIGKILL would have come."""
    return lease_ms(node_timeout_ms) + kill_grace_ms(node_timeout_ms) + FENCE_TICK_MS


def lease_end_ms(node_timeout_ms: int) -> int:
    """Nothing of the node runs any more, and nothing will start unseen."""
    return guard_after_ms(node_timeout_ms) + GUARD_POLL_MS


def release_after_ms(node_timeout_ms: int) -> int:
    """How long the leader waits after applying a disconnected node's newest heartbeat
    before it releases the node's started runs (at most the node timeout)."""
    wait = math.ceil(lease_end_ms(node_timeout_ms) * (1 + DRIFT)) + MARGIN_MS
    return min(wait, node_timeout_ms)


def release_verdict(*, silent_s: float, connected: bool, disconnected_s: float,
                    disconnect_grace_s: float, timeout_s: float, lease_wait_s: float,
                    lost: bool, assigned_released: bool, holds_assigned: Callable[[], bool],
                    lease_known: Callable[[], bool]) -> str | None:
    """What the leader releases of one node now, from how long ago it applied the node's
    newest heartbeat (``silent_s``) and how long its Raft connection has been down
    (the leader loop's liveness check; seconds on the leader's monotonic clock):

    - ``"silent"``: silent for the node timeout: lost, every claim released;
    - ``"lease"``: disconnected and its lease provably over (``lease_wait_s``, see
      above): lost, every claim released — its started runs, pre-started ones
      included, cannot be running or start any more;
    - ``"assigned"``: disconnected for ``disconnect_grace_s``: its not-yet-started runs
      (a start needs the fence);
    - None: nothing (already released, or nothing to release yet)."""
    if lost:
        return None
    if silent_s > timeout_s:
        return "silent"
    if not connected and silent_s > lease_wait_s and lease_known():
        return "lease"
    if (not connected and not assigned_released and disconnected_s >= disconnect_grace_s
            and holds_assigned()):
        return "assigned"
    return None
