"""Process hygiene shared by the node's children."""

from __future__ import annotations

import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a forked child: be SIGKILLed when the node process dies, so a dead or stopped
    node leaves nothing running behind the cluster's back (Linux; best effort
    elsewhere). Used for job processes and for pysyncobj's snapshot writer."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001, S110 - not Linux: nothing to do
        pass
