"""Which of the ports a command is about to listen on are taken, and by whom.

``raftsched local`` checks every port of its layout before it starts anything: beside a
running ``raftsched node`` it half-started (n1 restart-looping on its taken port, n2
and n3 forming a cluster) and its banner pointed at the other cluster's API. A node
checks its own before it writes anything: started in the wrong directory beside a
running node, it left a stray ``./raftsched-data`` behind when its bind failed. The holder
is found from ``/proc/net/tcp{,6}`` (the listening socket's inode) and the ``/proc/*/fd``
links naming it; a holder this user may not inspect stays unnamed.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

#: A socket listening, in /proc/net/tcp's ``st`` column.
_LISTEN = "0A"


@dataclass(frozen=True, kw_only=True)
class TakenPort:
    """A port something else listens on."""

    addr: str
    """The ``host:port`` that could not be bound."""
    what: str
    """What would have listened there (``n1 api``)."""
    pid: int | None
    """The holder's pid, when it can be found."""
    command: str | None
    """The holder's command line (shortened), when it can be read."""
    problem: str = "in use"
    """Why it cannot be listened on (``in use``, or the system's word for it)."""

    def describe(self) -> str:
        held = self.problem
        if self.pid is not None:
            held += f" by pid {self.pid}" + (f" ({self.command})" if self.command else "")
        return f"port {self.addr} ({self.what}) is {held}"


def _bind_problem(host: str, port: int) -> str | None:
    """None if ``host:port`` can be listened on now, else why not."""
    # SO_REUSEADDR as the nodes' own servers set it: a connection of an earlier run
    # still in TIME_WAIT is no obstacle, a listener is.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use"
            return f"not available ({exc.strerror or exc})"
    return None


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != _LISTEN:
                        continue
                    if int(fields[1].rpartition(":")[2], 16) == port:
                        inodes.add(fields[9])
        except (OSError, ValueError):
            continue
    inodes.discard("0")  # a socket of another network namespace or user: not findable
    return inodes


def holder(port: int) -> tuple[int | None, str | None]:
    """The pid (and command line) of a process listening on TCP ``port``, if visible."""
    links = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not links:
        return None, None
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry.name}/fd/{fd}") in links:
                    return int(entry.name), _command(int(entry.name))
            except OSError:
                continue
    return None, None


def _command(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    # One line, whatever the holder's argv holds (``python -c`` scripts hold newlines).
    text = " ".join(" ".join(a.decode("utf-8", "replace").split()) for a in argv if a)
    return text if len(text) <= 100 else text[:97] + "..."


def taken(wanted: list[tuple[str, str]]) -> list[TakenPort]:
    """Of ``(what, "host:port")`` pairs, those that cannot be listened on now."""
    out = []
    for what, addr in wanted:
        host, _, port_text = addr.rpartition(":")
        host = host.strip("[]")
        port = int(port_text)
        problem = _bind_problem(host, port)
        if problem is not None:
            pid, command = holder(port)
            out.append(TakenPort(addr=addr, what=what, pid=pid, command=command,
                                 problem=problem))
    return out


class PortsTaken(OSError):
    """A node's ports are held by other processes: it started nothing."""

    code = "port_in_use"

    def __init__(self, node_id: str, busy: list[TakenPort]) -> None:
        super().__init__(errno.EADDRINUSE, "; ".join(t.describe() for t in busy))
        self.node_id = node_id
        self.busy = busy

    def __str__(self) -> str:
        them = "it" if len(self.busy) == 1 else "them"
        return (f"{self.strerror}; node {self.node_id} started nothing (no data dir, no "
                f"secret made): stop what holds {them}, or give this node other ports")


def node_ports(raft: str, api: str, metrics: str | None, http: str | None,
               node_id: str) -> list[tuple[str, str]]:
    """``(what, addr)`` of every port node ``node_id`` would listen on."""
    out = [(f"{node_id} raft", raft), (f"{node_id} api", api)]
    out += [(f"{node_id} metrics", metrics)] if metrics else []
    out += [(f"{node_id} http", http)] if http else []
    return out


def refuse_taken(node_id: str, wanted: list[tuple[str, str]]) -> None:
    """PortsTaken naming each holder when any of ``wanted`` cannot be listened on."""
    busy = taken(wanted)
    if busy:
        raise PortsTaken(node_id, busy)


__all__ = ["PortsTaken", "TakenPort", "holder", "node_ports", "refuse_taken", "taken"]
