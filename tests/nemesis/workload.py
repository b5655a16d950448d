"""The nemesis workload: scheduled jobs that leave witness lines, a writer that keeps
changing side jobs through random nodes, readers that check what they read, and a
status monitor that measures when no leader answers.

All of it runs in the root namespace and talks to the nodes through the bridge.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from raftsched.core.durations import parse_duration
from raftsched.wire.client import Client
from tests.nemesis.checker import Op, Read

#: The side jobs the writer changes (paused: they never run, only their specs matter).
SIDE_KEYS = tuple(f"side{i}" for i in range(4))


def witness_command(path: str, sleep_s: float, tick_s: float = 0.2) -> list[str]:
    """argv that appends JSON lines to ``path``: ``phase`` start, a tick every ``tick_s``
    while it runs (a killed run's last tick bounds when it was still alive), then end."""
    from tests.support.harness import witness_command as base
    return base(path, sleep_s, phases=True, tick_s=tick_s)


def job_specs(rng: random.Random, n: int, witness: str) -> list[dict[str, Any]]:
    """``n`` jobs every 1 or 2 s, policies mixed, each running 0.5-3 s."""
    specs = []
    for i in range(n):
        every = rng.choice((1, 2))
        dur = round(rng.uniform(0.5, 3.0), 2)
        specs.append({
            "id": f"w{i:02d}",
            "schedule": {"every": f"{every}s"},
            "command": witness_command(witness, dur),
            "timeout": "20s",
            "on_node_lost": ("retry", "fail")[i % 2],
            "overlap": rng.choice(("skip", "allow", "queue", "replace")),
            "misfire": {"policy": rng.choice(("skip", "once", "all")),
                        "grace": rng.choice(("1s", "2s", "5s")), "max_catchup": 3},
        })
    return specs


#: The concurrency key the keyed workload jobs share, and its max.
CONC_KEY, CONC_MAX = "nemesis-warehouse", 2
#: The keyed jobs: every 2 s (aligned: they fire at one instant), short runs, so that
#: three of them compete for two places without a queue that outgrows the run.
KEYED = tuple(f"k{i}" for i in range(3))


def keyed_specs(witness: str) -> list[dict[str, Any]]:
    """Jobs sharing :data:`CONC_KEY` (issue 32 item 4): at most CONC_MAX execute at once."""
    return [{"id": job, "schedule": {"every": "2s"},
             "command": witness_command(witness, 0.3 + 0.2 * i), "timeout": "20s",
             "on_node_lost": ("retry", "fail")[i % 2], "overlap": "skip",
             "concurrency": {"key": CONC_KEY, "max": CONC_MAX}}
            for i, job in enumerate(KEYED)]


def dep_specs(witness: str, first_job: str) -> list[dict[str, Any]]:
    """Dependent jobs (issue 32 item 1): one after ``first_job``'s successes, one after
    two keyed jobs' runs of the same fire time whatever their outcome (fan-in)."""
    return [{"id": "d0", "after": [first_job], "command": witness_command(witness, 0.2),
             "timeout": "20s", "on_node_lost": "fail", "overlap": "allow"},
            {"id": "d1", "after": [KEYED[0], KEYED[1]], "on": "always",
             "command": witness_command(witness, 0.2), "timeout": "20s",
             "on_node_lost": "retry", "overlap": "allow"}]


def side_spec(key: str, seq: int) -> dict[str, Any]:
    """A side job whose spec says ``seq`` in two fields (a read mixing versions shows)."""
    return {"id": key, "schedule": {"every": f"{3600 + seq}s"}, "paused": True,
            "command": ["true", str(seq)]}


def read_seq(view: dict[str, Any]) -> tuple[int | None, bool]:
    """(seq, partial) from a ``get_job`` reply."""
    spec = view.get("spec", view)
    try:
        seq = int(spec["command"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None, True
    try:
        every_ms = parse_duration(str(spec.get("schedule", {}).get("every", "")), "every")
    except ValueError:
        return seq, True
    return seq, every_ms != (3600 + seq) * 1000


def _client(addrs: list[str], rng: random.Random, secret: str, timeout: float) -> Client:
    """A client that tries a random node first, then the others."""
    start = rng.randrange(len(addrs))
    return Client(addrs[start:] + addrs[:start], secret=secret, timeout=timeout)


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", type(exc).__name__))


class Writer(threading.Thread):
    """Puts, changes and deletes the side jobs through random nodes, one at a time;
    every op is recorded with its outcome (acknowledged, or unknown)."""

    def __init__(self, addrs: list[str], secret: str, seed: int) -> None:
        super().__init__(name="nemesis-writer", daemon=True)
        self.addrs, self.secret = addrs, secret
        self.rng = random.Random(seed)
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            key = self.rng.choice(SIDE_KEYS)
            self.seq += 1
            kind = "delete" if self.rng.random() < 0.25 else "put"
            op = Op(key=key, seq=self.seq, kind=kind, start=time.monotonic())
            with self.lock:
                self.ops.append(op)
            try:
                with _client(self.addrs, self.rng, self.secret, 3.0) as c:
                    if kind == "put":
                        c.put_job(side_spec(key, self.seq))
                    else:
                        c.delete_job(key)
                op.ok = True
            except Exception as exc:  # noqa: BLE001 - an unknown outcome, recorded
                if kind == "delete" and _code(exc) == "unknown_job":
                    op.ok = True  # nothing to delete: absent, as a delete leaves it
            if op.ok:
                op.end = time.monotonic()
            self.stop.wait(0.05)


class Reader(threading.Thread):
    """Reads side jobs from random nodes and records what each read returned."""

    def __init__(self, addrs: list[str], secret: str, seed: int) -> None:
        super().__init__(name=f"nemesis-reader-{seed}", daemon=True)
        self.addrs, self.secret = addrs, secret
        self.rng = random.Random(seed)
        self.reads: list[Read] = []
        self.errors = 0
        #: When (wall) each failed read failed: the checker wants them near a fault.
        self.error_times: list[float] = []
        self.stop = threading.Event()

    def read_once(self, key: str, final: bool = False) -> Read | None:
        start = time.monotonic()
        try:
            with _client(self.addrs, self.rng, self.secret, 2.0) as c:
                view = c.get_job(key)
            seq, partial = read_seq(view)
        except Exception as exc:  # noqa: BLE001 - only an answer counts as a read
            if _code(exc) != "unknown_job":
                self.errors += 1
                self.error_times.append(time.time())
                return None
            seq, partial = None, False
        rd = Read(key=key, seq=seq, start=start, end=time.monotonic(), final=final,
                  partial=partial)
        self.reads.append(rd)
        return rd

    def run(self) -> None:
        while not self.stop.is_set():
            self.read_once(self.rng.choice(SIDE_KEYS))
            self.stop.wait(0.05)


class Monitor(threading.Thread):
    """Polls every node's ``status`` from the root namespace; records when a node
    answered saying it leads with a quorum (wall time)."""

    def __init__(self, addrs: dict[str, str], secret: str, interval: float = 0.2) -> None:
        super().__init__(name="nemesis-monitor", daemon=True)
        self.addrs, self.secret, self.interval = addrs, secret, interval
        self.up: list[tuple[float, str]] = []
        self.polls = 0
        self.leaders: dict[str, int] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def _poll(self, nid: str, addr: str) -> None:
        while not self.stop.is_set():
            t = time.time()
            try:
                with Client([addr], secret=self.secret, timeout=1.0) as c:
                    st = c.status()
                if st.get("leader") == nid and st.get("health") != "down":
                    with self.lock:
                        self.up.append((t, nid))
                        self.leaders[nid] = self.leaders.get(nid, 0) + 1
            except Exception:  # noqa: BLE001, S110 - not answering is what we measure
                pass
            with self.lock:
                self.polls += 1
            self.stop.wait(max(0.0, self.interval - (time.time() - t)))

    def run(self) -> None:
        threads = [threading.Thread(target=self._poll, args=(nid, a), daemon=True)
                   for nid, a in self.addrs.items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def leader(self) -> str | None:
        """The node that last answered as leader, if within the last second."""
        with self.lock:
            t, nid = self.up[-1] if self.up else (0.0, None)
        return nid if time.time() - t < 1.0 else None
