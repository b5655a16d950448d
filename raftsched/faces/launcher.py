"""Loopback clusters of ``python -m raftsched node`` processes: the one launcher.

``raftsched local``, the integration tests' harness (``tests/support/harness.py``)
and the benchmarks (``bench/cluster.py``) all start nodes through here: one address
layout (free ports, or ``local``'s fixed base-port layout), one config writer, one way
to spawn a node process (its own session, so a kill of its group reaches its children)
and one way to stop them. :class:`LoopbackCluster` tracks every process it started and
kills them at :meth:`LoopbackCluster.close`; nothing else is ever signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from raftsched.wire.client import Client

#: The metric holding a node's longest Raft lock hold since it started.
LOCK_HOLD_MAX = "raftsched_raft_lock_hold_max_seconds"


@dataclass(frozen=True, kw_only=True)
class NodeAddrs:
    """Where one loopback node listens."""

    id: str
    """The node id (``n1``, ``n2``, ...)."""
    raft: str
    """Its Raft address, ``127.0.0.1:port``."""
    api: str
    """Its client API address."""
    metrics: str
    """Its ``/metrics`` address."""
    http: str | None = None
    """Its HTTP API and dashboard address, None: none."""


#: Ports handed out on this machine lately, by any process (a file each call locks):
#: a port is free when it is chosen and taken only when its node binds it, so two
#: launches at once (parallel test workers, a benchmark beside them) must not be handed
#: the same one in between. Not handed out again for PORT_HOLD_S.
PORT_REGISTRY = os.path.join(tempfile.gettempdir(), "raftsched-ports-handed-out")
PORT_HOLD_S = 600.0


@contextlib.contextmanager
def _handed_out() -> Iterator[dict[int, float]]:
    """The ports handed out within PORT_HOLD_S (port -> when), held under the registry's
    lock; what the caller adds is written back. Without a usable registry file: empty."""
    try:
        f = open(PORT_REGISTRY, "a+", encoding="ascii")  # noqa: SIM115 - held below
    except OSError:
        yield {}
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now = time.time()
        held: dict[int, float] = {}
        for line in f.read().split():
            port, _, at = line.partition("@")
            with contextlib.suppress(ValueError):
                if now - float(at) < PORT_HOLD_S:
                    held[int(port)] = float(at)
        yield held
        f.seek(0)
        f.truncate()
        f.write("".join(f"{p}@{t:.0f}\n" for p, t in held.items()))


def reserve_ports(ports: list[int]) -> bool:
    """Record ``ports`` as handed out, unless one of them was lately (then False)."""
    with _handed_out() as held:
        if any(p in held for p in ports):
            return False
        now = time.time()
        held.update((p, now) for p in ports)
        return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now and not handed out by this
    function lately (see PORT_REGISTRY)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    with _handed_out() as held:
        try:
            for _ in range(50 * n):
                if len(ports) == n:
                    break
                s = socket.socket()
                socks.append(s)  # kept bound meanwhile: the kernel picks another next
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
                if port not in held and port not in ports:
                    ports.append(port)
        finally:
            for s in socks:
                s.close()
        now = time.time()
        held.update((p, now) for p in ports)
    if len(ports) < n:
        raise OSError(f"could not find {n} free ports")
    return ports


def free_layout(n: int, *, http: bool = False) -> list[NodeAddrs]:
    """``n`` nodes ``n1..`` on free ports (with an HTTP address each if ``http``)."""
    ports = free_ports(4 * n)
    return [NodeAddrs(id=f"n{i + 1}", raft=f"127.0.0.1:{ports[i]}",
                      api=f"127.0.0.1:{ports[n + i]}", metrics=f"127.0.0.1:{ports[2 * n + i]}",
                      http=f"127.0.0.1:{ports[3 * n + i]}" if http else None)
            for i in range(n)]


def base_layout(n: int, base: int) -> list[NodeAddrs]:
    """``raftsched local``'s layout: raft base+i, api base+100+i, metrics base+200+i,
    HTTP API and dashboard base+300+i."""
    return [NodeAddrs(id=f"n{i}", raft=f"127.0.0.1:{base + i}", api=f"127.0.0.1:{base + 100 + i}",
                      metrics=f"127.0.0.1:{base + 200 + i}", http=f"127.0.0.1:{base + 300 + i}")
            for i in range(1, n + 1)]


def config_text(nodes: list[NodeAddrs], *, data_dir: str, secret_env: str,
                allowed_call_prefixes: list[str] | None = None,
                limits: Mapping[str, Any] | None = None,
                timing: Mapping[str, Any] | None = None, log_level: str | None = None,
                workers: int = 4, queue: int | None = None,
                tags: Mapping[str, list[str]] | None = None,
                cluster_extra: Mapping[str, str] | None = None) -> str:
    """A cluster config (TOML) for ``nodes``: a section is written only when given
    (``timing={}`` writes an empty ``[timing]``); ``tags`` writes every node's list;
    ``cluster_extra`` adds ``[cluster]`` keys (TLS paths, secret_file)."""
    lines = ["[cluster]", f"data_dir = {json.dumps(data_dir)}",
             f"secret_env = {json.dumps(secret_env)}"]
    if allowed_call_prefixes is not None:
        lines.append(f"allowed_call_prefixes = {json.dumps(list(allowed_call_prefixes))}")
    lines += [f"{k} = {json.dumps(v)}" for k, v in (cluster_extra or {}).items()]
    lines.append("")
    if limits:
        lines += ["[limits]"] + [f"{k} = {json.dumps(v)}" for k, v in limits.items()] + [""]
    if timing is not None:
        lines += ["[timing]"] + [f"{k} = {json.dumps(v)}" for k, v in timing.items()] + [""]
    lines += ["[log]", 'format = "json"']
    if log_level is not None:
        lines.append(f"level = {json.dumps(log_level)}")
    lines.append("")
    for node in nodes:
        lines += ["[[nodes]]", f'id = "{node.id}"', f'raft = "{node.raft}"',
                  f'api = "{node.api}"', f'metrics = "{node.metrics}"']
        if node.http is not None:
            lines.append(f'http = "{node.http}"')
        lines.append(f"workers = {workers}")
        if queue is not None:
            lines.append(f"queue = {queue}")
        if tags is not None:
            lines.append(f"tags = {json.dumps(list(tags.get(node.id, [])))}")
        lines.append("")
    return "\n".join(lines)


def node_argv(config: str, node_id: str) -> list[str]:
    """The command line of one node process (this Python)."""
    return [sys.executable, "-m", "raftsched", "node", "--config", config, "--id", node_id]


def spawn_node(config: str, node_id: str, *, env: Mapping[str, str] | None = None,
               stderr: int | IO[Any], text: bool = False,
               cwd: str | None = None) -> subprocess.Popen[Any]:
    """Start one node in a session of its own (its group is its pid), stdin and stdout
    closed, its log lines (stderr) to ``stderr``."""
    return subprocess.Popen(node_argv(config, node_id), stdout=subprocess.DEVNULL,
                            stderr=stderr, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                            text=text, start_new_session=True)


def terminate_procs(procs: Mapping[str, subprocess.Popen[Any]],
                    timeout: float) -> dict[str, float]:
    """SIGTERM every running process at once and wait; a process still running after
    ``timeout`` seconds (counted from the signal) is killed with its group. Returns the
    seconds until each of them exited."""
    t0 = time.monotonic()
    running = {k: p for k, p in procs.items() if p.poll() is None}
    for proc in running.values():
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    out: dict[str, float] = {}
    for key, proc in running.items():
        try:
            proc.wait(max(timeout - (time.monotonic() - t0), 0.1))
        except subprocess.TimeoutExpired:
            kill_group(proc)
        out[key] = time.monotonic() - t0
    return out


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGCONT (a stopped process dies too) and SIGKILL ``proc``'s group, and reap it."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``cond`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}"
                         + (f" (last error: {last_exc!r})" if last_exc else ""))


def json_lines(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (a log, a witness file); other lines, and
    a last line still being written, are skipped. Missing file: none."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
    except FileNotFoundError:
        pass
    return out


def scrape(addr: str, timeout: float = 5.0) -> dict[str, float]:
    """A node's ``/metrics`` at ``addr`` parsed as ``{"name{labels}": value}``."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout) as resp:  # noqa: S310
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


