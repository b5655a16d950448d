"""``raftsched.Scheduler``: a raftsched node inside your Python app — no server to install.

It runs the same node as ``raftsched node`` (Raft journal, API, worker pool) on a
thread of its own; the app's functions are its jobs, and this process runs them::

    sched = raftsched.Scheduler()          # RAFTSCHED_NODE_ID + RAFTSCHED_PEERS, or alone

    @sched.job(cron="*/5 * * * *", tz="Europe/Berlin", id="report")
    def report(ctx):                       # ctx is a raftsched.RunContext
        print("run", ctx.run_id, "fence", ctx.fence)

    sched.start()                          # stop() drains: running runs finish first

**Members.** ``Scheduler(config="cluster.toml", node_id="n2")`` is member ``n2`` of that
cluster; ``peers="n1=RAFT/API,n2=..."`` says the same in one line; with no arguments
``$RAFTSCHED_CONFIG`` or ``$RAFTSCHED_PEERS`` and ``$RAFTSCHED_NODE_ID`` are read (one
image serves every replica), else it is a single node (data in ./raftsched-embedded,
Raft/API on 127.0.0.1:7091/7191). See :mod:`raftsched.faces.embedconf`.

**Several processes on one host** (gunicorn ``-w 4``): the node's data dir is locked by
one process. The others start as *clients* of that node — their declarations,
``trigger()`` and ``runs()`` reach it, and they run no job — and keep trying the lock:
when the holder exits (or is killed), one of them takes the node over from the same
data dir within about a second.

**Declarations.** Every instance declares the same jobs. ``start()`` reconciles them in
the background (a member may start before the cluster has a quorum):
identical definitions are no new version, a changed one is one new version, callable
jobs declared nowhere in this process are reported (``report.undeclared``) and removed
only by ``reconcile(prune=True)``. :meth:`wait_declared` waits for it. An ``add_job``
after ``start()`` (in a ``with`` block) is a declaration too: it is put at once, counts
in the report, and its job is never reported undeclared; the log names undeclared jobs
once the declarations have been quiet for ``DECLARE_SETTLE_S`` (or at ``stop()``).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from raftsched.core.errors import DataDirLocked, InvalidArgument
from raftsched.faces import declare, embedconf
from raftsched.faces.declare import ReconcileReport, call_name
from raftsched.node.config.config import resolve_secret
from raftsched.node.datadir import DataDirLock
from raftsched.wire.client import Client
from raftsched.wire.secretfile import cluster_id, load_or_create_secret

log = logging.getLogger("raftsched.embedded")

DEFAULT_DATA_DIR = embedconf.DEFAULT_DATA_DIR
DEFAULT_RAFT_ADDR = embedconf.DEFAULT_RAFT_ADDR
DEFAULT_API_ADDR = embedconf.DEFAULT_API_ADDR
#: A client-mode process tries the data dir's lock this often (the takeover delay).
TAKEOVER_POLL_S = 0.25
#: Background declarations retry a cluster without quorum this often.
DECLARE_RETRY_S = 0.5
#: Jobs the app no longer declares are logged once its declarations have been quiet
#: this long after the start's reconciliation (or at stop, if sooner): the app may
#: still be declaring (``add_job`` in a ``with`` block runs after ``start()``), and a
#: job it is about to declare must not be named (the advice, prune, would delete it).
DECLARE_SETTLE_S = 5.0

_LIVE: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for sched in list(_LIVE):
        try:
            sched.stop()
        except Exception:  # noqa: BLE001 - exiting anyway
            log.exception("stopping the embedded scheduler at exit failed")


atexit.register(_stop_all_at_exit)


class Scheduler:
    """A member of a raftsched cluster in this process (see the module docstring).

    :param config: a cluster TOML (else ``$RAFTSCHED_CONFIG``).
    :param node_id: this member's id (else ``$RAFTSCHED_NODE_ID``).
    :param peers: the members in one line (else ``$RAFTSCHED_PEERS``).
    :param data_dir: overrides the config's (default ./raftsched-embedded).
    :param api, raft: the single-node default's loopback addresses.
    :param workers: how many runs this process executes at once.
    :param allow: module prefixes callables may come from (declared functions' modules
        are added).
    :param stop_timeout: seconds :meth:`stop` lets running runs finish (each also bounded
        by its job's timeout); their real outcome is recorded.
    :param handle_signals: on SIGTERM (when nothing else handles it) exit cleanly, so
        :meth:`stop` drains; app servers that handle SIGTERM themselves exit cleanly anyway.
    :param environ: the environment to read (default ``os.environ``).
    """

    def __init__(self, config: str | None = None, node_id: str | None = None, *,
                 peers: str | None = None, data_dir: str | None = None,
                 api: str | None = None, raft: str | None = None, workers: int = 4,
                 allow: tuple[str, ...] = (), stop_timeout: float = 30.0,
                 handle_signals: bool = True,
                 environ: dict[str, str] | None = None) -> None:
        if not 0 <= stop_timeout <= 3600:
            raise InvalidArgument("stop_timeout", "must be 0..3600 seconds")
        self.environ = dict(os.environ if environ is None else environ)
        cfg, self.node_id = embedconf.resolve(
            config=config, node_id=node_id, peers=peers, data_dir=data_dir, api=api,
            raft=raft, workers=workers, allow=tuple(allow), environ=self.environ)
        self.cfg = replace(cfg, timing=replace(cfg.timing,
                                               stop_timeout_ms=int(stop_timeout * 1000)))
        self.handle_signals = handle_signals
        #: "node" (this process runs the node and its jobs), "client" (another process
        #: on this host holds the data dir) or None (not started).
        self.role: str | None = None
        self._specs: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._node: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._client: Client | None = None
        self._stopping = threading.Event()
        self._declared = threading.Event()
        self._report: ReconcileReport | None = None
        self._declare_error: BaseException | None = None
        #: The put results of declarations made after start() (its report counts them).
        self._later: list[dict[str, Any]] = []
        self._last_declared = 0.0
        self._warned = False
        self._report_lock = threading.Lock()
        self._helpers: list[threading.Thread] = []

    # ------------------------------------------------------------ declarations

    def job(self, cron: str | None = None, *, every: Any = None, at: Any = None,
            tz: str | None = None, id: str | None = None,
            schedule: dict[str, Any] | None = None, **policy: Any) -> Callable[[Any], Any]:
        """Decorator: declare the function as a job (its import path is stored, never the
        function). ``id`` defaults to ``module.qualname``; other spec fields as keywords
        (``timeout="30s"``, ``overlap="skip"``, ``misfire={...}``, ``retries={...}``...)."""
        def decorate(func: Any) -> Any:
            self.add_job(func, cron=cron, every=every, at=at, tz=tz, id=id,
                         schedule=schedule, **policy)
            return func
        return decorate

    def add_job(self, func: Any, *, id: str | None = None, schedule: dict[str, Any] | None = None,
                cron: str | None = None, every: Any = None, at: Any = None,
                tz: str | None = None, **policy: Any) -> Any:
        """Declare ``func(ctx)`` (sync or ``async def``) as a job. Before :meth:`start` it
        is put by the start's reconciliation; after it, now (the put's result is
        returned: ``job``, ``version``, ``created``, ``changed``)."""
        spec = declare.build_spec(func, id=id, schedule=schedule, cron=cron, every=every,
                                  at=at, tz=tz, **policy)
        module = call_name(func)[0]
        with self._lock:
            self._specs[spec["id"]] = spec
            self._last_declared = time.monotonic()
            if module not in self.cfg.allowed_call_prefixes:
                self.cfg = replace(self.cfg, allowed_call_prefixes=(
                    *self.cfg.allowed_call_prefixes, module))
                if self._node is not None:
                    self._node.cfg = replace(self._node.cfg,
                                             allowed_call_prefixes=self.cfg.allowed_call_prefixes)
        if self._client is None:
            return None
        result = declare.put_declarations(self._client, [spec])[0]
        with self._report_lock:
            self._later.append(result)
        return result

    @property
    def declared(self) -> list[dict[str, Any]]:
        """The job specs this process declares."""
        with self._lock:
            return list(self._specs.values())

    def reconcile(self, *, prune: bool = False) -> ReconcileReport:
        """Put every declaration now (unchanged ones make no version) and report the
        callable jobs in the cluster this process does not declare; ``prune`` deletes them."""
        return declare.reconcile(self.client, self.declared, prune=prune)

    def wait_declared(self, timeout: float = 30.0) -> ReconcileReport:
        """Wait for the background reconciliation :meth:`start` began; its report, with
        the declarations made since (``add_job`` in a ``with`` block) counted in: a job
        declared by now is not ``undeclared``."""
        if not self._declared.wait(timeout):
            raise TimeoutError("the declarations were not committed in time (no quorum?)")
        if self._declare_error is not None:
            raise self._declare_error
        return self._current_report()

    def _current_report(self) -> ReconcileReport:
        with self._lock:
            declared = set(self._specs)
        with self._report_lock:
            assert self._report is not None
            return declare.with_later(self._report, list(self._later), declared)

    def _warn_undeclared(self) -> None:
        """Log the jobs this app no longer declares, once per start."""
        with self._report_lock:
            if self._warned or self._report is None:
                return
            self._warned = True
        undeclared = self._current_report().undeclared
        if undeclared:
            log.warning("jobs in the cluster that this app no longer declares (kept; "
                        "reconcile(prune=True) removes them): %s", ", ".join(undeclared[:20]))

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 30.0) -> Scheduler:
        """Start this member: the node in this process, or (another process on this host
        holds its data dir) a client of that node that takes it over when it goes.
        Raises what kept the node from starting (a taken port, a bad config)."""
        if self.role is not None:
            raise RuntimeError("already started")
        self._stopping.clear()
        self._declared.clear()
        with self._report_lock:
            self._report = self._declare_error = None
            self._later, self._warned = [], False
        me = self.cfg.node(self.node_id)
        try:
            self._start_node(timeout)
            self.role = "node"
        except DataDirLocked as exc:
            self._check_holder(exc, timeout)
            log.info("node %s runs in process %s on this host: this process is its client "
                     "and takes it over when that process goes", self.node_id, exc.pid)
            self.role = "client"
            self._spawn(self._takeover, "raftsched-takeover")
        secret = self._node.secret if self._node is not None else self._secret()
        others = [n.api for n in self.cfg.nodes if n.id != self.node_id]
        # Its own secret and cluster id: never another cluster that answers on a port.
        self._client = Client([me.api, *others], secret=secret, timeout=timeout,
                              cluster_id=cluster_id(secret) if secret else None,
                              tls_ca=self.cfg.tls_ca or "")
        _LIVE.add(self)
        self._install_signal_handler()
        self._spawn(self._declare, "raftsched-declare")
        if len(self.cfg.nodes) == 1:
            # A single node has its quorum: inside a with block the declared jobs exist
            # and reads see what was stored before (a consistent read waits for replay).
            try:
                self.wait_declared(timeout)
                self._client.list_jobs(limit=1)
            except BaseException:
                self.stop()
                raise
        return self

    def _check_holder(self, locked: DataDirLocked, timeout: float) -> None:
        """Client mode only with this very member in the other process (another worker
        of this app): it must answer on this member's API as this cluster's node
        ``node_id`` within ``timeout`` (it may still be booting); else ``locked`` is
        raised (another program holds the data dir, e.g. a node on other ports)."""
        secret = self._secret()
        me = self.cfg.node(self.node_id)
        deadline = time.monotonic() + timeout
        with Client([me.api], secret=secret, timeout=min(timeout, 2.0),
                    cluster_id=cluster_id(secret) if secret else None,
                    tls_ca=self.cfg.tls_ca or "") as probe:
            while True:
                try:
                    if probe.status(stale=True)["node"] == self.node_id:
                        return
                    break
                except Exception:  # noqa: BLE001 - not (yet) this member's node
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.2)
        raise locked

    def _secret(self) -> str | None:
        secret = resolve_secret(self.cfg, self.environ)
        if secret is None:  # the holder made the data dir's secret before it locked it
            secret = load_or_create_secret(self.cfg.data_dir)[0]
        return secret

    def _start_node(self, timeout: float) -> None:
        self._ready.clear()
        self._error = None
        thread = threading.Thread(target=self._main, name="raftsched", daemon=True)
        thread.start()
        self._thread = thread
        if not self._ready.wait(timeout):
            raise TimeoutError("the embedded node did not start")
        if self._error is not None:
            thread.join(10)
            raise self._error

    def _main(self) -> None:
        import asyncio

        from raftsched.node.node import Node
        try:
            node = Node(self.cfg, self.node_id, environ=self.environ)
            # Stored calls passed the prefix check when they entered the cluster; the
            # callables of this node's journal run also before this process declares them.
            node.worker.allowed = None
            self._node = node
            asyncio.run(node.run(on_started=self._ready.set))
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._node = None
            self._ready.set()

    def _takeover(self) -> None:
        """Client mode: take the node over as soon as its data dir's lock is free."""
        node_dir = self.cfg.node_data_dir(self.node_id)
        while not self._stopping.wait(TAKEOVER_POLL_S):
            try:
                DataDirLock(node_dir, wait_s=0).release()  # a probe: is it free now?
            except (DataDirLocked, FileNotFoundError):
                continue
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._start_node(30.0)
                except DataDirLocked:
                    continue  # another process of this host was quicker
                except BaseException:  # noqa: BLE001 - keep serving as a client
                    log.exception("taking over the node failed; retrying")
                    time.sleep(1.0)
                    continue
                self.role = "node"
            log.info("this process took over node %s", self.node_id)
            self._declared.clear()
            self._declare()
            return

    def _declare(self) -> None:
        """Reconcile the declarations, waiting out a cluster without quorum; then, once
        the app's declarations are quiet, say which jobs it no longer declares."""
        while not self._stopping.is_set():
            try:
                report = self.reconcile()
                with self._report_lock:
                    self._report, self._declare_error = report, None
                break
            except Exception as exc:  # noqa: BLE001 - retried or handed to wait_declared
                if not declare.retriable(exc):
                    self._declare_error = exc
                    log.error("declaring the jobs failed: %s", exc)
                    break
                self._stopping.wait(DECLARE_RETRY_S)
        self._declared.set()
        if self._report is None:
            return
        done = time.monotonic()
        while True:
            quiet = time.monotonic() - max(done, self._last_declared)
            if quiet >= DECLARE_SETTLE_S or self._stopping.wait(DECLARE_SETTLE_S - quiet):
                break  # stop() has said it already, if it had anything to say
        self._warn_undeclared()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._helpers.append(thread)
        thread.start()

    def _install_signal_handler(self) -> None:
        # SIGTERM's default ends the process without cleanup: the runs would be lost.
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)

    @property
    def client(self) -> Client:
        """A client of this member's node (any member if it does not answer)."""
        if self._client is None:
            raise RuntimeError("start() the scheduler first")
        return self._client

    def trigger(self, job_id: str, force: bool = False) -> Any:
        return self.client.trigger(job_id, force=force)

    def runs(self, job_id: str, limit: int = 100) -> Any:
        return self.client.runs(job_id, limit=limit)

    def stop(self) -> None:
        """Drain and stop: leadership moves away first, nothing new starts here, running
        runs get up to ``stop_timeout`` and their real outcome is recorded. Idempotent."""
        self._warn_undeclared()  # the app has declared all it will, if not said yet
        self._stopping.set()
        with self._lock:
            node, thread = self._node, self._thread
            self._node = self._thread = None
        loop = getattr(node, "loop", None)
        if node is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(node.stop)
        if thread is not None:
            thread.join(self.cfg.timing.stop_timeout_ms / 1000 + 15)
        for helper in self._helpers:
            if helper is not threading.current_thread():
                helper.join(5)
        self._helpers.clear()
        if self._client is not None:
            self._client.close()
        _LIVE.discard(self)
        self.role = None

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # A clean exit (status 0: the stop that was asked for): atexit stops every live
    # scheduler (a drain), then the process ends.
    sys.exit(0)
