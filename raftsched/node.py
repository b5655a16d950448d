"""The composition root: one raftsched node (Raft replica, API, leader loop, workers).

Everything node-local lives here or below: the wall clock is read here and stamped
into commands; liveness is observed here and committed as ``release``; the pure core
(state, trigger, misses, leader.plan) never sees a clock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
import uuid
import zoneinfo
from typing import Any

from raftsched import events
from raftsched.api import ApiServer
from raftsched.clock import now_ms, set_offset_ms
from raftsched.codec import packb
from raftsched.config import ClusterConfig, check_bind_safety, resolve_secret, split_addr
from raftsched.errors import (
    Conflict,
    InvalidArgument,
    LimitExceeded,
    NotReady,
    RaftschedError,
    from_wire,
)
from raftsched.guard import Guard
from raftsched.leaderloop import LeaderLoop
from raftsched.model import JobSpec
from raftsched.raft import RaftNode
from raftsched.state import MAX_PUT_BATCH
from raftsched.status import build_status
from raftsched.trigger import count_fires
from raftsched.worker import WorkerPool

log = logging.getLogger("raftsched.node")

#: How long a client write may keep retrying through elections before it fails.
WRITE_DEADLINE_S = 10.0
#: Effects that may give the leader something new to plan.
_LEADER_WAKERS = frozenset({"job_put", "job_resumed", "ended", "released", "node_joined",
                            "node_back", "restored", "created", "hb_new"})




class Node:
    """One node. Build it in the thread that will live as long as the node (pysyncobj's
    tick thread stops when its creating thread exits), then ``await run()``."""

    def __init__(self, cfg: ClusterConfig, node_id: str, *, environ: dict[str, str] | None = None,
                 metrics: Any = None) -> None:
        env = dict(os.environ if environ is None else environ)
        # Every replica must compute the same fire times: use the pinned tzdata package,
        # never the host's /usr/share/zoneinfo (which differs between machines).
        zoneinfo.reset_tzpath(to=[])
        self.cfg = cfg
        self.node_id = node_id
        self.me = cfg.node(node_id)
        self.secret = resolve_secret(cfg, env)
        check_bind_safety(cfg, node_id, self.secret)
        self.boot_ms = now_ms()
        self.fault = env.get("RAFTSCHED_FAULT", "")
        if env.get("RAFTSCHED_CLOCK_OFFSET_MS"):
            set_offset_ms(int(env["RAFTSCHED_CLOCK_OFFSET_MS"]))
        self.metrics = metrics
        self.loop: asyncio.AbstractEventLoop | None = None
        self.raft_to_id = {p.raft: p.id for p in cfg.nodes}
        self.last_ack_send = time.monotonic()
        self.fenced = False
        self._stop = asyncio.Event()
        # The journal and snapshots hold job env values in the clear: owner only.
        node_dir = cfg.node_data_dir(node_id)
        os.makedirs(node_dir, mode=0o700, exist_ok=True)
        try:
            os.chmod(node_dir, 0o700)
        except PermissionError:  # not ours (a mounted volume): say so, still run
            log.warning("cannot restrict %s to its owner; job env values in its journal "
                        "may be readable by others", node_dir)
        self.raft = RaftNode(
            self_addr=self.me.raft, peers=[p.raft for p in cfg.peers_of(node_id)],
            data_dir=cfg.node_data_dir(node_id), secret=self.secret, timing=cfg.timing,
            on_effects=self._effects_from_raft, history_limit=cfg.limits.history_limit,
            max_pending=cfg.limits.max_pending_commands)
        # The job processes inherit the node's environment, never the cluster secret.
        base_env = {k: v for k, v in env.items()
                    if not k.startswith("RAFTSCHED_") and k != (cfg.secret_env or "")}
        fence_after_s = cfg.timing.node_timeout_ms / 2000
        try:
            # Kills this node's job process groups if the node freezes (see guard.py).
            self.guard: Guard | None = Guard(os.path.join(node_dir, "guard"))
        except OSError as exc:
            log.warning("no guard process (%s): a frozen node's jobs keep running", exc)
            self.guard = None
        self.worker = WorkerPool(
            node_id=node_id, raft=self.raft, slots=self.me.workers,
            output_tail_bytes=cfg.limits.output_tail_bytes,
            allowed_call_prefixes=cfg.allowed_call_prefixes, base_env=base_env,
            on_started=metrics.run_started if metrics is not None else None, fault=self.fault,
            prestart_ms=cfg.timing.lookahead_ms * 4 // 5,
            fence_grace_s=fence_after_s / 4, guard=self.guard)
        self.leader = LeaderLoop(self)
        host, port = split_addr(self.me.api, "api")
        self.api = ApiServer(handler=self.handle, host=host, port=port, secret=self.secret,
                             node_id=node_id, max_frame_bytes=cfg.limits.max_frame_bytes,
                             max_connections=cfg.limits.max_connections,
                             idle_timeout_s=cfg.limits.idle_timeout_ms / 1000)

    # ------------------------------------------------------------ effects

    def _effects_from_raft(self, effects: list[tuple[Any, ...]]) -> None:
        """Raft thread: hand the effects to the event loop, do nothing else here."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_effects, effects)

    def _on_effects(self, effects: list[tuple[Any, ...]]) -> None:
        wake_worker = wake_leader = False
        me = self.node_id
        for eff in effects:
            kind = eff[0]
            if kind == "hb":
                self.leader.saw_heartbeat(eff[1], eff[2])
                continue
            if kind in _LEADER_WAKERS:
                wake_leader = True
            if kind == "assigned" and eff[2] == me:
                wake_worker = True
            elif kind == "cancel" and eff[2] == me:
                self.worker.cancel(eff[1])
            elif kind in ("released", "restored", "ended"):
                wake_worker = True
            if self.metrics is not None:
                self.metrics.effect(eff)
            self._event(eff)
        if wake_worker:
            self.worker.notify()
        if wake_leader:
            self.leader.wake()

    def _event(self, eff: tuple[Any, ...]) -> None:
        """Events for cluster-wide facts are written by the leader only (one line per
        fact in the cluster); a node writes its own worker's events itself."""
        kind = eff[0]
        leads = self.leader.active
        if kind == "assigned" and leads:
            events.emit("run.assigned", node=self.node_id, run_id=eff[1], assigned_to=eff[2],
                        fence=eff[3])
        elif kind == "ended" and leads:
            events.emit("run.ended", node=self.node_id, run_id=eff[1], outcome=eff[2],
                        ran_on=eff[3], reason=eff[4])
        elif kind == "missed" and leads:
            events.emit(f"run.{eff[2]}", node=self.node_id, run_id=eff[1], outcome=eff[2],
                        reason=eff[3], first_ms=eff[4], last_ms=eff[5], count=eff[6])
        elif kind == "released" and leads:
            events.emit("claim.released", node=self.node_id, lost_node=eff[1],
                        runs=eff[2], reason=eff[3])
        elif kind == "node_lost" and leads:
            events.emit("node.lost", node=self.node_id, lost_node=eff[1], reason=eff[2],
                        level=logging.WARNING)
        elif kind == "node_back" and leads:
            events.emit("node.back", node=self.node_id, back_node=eff[1])
        elif kind == "leader_changed":
            events.emit("leader.changed", node=self.node_id, leader=eff[1], term=eff[2])
        elif kind in ("job_put", "job_removed", "job_paused", "job_resumed") and leads:
            events.emit(f"job.{kind[4:]}", node=self.node_id, job_id=eff[1])
        elif kind in ("start_rejected", "finish_rejected") and eff[2] == self.node_id:
            events.emit(f"run.{kind}", node=self.node_id, run_id=eff[1], fence=eff[3],
                        current_fence=eff[4], level=logging.WARNING)

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.api.start()
        _LISTENING_FDS.extend(self.api.listening_fds())
        events.emit("node.started", node=self.node_id, api=self.me.api, raft=self.me.raft,
                    workers=self.me.workers)
        tasks = [asyncio.create_task(self.worker.run(), name="worker"),
                 asyncio.create_task(self.leader.run(), name="leader"),
                 asyncio.create_task(self._heartbeats(), name="heartbeat")]
        try:
            await self._stop.wait()
        finally:
            await self.api.close()
            self.leader.stop()
            await self.worker.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.raft.destroy()
            if self.guard is not None:
                self.guard.close()
            events.emit("node.stopped", node=self.node_id)

    def stop(self) -> None:
        self._stop.set()

    async def _heartbeats(self) -> None:
        """Tell the cluster this node lives; stop our runs if we cannot reach a quorum for
        half the node timeout (the leader releases them after the full timeout)."""
        period = self.cfg.timing.heartbeat_ms / 1000
        fence_after = self.cfg.timing.node_timeout_ms / 2000
        pending: asyncio.Future[Any] | None = None
        sent_at = 0.0
        while True:
            now = time.monotonic()
            if pending is None or pending.done():
                if pending is not None and pending.done() and not pending.cancelled() \
                        and pending.exception() is None:
                    self.last_ack_send = sent_at
                    self.fenced = False
                sent_at = now
                try:
                    pending = asyncio.wrap_future(self.raft.submit({
                        "op": "heartbeat", "node": self.node_id, "at": now_ms(),
                        "boot": self.boot_ms, "slots": self.me.workers, "queue": self.me.queue,
                        "tags": list(self.me.tags), "api": self.me.api}))
                except RaftschedError:
                    pending = None
            if self.guard is not None:
                # After our own self-fence would have killed a SIGTERM-proof run: from
                # the last acknowledged heartbeat, fence_after, up to 0.1 s until the
                # loop sees it, then its SIGKILL grace (fence_after / 4); a quarter
                # fence_after later the guard acts. The leader releases no sooner than
                # a whole node timeout (2 x fence_after) after it.
                self.guard.deadline(self.last_ack_send + fence_after * 1.5 + 0.1)
            if now - self.last_ack_send > fence_after and not self.fenced:
                self.fenced = True
                self.worker.self_fence("no quorum for %.1fs" % (now - self.last_ack_send))
            await asyncio.sleep(min(period, 0.1) if pending is not None and not pending.done()
                                else period)

    # ------------------------------------------------------------ API handler

    async def handle(self, op: str, args: dict[str, Any]) -> Any:
        fn = getattr(self, f"_op_{op}", None)
        if fn is None:
            raise InvalidArgument("op", f"unknown operation {op[:40]!r}")
        if not isinstance(args, dict):
            raise InvalidArgument("args", "must be a map")
        return await fn(args)

    async def submit_client(self, cmd: dict[str, Any], rid: Any) -> dict[str, Any]:
        """Commit a client command, retrying through elections with the same request id
        (the state machine answers a repeated id with the first reply)."""
        if rid is None:
            rid = uuid.uuid4().hex
        if not isinstance(rid, str) or not 0 < len(rid) <= 64:
            raise InvalidArgument("rid", "must be a string of 1..64 chars")
        cmd["rid"] = rid
        deadline = time.monotonic() + WRITE_DEADLINE_S
        delay = 0.05
        while True:
            cmd["at"] = now_ms()
            try:
                fut = asyncio.wrap_future(self.raft.submit(cmd))
                reply = await asyncio.wait_for(fut, max(deadline - time.monotonic(), 0.1))
                break
            except (NotReady, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise NotReady(f"no commit within {WRITE_DEADLINE_S:.0f}s: {exc}",
                                   maybe_committed=True) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        if not reply.get("ok"):
            raise from_wire(reply.get("error"))
        if reply.get("duplicate") and not _same_request(cmd, reply):
            # The state machine answers a repeated rid with the first reply; a rid reused
            # for another op or job must not be misreported as this one's result.
            raise Conflict("rid", "this request id was already used by a different "
                                  "request; use a new rid for a new request")
        return reply

    def _job_id(self, args: dict[str, Any]) -> str:
        job_id = args.get("id")
        if not isinstance(job_id, str) or not 0 < len(job_id) <= 128:
            raise InvalidArgument("id", "must be a job id")
        return job_id

    async def _op_put_job(self, args: dict[str, Any]) -> Any:
        spec = args.get("spec")
        size = len(packb(spec))
        if size > self.cfg.limits.max_spec_bytes:
            raise LimitExceeded("max_spec_bytes",
                                f"spec is {size} bytes, limit {self.cfg.limits.max_spec_bytes}")
        job = JobSpec.from_spec(spec, allowed_call_prefixes=self.cfg.allowed_call_prefixes)
        with self.raft.lock:
            exists = job.id in self.raft.state.jobs
            count = len(self.raft.state.jobs)
        if not exists and count >= self.cfg.limits.max_jobs:
            raise LimitExceeded("max_jobs", f"the cluster holds {count} jobs")
        reply = await self.submit_client({"op": "put_job", "spec": job.to_spec(),
                                          "max_jobs": self.cfg.limits.max_jobs},
                                         args.get("rid"))
        return {"job": reply["job"], "version": reply["version"], "created": reply["created"]}

    async def _op_put_jobs(self, args: dict[str, Any]) -> Any:
        """Bulk import of up to MAX_PUT_BATCH specs in one command (validated here first)."""
        specs = args.get("specs")
        if not isinstance(specs, list) or not 0 < len(specs) <= MAX_PUT_BATCH:
            raise InvalidArgument("specs", f"must be a list of 1..{MAX_PUT_BATCH} specs")
        # Per spec, as put_job does: a batch total would let one oversized spec through.
        limit = self.cfg.limits.max_spec_bytes
        for i, spec in enumerate(specs):
            if (size := len(packb(spec))) > limit:
                raise LimitExceeded("max_spec_bytes",
                                    f"specs[{i}] is {size} bytes, limit {limit}")
        normalized = [JobSpec.from_spec(s, allowed_call_prefixes=self.cfg.allowed_call_prefixes)
                      .to_spec() for s in specs]
        reply = await self.submit_client({"op": "put_jobs", "specs": normalized,
                                          "max_jobs": self.cfg.limits.max_jobs},
                                         args.get("rid"))
        return {"results": reply["results"]}

    async def _op_get_job(self, args: dict[str, Any]) -> Any:
        with self.raft.lock:
            return self.raft.state.job_view(self._job_id(args))

    async def _op_list_jobs(self, args: dict[str, Any]) -> Any:
        prefix = args.get("prefix") or ""
        limit = args.get("limit", 1000)
        if not isinstance(prefix, str) or isinstance(limit, bool) or not isinstance(limit, int) \
                or not 0 < limit <= 100_000:
            raise InvalidArgument("limit", "prefix must be a string, limit 1..100000")
        # Sorting a million ids takes ~0.3 s: never while holding the lock the Raft
        # thread needs to apply (that would cost an election).
        with self.raft.lock:
            ids = list(self.raft.state.jobs)
        ids = sorted(j for j in ids if j.startswith(prefix))
        with self.raft.lock:
            jobs = self.raft.state.jobs
            out = [jobs[j].to_dict() for j in ids[:limit] if j in jobs]
        return {"jobs": out, "total": len(ids)}

    async def _op_delete_job(self, args: dict[str, Any]) -> Any:
        reply = await self.submit_client({"op": "delete_job", "job": self._job_id(args)},
                                         args.get("rid"))
        return {"job": reply["job"], "deleted": True}

    async def _op_pause(self, args: dict[str, Any]) -> Any:
        reply = await self.submit_client({"op": "pause", "job": self._job_id(args)},
                                         args.get("rid"))
        return {"job": reply["job"], "version": reply["version"], "paused": True}

    async def _op_resume(self, args: dict[str, Any]) -> Any:
        job_id = self._job_id(args)
        catch_up = args.get("catch_up", False)
        if not isinstance(catch_up, bool):
            raise InvalidArgument("catch_up", "must be a boolean")
        missed = 0
        with self.raft.lock:
            rec = self.raft.state.jobs.get(job_id)
            if rec is not None and rec.spec.paused:
                # The count is informational (the record says how many were skipped).
                missed, _ = count_fires(rec.spec.schedule, rec.hwm_ms, now_ms(), 100_000)
        reply = await self.submit_client({"op": "resume", "job": job_id, "catch_up": catch_up,
                                          "missed": missed}, args.get("rid"))
        return {"job": reply["job"], "version": reply["version"], "paused": False,
                "skipped_fire_times": 0 if catch_up else missed}

    async def _op_trigger(self, args: dict[str, Any]) -> Any:
        force = args.get("force", False)
        if not isinstance(force, bool):
            raise InvalidArgument("force", "must be a boolean")
        reply = await self.submit_client({"op": "trigger", "job": self._job_id(args),
                                          "force": force}, args.get("rid"))
        return {"run_id": reply["run_id"], "state": reply["state"]}

    async def _op_runs(self, args: dict[str, Any]) -> Any:
        job_id = self._job_id(args)
        limit = args.get("limit", 100)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise InvalidArgument("limit", "must be 1..10000")
        with self.raft.lock:
            return {"job": job_id, "runs": self.raft.state.run_views(job_id, limit)}

    async def _op_status(self, args: dict[str, Any]) -> Any:
        return build_status(self)


#: The keys of a client command's reply, by op (a duplicate must have them too).
_REPLY_KEYS = {"put_job": ("job", "version", "created"), "put_jobs": ("results",),
               "delete_job": ("job",), "pause": ("job", "version"),
               "resume": ("job", "version"), "trigger": ("run_id", "state")}


def _same_request(cmd: dict[str, Any], reply: dict[str, Any]) -> bool:
    """Could ``reply`` (a deduplicated one) be the answer to ``cmd``?"""
    if set(reply) - {"ok", "duplicate"} != set(_REPLY_KEYS.get(cmd["op"], ())):
        return False
    if cmd["op"] == "put_job":
        return reply["job"] == cmd["spec"]["id"]
    if cmd["op"] == "trigger":
        return isinstance(reply["run_id"], str) and reply["run_id"].startswith(cmd["job"] + "@")
    return "job" not in cmd or reply.get("job") == cmd["job"]


#: Listening sockets of this process. pysyncobj forks a child to write each snapshot
#: (tens of seconds at a million jobs); a child that kept them would hold the node's
#: ports after the node stopped, and a restarted node could not bind them.
_LISTENING_FDS: list[int] = []


def _close_listeners_in_child() -> None:
    for fd in _LISTENING_FDS:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_close_listeners_in_child)