class LoopbackCluster:
    """``n`` nodes on free loopback ports under ``tmp``: the config in
    ``tmp/cluster.toml``, data in ``tmp/data``, each node's log in ``tmp/<id>.log``.

    ``pythonpath`` is put first on the nodes' ``PYTHONPATH`` (the source tree, so that
    ``call`` jobs find modules outside the package); ``env`` is added to every node's
    environment; ``http`` gives every node an
    HTTP API address (``self.http``). The config keywords are :func:`config_text`'s."""

    #: ``status`` and ``wait_leader`` defaults (seconds).
    status_timeout_s = 2.0
    leader_timeout_s = 20.0
    client_timeout_s = 10.0

    def __init__(self, tmp: str, n: int = 3, *, secret_env: str, secret: str | None = None,
                 pythonpath: str | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, http: bool = False, tls_ca: str | None = None,
                 **config: Any) -> None:
        self.tmp = tmp
        #: The CA this launcher's clients verify TLS nodes with (None: no TLS).
        self.tls_ca = tls_ca
        os.makedirs(tmp, exist_ok=True)
        self.n = n
        self.nodes = free_layout(n, http=http)
        self.ids = [a.id for a in self.nodes]
        self.raft = {a.id: a.raft for a in self.nodes}
        self.api = {a.id: a.api for a in self.nodes}
        self.metrics_addr = {a.id: a.metrics for a in self.nodes}
        #: The HTTP API/dashboard address of each node (only when ``http`` is set).
        self.http = {a.id: a.http for a in self.nodes if a.http is not None}
        self.secret = secret
        self.data_dir = os.path.join(tmp, "data")
        self.pythonpath = pythonpath
        self.cwd = cwd
        self.base_env = dict(env or {})
        if secret and secret_env:
            self.base_env[secret_env] = secret
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = {nid: os.path.join(tmp, f"{nid}.log") for nid in self.ids}
        self.config = os.path.join(tmp, "cluster.toml")
        with open(self.config, "w", encoding="utf-8") as f:
            f.write(config_text(self.nodes, data_dir=self.data_dir, secret_env=secret_env,
                                **config))

    # ---------------------------------------------------------------- processes

    def node_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        full = dict(os.environ)
        if self.pythonpath:
            full["PYTHONPATH"] = self.pythonpath + (
                os.pathsep + full["PYTHONPATH"] if full.get("PYTHONPATH") else "")
        full.update(self.base_env)
        full.update(env or {})
        return full

    def start(self, nid: str, env: Mapping[str, str] | None = None) -> None:
        """Start node ``nid`` (appending to its log); ``env`` is added to its environment."""
        if self.alive(nid):
            raise RuntimeError(f"{nid} is already running")
        with open(self.logs[nid], "ab") as log:
            self.procs[nid] = spawn_node(self.config, nid, env=self.node_env(env), stderr=log,
                                         cwd=self.cwd)

    def start_all(self, env: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Start every node; ``env`` maps a node id to what its environment gets."""
        for nid in self.ids:
            self.start(nid, (env or {}).get(nid))

    def alive(self, nid: str) -> bool:
        return nid in self.procs and self.procs[nid].poll() is None

    def pid(self, nid: str) -> int:
        return self.procs[nid].pid

    def signal(self, nid: str, sig: int) -> None:
        proc = self.procs[nid]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def kill(self, nid: str) -> float:
        """SIGKILL the node and reap it; returns the time of the kill (epoch seconds,
        taken just before the signal)."""
        t = time.time()
        self.signal(nid, signal.SIGKILL)
        self.procs[nid].wait(10)
        return t

    def guard_pid(self, nid: str) -> int | None:
        """The pid of ``nid``'s guard process (its child that runs guardproc.py), if any."""
        node = self.pid(nid)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != node:
                    continue
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"raftsched/node/worker/guardproc.py" in f.read():
                        return int(name)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def kill_host(self, nid: str) -> float:
        """SIGKILL the node's guard, then the node (a stand-in for losing its host: no
        witness is left to prove the node dead, so its runs wait for its lease); returns
        the time of the kill (epoch seconds, taken just before the first signal)."""
        t = time.time()
        guard = self.guard_pid(nid)
        # Both stopped first: neither may see the other die and act on it (the node
        # stops its runs when its guard goes; the guard certifies when its node goes).
        pids = [p for p in (guard, self.pid(nid)) if p is not None]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        self.procs[nid].wait(10)
        return t

    def terminate(self, nid: str, timeout: float = 20.0) -> float:
        """SIGTERM ``nid`` and wait (its group is killed after ``timeout``); seconds to exit."""
        return terminate_procs({nid: self.procs[nid]}, timeout).get(nid, 0.0)

    def terminate_all(self, timeout: float = 60.0) -> dict[str, float]:
        """SIGTERM every running node at once; seconds until each exited."""
        return terminate_procs(self.procs, timeout)

    def close(self) -> None:
        """Kill every node process started here (and its group)."""
        for proc in self.procs.values():
            kill_group(proc)

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- clients

    def client(self, nids: list[str] | None = None, timeout: float | None = None) -> Client:
        return Client([self.api[n] for n in (nids or self.ids)], secret=self.secret,
                      timeout=self.client_timeout_s if timeout is None else timeout,
                      tls_ca=self.tls_ca or "")

    def status(self, nid: str, timeout: float | None = None) -> dict[str, Any]:
        with Client([self.api[nid]], secret=self.secret, tls_ca=self.tls_ca or "",
                    timeout=self.status_timeout_s if timeout is None else timeout) as c:
            return c.status()

    def wait_leader(self, timeout: float | None = None, among: list[str] | None = None) -> str:
        """A leader that every live node of ``among`` (default: all) reports and that is
        alive; returns its id."""
        def agreed() -> str | None:
            live = [n for n in (among or self.ids) if self.alive(n)]
            leaders = {self.status(n)["leader"] for n in live}
            if len(leaders) == 1:
                leader = leaders.pop()
                if leader is not None and self.alive(leader):
                    return leader
            return None

        return wait_until(agreed, self.leader_timeout_s if timeout is None else timeout,
                          f"a leader agreed by {among or self.ids}")

    def events(self, nid: str) -> list[dict[str, Any]]:
        """The JSON lines of the node's log so far."""
        return json_lines(self.logs[nid])

    def scrape(self, nid: str, timeout: float = 5.0) -> dict[str, float]:
        """The node's ``/metrics``, parsed (see :func:`scrape`)."""
        return scrape(self.metrics_addr[nid], timeout)

    def lock_hold_max_ms(self) -> dict[str, float | None]:
        """Each running node's longest Raft lock hold since it started, ms (None: the
        node did not answer)."""
        out: dict[str, float | None] = {}
        for nid in self.ids:
            try:
                out[nid] = round(self.scrape(nid)[LOCK_HOLD_MAX] * 1000, 1)
            except (OSError, KeyError, ValueError):
                out[nid] = None
        return out


class StatusPoller:
    """Asks every node of ``cluster`` for ``status`` with a timeout, one thread per node
    (one slow answer must not hide the others'), while used as a context manager;
    :meth:`figures` sums up the answers."""

    def __init__(self, cluster: LoopbackCluster, timeout_s: float = 2.0,
                 every_s: float = 0.1) -> None:
        self.cluster, self.timeout_s, self.every_s = cluster, timeout_s, every_s
        self.samples: list[tuple[float, str, dict[str, Any] | None]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(nid,), daemon=True,
                                          name=f"status-poller-{nid}")
                         for nid in cluster.ids]

    def __enter__(self) -> StatusPoller:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self, nid: str) -> None:
        with Client([self.cluster.api[nid]], secret=self.cluster.secret,
                    timeout=self.timeout_s) as cl:
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    st: dict[str, Any] | None = cl.status()
                except Exception:  # noqa: BLE001 - unanswered is what we count
                    st = None
                # list.append is atomic: the threads share one list.
                self.samples.append((t, nid, st))
                self._stop.wait(self.every_s)

    def figures(self, since: float) -> dict[str, Any]:
        """From the first answer naming a leader (times in seconds after ``since``, a
        ``time.monotonic()``): seconds in which no status call was answered (over all
        nodes), the terms the nodes reported, and when the (leader, term) the answers
        ended with was first reported with no other answer after it (stable leader)."""
        samples = sorted(self.samples, key=lambda sample: sample[0])  # threads interleave
        answered = [(t, s) for t, _, s in samples if s is not None]
        led = [t for t, s in answered if s.get("leader")]
        if not led:
            raise AssertionError("no node ever reported a leader")
        first = min(led)
        end = max(t for t, _, _ in samples)
        ok_seconds = {int(t - first) for t, _ in answered if t >= first}
        gaps = [k for k in range(int(end - first)) if k not in ok_seconds]
        terms = sorted({s["term"] for t, s in answered if t >= first and s.get("leader")})
        after = [(t, (s.get("leader"), s.get("term"))) for t, s in answered if t >= first]
        final = after[-1][1]
        stable = first
        for k, (_t, view) in enumerate(after):
            if view != final and k + 1 < len(after):
                stable = after[k + 1][0]
        return {"first_leader_s": round(first - since, 2),
                "stable_leader_s": round(stable - since, 2),
                "unanswered_seconds": len(gaps),
                "unanswered_at_s": [round(first - since + k) for k in gaps],
                "terms": terms, "term_changes": len(terms) - 1,
                "polls": len(self.samples), "answered": len(answered)}
