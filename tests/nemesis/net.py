"""Network plumbing for the nemesis: one network namespace per node, veth pairs into a
bridge in the root namespace, and ``tc`` egress rules inside a node's namespace.

Only the subnet :data:`SUBNET` is used; only namespaces and links this module creates
(names start with :data:`PREFIX` and the run's tag) are touched. This kernel has no
netem/prio/gact and no iptables (see shared/research/fault-injection-here.md): a drop
is an htb class whose qdisc is ``pfifo limit 0``, random loss a classic-BPF filter into
that class, slowness an htb rate.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess

#: Every name this module creates starts with this (stale leftovers are found by it).
PREFIX = "rsnem"
#: The private test subnet: the bridge holds .1, node i (1-based) holds .10+i.
SUBNET = "10.213.0"
BRIDGE_ADDR = f"{SUBNET}.1"
#: Where the cgroup v1 freezer lives on this machine.
FREEZER = "/sys/fs/cgroup/freezer"

#: tc classes inside a node's namespace.
_PASS, _DROP, _SLOW = "1:1", "1:2", "1:3"


class NetError(RuntimeError):
    """An ``ip``/``tc`` command failed (the command and its stderr are in the message)."""


def sh(*argv: str, check: bool = True) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    if check and res.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
    return res.stdout


def node_addr(index: int) -> str:
    """The address of node ``index`` (1-based)."""
    return f"{SUBNET}.{10 + index}"


def new_tag() -> str:
    """A per-run tag: PREFIX + 4 hex digits (interface names stay <= 15 characters)."""
    return PREFIX + secrets.token_hex(2)


def available() -> str | None:
    """None if namespaces, veths and a bridge can be made here; else why not."""
    if os.geteuid() != 0:
        return "the nemesis needs root (network namespaces, tc, cgroup freezer)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2)"
    if not os.path.isdir(FREEZER):
        return f"no cgroup v1 freezer at {FREEZER}"
    tag = new_tag()
    try:
        sh("ip", "netns", "add", f"{tag}-probe")
        sh("ip", "link", "add", f"{tag}-pb", "type", "bridge")
    except NetError as exc:
        return f"cannot create a network namespace or bridge: {exc}"
    finally:
        sh("ip", "link", "del", f"{tag}-pb", check=False)
        sh("ip", "netns", "del", f"{tag}-probe", check=False)
    return None


class Net:
    """The namespaces, veths and bridge of one run; :meth:`close` removes all of it."""

    def __init__(self, tag: str, n: int) -> None:
        self.tag = tag
        self.n = n
        self.bridge = f"{tag}-br"
        self.created: list[tuple[str, str]] = []  # ("netns"|"link", name), in order

    def ns(self, i: int) -> str:
        return f"{self.tag}-n{i}"

    def host_veth(self, i: int) -> str:
        return f"{self.tag}-h{i}"

    def ns_veth(self, i: int) -> str:
        return f"{self.tag}-v{i}"

    def up(self) -> None:
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            self.created.append(("link", self.bridge))
            sh("ip", "addr", "add", f"{BRIDGE_ADDR}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for i in range(1, self.n + 1):
                ns, h, v = self.ns(i), self.host_veth(i), self.ns_veth(i)
                sh("ip", "netns", "add", ns)
                self.created.append(("netns", ns))
                sh("ip", "link", "add", h, "type", "veth", "peer", "name", v)
                self.created.append(("link", h))
                sh("ip", "link", "set", v, "netns", ns)
                sh("ip", "link", "set", h, "master", self.bridge)
                sh("ip", "link", "set", h, "up")
                sh("ip", "-n", ns, "addr", "add", f"{node_addr(i)}/24", "dev", v)
                sh("ip", "-n", ns, "link", "set", v, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for kind, name in reversed(self.created):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self.created.clear()

    # ------------------------------------------------------------------ faults

    def link(self, i: int, up: bool) -> None:
        """Cut node ``i`` off completely (its host-side veth down), or reconnect it."""
        sh("ip", "link", "set", self.host_veth(i), "up" if up else "down")

    def _tc(self, i: int, *args: str, check: bool = True) -> None:
        sh("ip", "netns", "exec", self.ns(i), "tc", *args, check=check)

    def _qdisc(self, i: int, slow_kbit: int | None = None) -> None:
        """A fresh htb root on node ``i``'s egress: pass, drop and (maybe) slow classes."""
        v = self.ns_veth(i)
        self._tc(i, "qdisc", "del", "dev", v, "root", check=False)
        self._tc(i, "qdisc", "add", "dev", v, "root", "handle", "1:", "htb", "default", "1")
        self._tc(i, "class", "add", "dev", v, "parent", "1:", "classid", _PASS,
                 "htb", "rate", "10gbit")
        self._tc(i, "class", "add", "dev", v, "parent", "1:", "classid", _DROP,
                 "htb", "rate", "10gbit")
        self._tc(i, "qdisc", "add", "dev", v, "parent", _DROP, "handle", "20:",
                 "pfifo", "limit", "0")
        if slow_kbit is not None:
            rate = f"{slow_kbit}kbit"
            self._tc(i, "class", "add", "dev", v, "parent", "1:", "classid", _SLOW,
                     "htb", "rate", rate, "ceil", rate)
            self._tc(i, "qdisc", "add", "dev", v, "parent", _SLOW, "handle", "30:",
                     "pfifo", "limit", "100")

    def shape(self, i: int, *, drop_to: list[int] = (), loss: float = 0.0,  # type: ignore[assignment]
              slow_kbit: int | None = None) -> None:
        """Egress rules on node ``i``: drop everything to the nodes ``drop_to``, lose a
        fraction ``loss`` of all other packets at random, and/or cap the rate."""
        v = self.ns_veth(i)
        self._qdisc(i, slow_kbit)
        for j in drop_to:
            self._tc(i, "filter", "add", "dev", v, "parent", "1:", "protocol", "ip",
                     "prio", "1", "u32", "match", "ip", "dst", f"{node_addr(j)}/32",
                     "flowid", _DROP)
        if loss > 0:
            thr = int((1 - loss) * 2**32)
            code = f"4,32 0 0 4294963256,37 0 1 {thr},6 0 0 4294967295,6 0 0 0"
            self._tc(i, "filter", "add", "dev", v, "parent", "1:", "protocol", "ip",
                     "prio", "2", "bpf", "bytecode", code, "flowid", _DROP)
        if slow_kbit is not None:
            self._tc(i, "filter", "add", "dev", v, "parent", "1:", "protocol", "ip",
                     "prio", "3", "u32", "match", "u32", "0", "0", "flowid", _SLOW)

    def heal(self, i: int) -> None:
        """Node ``i`` back to a clean link: no egress rules, host-side veth up."""
        self._tc(i, "qdisc", "del", "dev", self.ns_veth(i), "root", check=False)
        self.link(i, True)


def clean_stale() -> list[str]:
    """Remove namespaces, links and freezer groups left by earlier runs (by PREFIX),
    after killing (by pid) whatever still runs in those namespaces and groups."""
    removed: list[str] = []
    for line in sh("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            for pid in sh("ip", "netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in sh("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(": ")
        if len(parts) > 1:
            name = parts[1].split("@")[0]
            if name.startswith(PREFIX):
                sh("ip", "link", "del", name, check=False)
                removed.append(name)
    if os.path.isdir(FREEZER):
        for name in os.listdir(FREEZER):
            if name.startswith(PREFIX):
                from tests.nemesis.procs import remove_freezer
                remove_freezer(os.path.join(FREEZER, name))
                removed.append(name)
    return removed
