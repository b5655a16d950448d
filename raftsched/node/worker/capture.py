"""What a Python callable printed or logged while it ran: the tail kept in its run record,
and all of it in the run's log on this node (prints to stdout; stderr, logging and a
traceback to stderr).

A callable shares the process's ``sys.stdout``, ``sys.stderr`` and loggers with the
app around it (the embedded Scheduler runs inside a web app). :func:`install` puts a
thin proxy in front of ``sys.stdout``/``sys.stderr`` (everything still reaches the
real stream) and a handler on the root logger; both also append to the tail of the
run whose code is executing, found through a context variable that :func:`running`
sets around the call (a thread of the call pool, or the task of an ``async def``).
Output of code that is not a run goes only where it always went.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any, TextIO

#: The tail of the run whose code runs in this context (None: not a run).
_current: contextvars.ContextVar[Tail | None] = contextvars.ContextVar("raftsched_run_output",
                                                                       default=None)
_install_lock = threading.Lock()
_installed = False


#: The first line of a tail whose output began before it.
CUT_MARK = "[earlier output not kept]\n"
#: Before the kept part when the cut fell inside a line (its start is not shown).
CUT_LINE = "..."  # ASCII: a tail is limited in bytes


def mark_cut(text: str, limit: int, before: str | None = None) -> str:
    """At most ``limit`` characters of the end of an output, ``text``, saying so where
    output was cut off: a tail that starts inside a line reads as a whole line (an
    error message missing its cause) unless it is marked.

    :param before: the character just before ``text`` in the output, when output
        before ``text`` was dropped already (None: ``text`` starts the output)."""
    if before is None and len(text) <= limit:
        return text
    room = limit - len(CUT_MARK) - len(CUT_LINE)
    if room < len(CUT_MARK):  # a tail too small to hold the mark too: the bare end
        return text[-limit:]
    if len(text) > room:
        before, text = text[-room - 1], text[-room:]
    return CUT_MARK + ("" if before == "\n" else CUT_LINE) + text


class Tail:
    """The last ``limit`` characters written, thread-safe (a callable may start threads
    that inherit nothing, but its own thread and an async task write here); with a
    ``log`` (the run's :class:`~raftsched.node.worker.runlog.RunLog`), all of it goes there
    too, stdout and stderr apart."""

    def __init__(self, limit: int, log: Any = None) -> None:
        self.limit = max(int(limit), 1)
        self.log = log
        self._parts: list[str] = []
        self._size = 0
        #: The character before the kept text, once some was dropped (for mark_cut).
        self._before: str | None = None
        self._lock = threading.Lock()

    def write(self, text: str, err: bool = False) -> None:
        """Add ``text``, written to stdout (or to stderr, or logged: ``err``)."""
        if not text:
            return
        if self.log is not None:
            self.log.write(text.encode("utf-8", "replace"), err)
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            if self._size > 2 * self.limit:
                joined = "".join(self._parts)
                self._before = joined[-self.limit - 1]
                joined = joined[-self.limit:]
                self._parts, self._size = [joined], len(joined)

    def text(self, then: str = "") -> str:
        """The tail, then ``then`` (a callable's return value), marked where cut."""
        with self._lock:
            return mark_cut("".join(self._parts) + then, self.limit, self._before)


class _Proxy:
    """Writes go to the real stream and to the running run's tail, if any."""

    def __init__(self, inner: TextIO, err: bool) -> None:
        self._inner = inner
        self._err = err

    def write(self, text: str) -> int:
        tail = _current.get()
        if tail is not None and isinstance(text, str):
            tail.write(text, self._err)
        return self._inner.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Handler(logging.Handler):
    """Copies log records emitted by a run's code into its tail; and, for a record no
    other handler takes, does what Python would have done without this one."""

    def emit(self, record: logging.LogRecord) -> None:
        tail = _current.get()
        if tail is not None:
            try:
                # Logging goes to stderr, as a process's would.
                tail.write(self.format(record) + "\n", True)
            except Exception:  # noqa: BLE001 - logging must never break the run
                self.handleError(record)
        if not _handled_elsewhere(record, self):
            _last_resort(record)


def _handled_elsewhere(record: logging.LogRecord, me: logging.Handler) -> bool:
    """Whether a handler other than ``me`` is on the way of ``record`` (its logger and,
    while they propagate, their parents: what ``Logger.callHandlers`` walks). ``me`` is
    on the root logger, so the record did reach the root: the root's other handlers
    first (a node's, one per record at every run's start and end), then the rest."""
    if any(h is not me for h in logging.root.handlers):
        return True
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(h is not me for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def _last_resort(record: logging.LogRecord) -> None:
    """Python prints a record that finds no handler to stderr (``logging.lastResort``,
    warnings and above): a handler on the root logger counts as one, so without this an
    embedded app that configured no logging would lose every warning (ours and its
    own) once a callable had run. Written to the real stream: inside a run the proxy
    would copy it into the tail a second time."""
    last = logging.lastResort
    if last is None or record.levelno < last.level:
        return
    stream = sys.stderr
    if isinstance(stream, _Proxy):
        stream = stream._inner
    if stream is None:
        return
    try:
        stream.write(last.format(record) + "\n")
        stream.flush()
    except Exception:  # noqa: BLE001 - as logging's own handlers: never raise
        pass


def install() -> None:
    """Called by every execution of a Python callable: cheap when in place. The streams
    are checked each time (an app or a test runner may have replaced them since)."""
    global _installed
    with _install_lock:
        if sys.stdout is not None and not isinstance(sys.stdout, _Proxy):
            sys.stdout = _Proxy(sys.stdout, False)
        if sys.stderr is not None and not isinstance(sys.stderr, _Proxy):
            sys.stderr = _Proxy(sys.stderr, True)
        if _installed:
            return
        _installed = True
        handler = _Handler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)


@contextlib.contextmanager
def running(tail: Tail) -> Iterator[None]:
    """Output written inside this block (this thread or task) lands in ``tail``."""
    token = _current.set(tail)
    try:
        yield
    finally:
        _current.reset(token)


def call(func: Any, tail: Tail, arg: Any) -> Any:
    """``func(arg)`` with its output in ``tail``; an exception's traceback is added too."""
    with running(tail):
        try:
            return func(arg)
        except BaseException as exc:
            tail.write(format_exception(exc), True)
            raise


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
