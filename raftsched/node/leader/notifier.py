"""The leader's webhook sender: delivers the pending notifications of the replicated state.

Runs on every node; acts only while this node leads (its leadership record committed).
Each round copies the due deliveries through ``raft.read`` (``core.notify.due``), posts
them outside it (a thread each, at most ``MAX_INFLIGHT`` at once), and commits each
attempt's result as a ``notified`` command: delivered (a 2xx answer), retry after the
``[notify]`` backoff, or given up after ``attempts``. The body is the JSON the state
holds; the request is signed (``raftsched/wire/webhook.py``). A new leader picks up
whatever is still pending — also a delivery the old leader made but could not commit:
at least once, with the same ``X-Raftsched-Delivery`` key.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from raftsched.core import notify, notifydata, queries, ticks
from raftsched.core.commands import Command, NotifyDefault, NotifyResults
from raftsched.core.errors import RaftschedError
from raftsched.node.observe import events
from raftsched.node.observe.clock import SYSTEM_CLOCK, Clock
from raftsched.wire import webhook

if TYPE_CHECKING:
    from raftsched.node.config.notifyconfig import NotifyConfig
    from raftsched.node.replica.port import ReplicaPort

log = logging.getLogger("raftsched.notify")

#: Deliveries in flight at once (each a thread blocked on its receiver).
MAX_INFLIGHT = 8
#: Pending deliveries are looked at least this often while leading.
ROUND_S = 0.25
#: With none pending or in flight, or while not leading, this often: a new delivery
#: (its NotifyPending effect) and this node's leadership (the leader loop's
#: ``on_lead``) wake the notifier at once, so this only bounds a missed wake.
IDLE_ROUND_S = 2.0
COMMIT_TIMEOUT_S = 5.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer we do not follow (it would resend a signed body)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect())


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> str:
    """POST ``body``; "" when the receiver answered 2xx, else what went wrong."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            resp.read(65536)
            status = resp.status
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{type(reason).__name__}: {reason}"[:200]
    return "" if 200 <= status < 300 else f"HTTP {status}"


class Leadership(Protocol):
    """The leader loop's leadership as it stands (``LeaderLoop``)."""

    #: Its leadership record for :attr:`term` committed (plans of that term count).
    active: bool
    #: The term it leads, or last led, in (None before it ever led).
    term: int | None