def run_node(config_path: str | None, node_id: str | None, data_dir: str | None = None) -> int:
    """``raftsched node``: run one node until SIGINT/SIGTERM; returns the exit code."""
    from raftsched.config import embedded_default, load_config
    from raftsched.errors import ConfigError
    from raftsched.metrics import Metrics, serve_metrics

    try:
        if config_path is None:
            cfg = embedded_default(data_dir or "./raftsched-data")
            node_id = node_id or cfg.nodes[0].id
        else:
            cfg = load_config(config_path)
            if node_id is None:
                if len(cfg.nodes) != 1:
                    raise ConfigError("--id", "the config has several nodes; name one with --id")
                node_id = cfg.nodes[0].id
            if data_dir is not None:
                from dataclasses import replace
                cfg = replace(cfg, data_dir=data_dir)
        events.configure(cfg.log.level, cfg.log.format)
        # The state is millions of small, long-lived, acyclic objects: collect rarely.
        gc.set_threshold(100_000, 50, 100)
        metrics = Metrics(node_id)
        node = Node(cfg, node_id, metrics=metrics)
    except (RaftschedError, OSError) as exc:
        import sys
        sys.stderr.write(f"error: {getattr(exc, 'code', 'os_error')}: {exc}\n")
        return 1
    server = None
    if node.me.metrics:
        try:
            server = serve_metrics(node.me.metrics, metrics, node)
            _LISTENING_FDS.append(server.socket.fileno())
        except OSError as exc:
            log.error("metrics endpoint %s: %s", node.me.metrics, exc)
            node.raft.destroy()
            return 1

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, node.stop)
        await node.run()

    try:
        asyncio.run(main())
    except OSError as exc:
        log.error("node %s could not start: %s", node_id, exc)
        node.raft.destroy()
        return 1
    finally:
        if server is not None:
            server.shutdown()
    return 0


__all__ = ["Node", "run_node"]
