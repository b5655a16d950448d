"""Test-only faults, put into real node processes from outside, so production code
carries no test switch: a ``sitecustomize`` on the node's ``PYTHONPATH`` (see
:func:`fault_env`) installs the fault named by ``RS_TEST_FAULT`` before the node starts,
by wrapping one method of the node's code.

* ``exit_after_claim``: the node exits (status 137, as a SIGKILL) the moment its worker
  sees a run assigned to it, holding the claim (the crashed claim holder of
  tests/faults/test_cluster_faults.py and of the W3 benchmark).
* ``unanswered_heartbeat``: once, after the worker has started 3 runs, one heartbeat
  commits but its acknowledgement never comes back, as pysyncobj does for a command
  forwarded to a leader that died (tests/faults/test_guard_lease.py).
* ``hang_on_stop``: the node's shutdown never ends, right before it releases Raft, the
  guard and its data dir (tests/cluster/test_data_dir.py: the stop watchdog ends it).
* ``announce_no_http``: the node's heartbeats leave ``http`` out of the commands it
  knows, as a member of the release before HTTP jobs (tests/cluster/test_http_jobs.py).

Only a node process (``python -m raftsched node``) gets the fault: its job processes
inherit its environment, this ``sitecustomize`` included, and must start as fast as
any job's (importing the node's code into each would make every run late). A fault
that cannot be installed (the code it wraps moved) ends the node at once with status
70 and says why: a node that ran without its fault would pass or fail a test for the
wrong reason.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: The repository root (the source tree the nodes import).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The environment variable naming the fault.
FAULT_ENV = "RS_TEST_FAULT"
FAULTS = ("exit_after_claim", "unanswered_heartbeat", "hang_on_stop", "announce_no_http")

_SITE = """\
from tests.support import faulthooks
faulthooks.install_from_env()
"""


def hook_dir(tmp: str) -> str:
    """A directory holding the ``sitecustomize`` that installs the fault; it goes first
    on a node's ``PYTHONPATH`` (the source root after it)."""
    path = os.path.join(tmp, "faulthooks-site")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(_SITE)
    return path


def fault_env(tmp: str, fault: str) -> dict[str, str]:
    """What a node's environment needs for ``fault`` (add it to ``Cluster.start``'s
    ``env``)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    return {"PYTHONPATH": os.pathsep.join([hook_dir(tmp), ROOT]), FAULT_ENV: fault}


def is_node_process(argv: list[str]) -> bool:
    """Whether ``argv`` (a full command line) runs ``python -m raftsched node``."""
    return any(argv[i:i + 3] == ["-m", "raftsched", "node"] for i in range(len(argv)))


def install_from_env() -> None:
    fault = os.environ.get(FAULT_ENV)
    if not fault or not is_node_process(list(getattr(sys, "orig_argv", ()))):
        return
    try:
        install(fault)
    except Exception as exc:  # noqa: BLE001 - said, then the process ends
        sys.stderr.write(f"faulthooks: cannot inject {fault!r}: {exc!r}\n")
        sys.stderr.flush()
        os._exit(70)


def install(fault: str) -> Callable[[], None]:
    """Install ``fault`` in this process; returns what undoes it."""
    if fault == "exit_after_claim":
        from raftsched.node.worker.worker import WorkerPool

        def exit_on_claim(orig: Any) -> Any:
            def _sync_claims(self: Any, st: Any) -> Any:
                mine, moved = orig(self, st)
                if mine:
                    os._exit(137)  # die holding the claim
                return mine, moved
            return _sync_claims

        return _wrap(WorkerPool, "_sync_claims", exit_on_claim)
    if fault == "unanswered_heartbeat":
        from raftsched.node.worker.liveness import Liveness

        def drop_one_ack(orig: Any) -> Any:
            def __init__(self: Any, *args: Any, **kw: Any) -> None:
                orig(self, *args, **kw)
                self.raft = _UnansweredHeartbeat(self.raft, self)
            return __init__

        return _wrap(Liveness, "__init__", drop_one_ack)
    if fault == "announce_no_http":
        from raftsched.node.worker.liveness import Liveness

        def older_release(orig: Any) -> Any:
            def __init__(self: Any, *args: Any, **kw: Any) -> None:
                orig(self, *args, **kw)
                self.features = tuple(f for f in self.features if f != "http")
            return __init__

        return _wrap(Liveness, "__init__", older_release)
    if fault == "hang_on_stop":
        from raftsched.node.node import Node

        def hang(orig: Any) -> Any:
            def _release(self: Any) -> None:
                time.sleep(3600)  # a shutdown that never ends
                orig(self)
            return _release

        return _wrap(Node, "_release", hang)
    raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def _wrap(cls: type, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    orig = cls.__dict__[name]  # KeyError when the code moved: see the module docstring
    setattr(cls, name, make(orig))
    return lambda: setattr(cls, name, orig)


class _UnansweredHeartbeat:
    """The liveness loop's replica port: once the worker has started 3 runs, one
    heartbeat is submitted (it commits) but the future returned never resolves."""

    def __init__(self, raft: Any, liveness: Any) -> None:
        self._raft = raft
        self._liveness = liveness
        self._armed = True

    def submit(self, cmd: Any, *args: Any, **kw: Any) -> Any:
        fut = self._raft.submit(cmd, *args, **kw)
        if self._armed and self._liveness.worker.counters.started >= 3:
            self._armed = False
            logging.getLogger("raftsched.node").warning(
                "test fault: a heartbeat left unanswered")
            return concurrent.futures.Future()
        return fut

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raft, name)
