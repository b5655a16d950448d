"""Faults, drawn at random from a seed, in rounds healed before the next round.

A round draws one or several faults, applies them at staggered instants, holds each
for its own while, heals each when its hold is over, and ends with everything healed
(links clean, nodes thawed and continued, clocks back, dead nodes restarted). Faults of
one round may overlap: the network rules, freezes, stops, clock offsets and deaths of
a node are the composition of every fault active on it (recomputed at each apply and
heal). Every fault is logged (wall times of its start and heal, its targets) so the
checker's findings can be placed on a timeline.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.nemesis.net import Net
from tests.nemesis.procs import Nodes

#: Every kind of fault, in the order the report lists them.
KINDS = ("kill", "kill_host", "stop", "freeze", "isolate_leader", "split", "bridge",
         "one_way", "slow", "loss", "restart_all", "clock", "power_cut")


@dataclass(slots=True, kw_only=True)
class Fault:
    """One fault as it happened.

    :var kind: one of :data:`KINDS`.
    :var targets: the nodes it hit (for splits: the groups).
    :var detail: its parameters (hold time, rate, loss, offset ...).
    :var start: wall time it was applied.
    :var healed: wall time it was healed (0 while active).
    :var effects: node -> what it does to that node (``down``, ``drop`` (a set of
        nodes), ``loss``, ``kbit``, ``dead``, ``stop``, ``freeze``, ``clock_ms``).
    """

    kind: str
    targets: Any
    detail: dict[str, Any] = field(default_factory=dict)
    start: float = 0.0
    healed: float = 0.0
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "targets": self.targets, "detail": self.detail,
                "start": round(self.start, 3), "healed": round(self.healed, 3)}


class Nemesis:
    """Applies and heals faults on ``nodes`` (their network ``net``)."""

    def __init__(self, net: Net, nodes: Nodes, rng: random.Random,
                 leader: Callable[[], str | None]) -> None:
        self.net, self.nodes, self.rng, self.leader = net, nodes, rng, leader
        self.log: list[Fault] = []
        self.active: list[Fault] = []
        #: What was last applied per node (network and process), to change only that.
        self._net_now: dict[str, tuple[Any, ...]] = {}
        self._proc_now: dict[str, tuple[bool, bool]] = {}

    def _pick(self, k: int = 1) -> list[str]:
        return self.rng.sample(self.nodes.ids, k)

    # ------------------------------------------------------------ drawing

    def draw(self, kind: str | None = None) -> Fault:
        """A fault (random kind unless given) with its targets, hold and effects."""
        rng, ids = self.rng, self.nodes.ids
        kind = kind or rng.choice(KINDS)
        hold = round(rng.uniform(2.0, 6.0), 2)
        f = Fault(kind=kind, targets=[])
        eff = f.effects

        def cut(a: list[str], b: list[str]) -> None:
            for x in a:
                eff.setdefault(x, {}).setdefault("drop", set()).update(b)
            for y in b:
                eff.setdefault(y, {}).setdefault("drop", set()).update(a)

        if kind == "kill":
            # The node process alone: its guard outlives it and certifies its death.
            f.targets = self._pick()
            eff[f.targets[0]] = {"dead": True}
        elif kind == "kill_host":
            # Node, guard and jobs at one instant (a lost host): no certificate, the
            # lease applies.
            f.targets = self._pick()
            eff[f.targets[0]] = {"dead": True, "host": True}
        elif kind == "stop":
            hold = round(rng.uniform(1.0, 8.0), 2)
            f.targets = self._pick()
            eff[f.targets[0]] = {"stop": True}
        elif kind == "freeze":
            hold = round(rng.uniform(1.0, 8.0), 2)
            f.targets = self._pick()
            eff[f.targets[0]] = {"freeze": True}
        elif kind == "isolate_leader":
            f.targets = [""]  # the leader at the instant it is applied
        elif kind == "split":
            shuffled = rng.sample(ids, len(ids))
            k = max(1, (len(ids) - 1) // 2)
            f.targets = [shuffled[:k], shuffled[k:]]
            cut(*f.targets)
        elif kind == "bridge":
            shuffled = rng.sample(ids, len(ids))
            k = (len(ids) - 1) // 2
            f.targets = [shuffled[:k], shuffled[k], shuffled[k + 1:]]
            cut(shuffled[:k], shuffled[k + 1:])
        elif kind == "one_way":
            a, b = self._pick(2)
            f.targets = [a, b]
            eff[a] = {"drop": {b}}
        elif kind in ("slow", "loss"):
            f.targets = list(ids) if rng.random() < 0.4 else self._pick()
            if kind == "slow":
                f.detail["kbit"] = rng.choice((128, 256, 512, 1024))
                for nid in f.targets:
                    eff[nid] = {"kbit": f.detail["kbit"]}
            else:
                f.detail["loss"] = round(rng.uniform(0.05, 0.30), 3)
                for nid in f.targets:
                    eff[nid] = {"loss": f.detail["loss"]}
        elif kind == "restart_all":
            hold = round(rng.uniform(1.0, 3.0), 2)
            f.targets = list(ids)
            for nid in ids:
                eff[nid] = {"dead": True}
        elif kind == "power_cut":
            # A majority loses power at the same instant (every node's journal drops
            # what it had not synced when killed, see procs.py): what the cluster
            # acknowledged must be on the disk of a node that stays up or comes back.
            hold = round(rng.uniform(1.0, 3.0), 2)
            f.targets = self._pick(len(ids) // 2 + 1)
            for nid in f.targets:
                eff[nid] = {"dead": True, "host": True}
        elif kind == "clock":
            f.targets = self._pick()
            offset = rng.choice((-1, 1)) * rng.randint(2_000, 15_000)
            f.detail["offset_ms"] = offset
            eff[f.targets[0]] = {"clock_ms": offset}
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        f.detail["hold_s"] = hold
        return f

    # ------------------------------------------------------------ rounds

    def run_one(self, kind: str | None = None) -> Fault:
        """One fault alone: apply it, hold it, heal it."""
        return self.run_round(1, kinds=[kind] if kind else None)[0]

    def run_round(self, k: int, *, spread_s: float = 0.0,
                  kinds: list[str] | None = None) -> list[Fault]:
        """``k`` faults, the i-th applied at a random instant within ``spread_s`` of the
        round's start (the first at once), each healed when its own hold is over; at
        the end everything is healed."""
        drawn = [self.draw(kinds[i] if kinds else None) for i in range(k)]
        offsets = sorted([0.0] + [round(self.rng.uniform(0, spread_s), 2)
                                  for _ in range(k - 1)])
        t0 = time.monotonic()
        # (monotonic instant, 0 apply / 1 heal, index): heals first at a tie.
        agenda = [(t0 + off, 0, i) for i, off in enumerate(offsets)]
        pending_heal: dict[int, float] = {}
        try:
            while agenda or pending_heal:
                nxt = min([(t, 1, i) for i, t in pending_heal.items()] + agenda)
                time.sleep(max(0.0, nxt[0] - time.monotonic()))
                _, what, i = nxt
                f = drawn[i]
                if what == 0:
                    agenda.remove(nxt)
                    self._apply(f)
                    pending_heal[i] = time.monotonic() + f.detail["hold_s"]
                else:
                    del pending_heal[i]
                    self._heal(f)
        finally:
            for f in list(self.active):
                self._heal(f)
            self.heal()
        return drawn

    def _apply(self, f: Fault) -> None:
        if f.kind == "isolate_leader":
            leader = self.leader() or self.rng.choice(self.nodes.ids)
            f.targets = [leader]
            f.effects = {leader: {"down": True}}
        f.start = time.time()
        self.log.append(f)
        self.active.append(f)
        self._sync(f.effects)

    def _heal(self, f: Fault) -> None:
        if f in self.active:
            self.active.remove(f)
            f.healed = time.time()
            self._sync(f.effects)

    def _wanted(self, nid: str) -> dict[str, Any]:
        """The composition of every active fault's effects on node ``nid``."""
        w: dict[str, Any] = {"down": False, "drop": set(), "keep": 1.0, "kbit": None,
                             "dead": False, "host": False, "stop": False, "freeze": False,
                             "clock_ms": 0}
        for f in self.active:
            e = f.effects.get(nid)
            if not e:
                continue
            w["down"] |= bool(e.get("down"))
            w["drop"] |= set(e.get("drop", ()))
            w["keep"] *= 1.0 - float(e.get("loss", 0.0))
            if e.get("kbit"):
                w["kbit"] = min(w["kbit"] or e["kbit"], e["kbit"])
            w["dead"] |= bool(e.get("dead"))
            w["host"] |= bool(e.get("host"))
            w["stop"] |= bool(e.get("stop"))
            w["freeze"] |= bool(e.get("freeze"))
            w["clock_ms"] += int(e.get("clock_ms", 0))
        return w

    def _sync(self, touched: dict[str, Any]) -> None:
        """Bring the nodes ``touched`` to what the active faults want."""
        nodes = self.nodes
        for nid in self.nodes.ids:
            if nid not in touched:
                continue
            w = self._wanted(nid)
            i = nodes.index(nid)
            net = (w["down"], tuple(sorted(w["drop"])), round(1 - w["keep"], 3), w["kbit"])
            was = self._net_now.get(nid, (False, (), 0.0, None))
            if was[1:] != net[1:]:
                if net[1:] == ((), 0.0, None):
                    self.net.heal(i)
                    was = (False, *was[1:])  # heal brings the link up
                else:
                    self.net.shape(i, drop_to=[nodes.index(x) for x in net[1]],
                                   loss=net[2], slow_kbit=net[3])
            if was[0] != net[0]:
                self.net.link(i, not net[0])
            self._net_now[nid] = net
            nodes.set_clock(nid, w["clock_ms"])
            if w["dead"]:
                if nodes.alive(nid):
                    # The node alone (its guard then kills its jobs and certifies the
                    # death), or the whole host at once.
                    nodes.kill(nid, host=w["host"])
                self._proc_now[nid] = (False, False)
                continue
            if not nodes.alive(nid):
                nodes.start(nid)
                self._proc_now[nid] = (False, False)
            frozen, stopped = self._proc_now.get(nid, (False, False))
            if w["freeze"] != frozen:
                nodes.freeze(nid, w["freeze"])
            if w["stop"] != stopped:
                nodes.signal(nid, signal.SIGSTOP if w["stop"] else signal.SIGCONT)
            self._proc_now[nid] = (w["freeze"], w["stop"])

    def heal(self) -> None:
        """Everything back to normal: links, freezes, stops, clocks, dead nodes."""
        for i, nid in enumerate(self.nodes.ids, 1):
            self.net.heal(i)
            self.nodes.freeze(nid, False)
            self.nodes.signal(nid, signal.SIGCONT)
            self.nodes.set_clock(nid, 0)
        self._net_now.clear()
        self._proc_now.clear()
        for nid in self.nodes.ids:
            if not self.nodes.alive(nid):
                self.nodes.start(nid)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for f in self.log:
            out[f.kind] += 1
        return out

    def active_at(self, t: float, margin: float = 5.0) -> list[dict[str, Any]]:
        """Faults active within ``margin`` s before wall time ``t`` (for findings)."""
        return [f.to_dict() for f in self.log
                if f.start - 0.5 <= t and (f.healed == 0 or f.healed + margin >= t)]