class Notifier:
    """See the module docstring. Runs on the node's event loop.

    :param raft: the replica: the pending deliveries are read and the results committed
        through it.
    :param leader: the leader loop (deliveries are made only while it leads).
    :param cfg: the ``[notify]`` table (the cluster default, timeouts, retries).
    :param secret: the cluster secret the signing key is derived from, once, here.
    :param node_id: this node's id (named in the events).
    :param missing_feature: the members whose heartbeats do not announce a feature
        (``applyops``): the default is committed only once every member knows it.
    """

    def __init__(self, *, raft: ReplicaPort, leader: Leadership, cfg: NotifyConfig,
                 secret: str | None, node_id: str,
                 missing_feature: Callable[[str], list[str]],
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.raft = raft
        self.leader = leader
        self.node_id = node_id
        self.missing_feature = missing_feature
        self.cfg = cfg
        self.key = webhook.notify_key(secret or "")
        self.inflight: set[str] = set()
        self._default_term: int | None = None
        self._wake = asyncio.Event()
        self._user_agent = "raftsched"

    def wake(self) -> None:
        self._wake.set()

    def _leading(self) -> int | None:
        lead = self.leader
        term = self.raft.leader_term()
        return term if lead.active and term is not None and term == lead.term else None

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        while True:
            self._wake.clear()
            term = self._leading()
            # Deliveries pending (a retry's later time) or in flight, or this term's
            # default not yet committed: look again in a round.
            busy = False
            if term is not None:
                try:
                    await self._sync_default(term)
                    busy = self._default_term != term
                    free = MAX_INFLIGHT - len(self.inflight)
                    if free > 0:
                        due, pending = self.raft.read(functools.partial(
                            _due, self.clock.now_ms(), self.inflight, free))
                        busy = busy or pending
                        for d in due:
                            self.inflight.add(d.key)
                            task = asyncio.create_task(self._deliver(d))
                            tasks.add(task)
                            task.add_done_callback(tasks.discard)
                    busy = busy or bool(self.inflight)
                except Exception:  # noqa: BLE001 - the loop must survive a bug in one round
                    busy = True
                    log.exception("notify round failed")
            try:
                # Idle: a bound only, on the loop's shared grid (core/ticks.py).
                await asyncio.wait_for(self._wake.wait(), ROUND_S if busy else ticks.coalesced(
                    self.clock.monotonic(), IDLE_ROUND_S))
            except TimeoutError:
                pass

    async def _sync_default(self, term: int) -> None:
        """Commit our ``[notify]`` default once per term when the state's differs."""
        if self._default_term == term:
            return
        if self.missing_feature("notify"):
            return  # an older member would refuse the command (a rolling upgrade)
        want = self.cfg.default
        have = self.raft.read(queries.notify_default)
        if have != want:
            reply = await self._commit(NotifyDefault(
                at=self.clock.now_ms(), term=term, spec=want.to_spec() if want else None))
            if not reply or not reply.get("ok"):
                return
        self._default_term = term

    async def _deliver(self, d: notifydata.Delivery) -> None:
        try:
            body = json.dumps(d.body, sort_keys=True, separators=(",", ":")).encode()
            ts = int(time.time())  # the real wall clock: the receiver checks it against its own
            attempt = d.attempts + 1
            headers = {"Content-Type": "application/json", "User-Agent": self._user_agent,
                       webhook.DELIVERY_HEADER: d.key, webhook.ATTEMPT_HEADER: str(attempt),
                       webhook.TIMESTAMP_HEADER: str(ts),
                       webhook.SIGNATURE_HEADER: webhook.sign(self.key, ts, body)}
            error = await asyncio.to_thread(post, d.url, body, headers,
                                            self.cfg.timeout_ms / 1000)
            if not error:
                item: list[Any] = [d.key, True, "", None]
            elif attempt >= self.cfg.attempts:
                item = [d.key, False, error, None]
            else:
                item = [d.key, False, error, self.clock.now_ms() + self.cfg.delay_ms(attempt)]
            outcome = "delivered" if not error else ("failed" if item[3] is None else "retry")
            # The URL may hold a token: events name its host only.
            events.emit(f"notify.{outcome}", node=self.node_id, run_id=d.run_id,
                        delivery=d.key, attempt=attempt, host=urlsplit(d.url).hostname,
                        error=error or None,
                        level=logging.INFO if not error else logging.WARNING)
            # Not a leader any more: the new one delivers again (same key), so the
            # result is still worth committing if it can be.
            await self._commit(NotifyResults(at=self.clock.now_ms(), items=(tuple(item),)))
        except Exception:  # noqa: BLE001 - one delivery's bug must not stop the others
            log.exception("notification %s failed", d.key)
        finally:
            self.inflight.discard(d.key)
            self._wake.set()

    async def _commit(self, cmd: Command) -> dict[str, Any] | None:
        try:
            fut = asyncio.wrap_future(self.raft.submit(cmd))
            reply: dict[str, Any] = await asyncio.wait_for(fut, COMMIT_TIMEOUT_S)
            return reply
        except (RaftschedError, TimeoutError) as exc:
            log.debug("%s not committed: %s", cmd.OP, exc)
            return None


def _due(now: int, inflight: set[str], limit: int, st: Any) -> tuple[list[Any], bool]:
    """(the deliveries due now, whether any is pending at all)."""
    return notify.due(st, now, inflight, limit), bool(st.notify.pending)


def with_status(state: Any, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run views with their notification status (``notify``) where they have one."""
    status = state.notify.status
    for r in runs:
        s = status.get(r.get("run_id"))
        if s is not None:
            r["notify"] = dict(s)
    return runs


__all__ = ["Notifier", "post", "with_status"]
