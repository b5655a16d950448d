"""Process hygiene shared by the node's children."""

from __future__ import annotations

import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a forked child that runs Python (pysyncobj's snapshot writer): be SIGKILLed
    when the node process dies (Linux; best effort elsewhere). Never as a job's
    ``preexec_fn``: code between fork and exec in a threaded process can deadlock; job
    processes die with their node through the guard instead."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001, S110 - not Linux: nothing to do
        pass
