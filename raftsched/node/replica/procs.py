"""Process hygiene shared by the node's children."""

from __future__ import annotations

import ctypes
import signal
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a forked child that runs Python (pysyncobj's snapshot writer): be SIGKILLed
    when the node process dies (Linux; best effort elsewhere). Never as a job's
    ``preexec_fn``: code between fork and exec in a threaded process can deadlock; job
    processes die with their node through the guard instead."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001, S110 - not Linux: nothing to do
        pass


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


#: glibc's ``malloc_trim``, looked up once (None elsewhere).
_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``; nothing
    where there is no such call). After a log compaction: the dropped entries were big
    ``bytes`` objects in the malloc heap (not in Python's own arenas), and their pages
    stayed in the node's RSS until entries as big came again. ctypes releases the GIL
    for the call."""
    if _TRIM is not None:
        _TRIM(0)
