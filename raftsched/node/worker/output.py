"""Where a process's (or an HTTP response's) output goes: the job's secrets masked, then
the run record's tail and the run's full log (raftsched/node/worker/runlog.py).

Job ``env`` values are secrets: a job that prints one (``echo $TOKEN``, a server echoing
a header) must not put it into the replicated tail, a notification or the log on disk.
Every value of at least :data:`MIN_SECRET_CHARS` characters is replaced by ``***`` as
the bytes arrive, also when a value is split across two reads (the end of a read that
may begin one is held back until the next read or the end). Shorter values are not
masked: too short to be a secret, masking them would garble ordinary output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from raftsched.node.worker import capture

if TYPE_CHECKING:
    from raftsched.node.worker.runlog import RunLog

#: Env values shorter than this are not masked in output.
MIN_SECRET_CHARS = 6
MASK = b"***"


class Scrubber:
    """Masks ``values`` in a byte stream fed in pieces; see the module docstring."""

    def __init__(self, values: Iterable[str]) -> None:
        # Longest first: at one position the longest value matches (a value containing
        # another is masked whole), as the alternation tries them in order.
        self.secrets = sorted({v.encode("utf-8") for v in values if len(v) >= MIN_SECRET_CHARS},
                              key=len, reverse=True)
        self._re = re.compile(b"|".join(re.escape(s) for s in self.secrets))
        self._max = len(self.secrets[0]) if self.secrets else 0
        self.pending = b""

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """What of ``pending + data`` is safe to pass on now, values masked."""
        if not self.secrets:
            return data
        buf = self.pending + data
        out: list[bytes] = []
        pos = 0
        undecided = len(buf)
        for m in self._re.finditer(buf):
            if not final and m.start() + self._max > len(buf):
                # A longer value may still match here once more bytes come.
                undecided = m.start()
                break
            out += (buf[pos:m.start()], MASK)
            pos = m.end()
        end = len(buf) if final else min(undecided, len(buf) - self._held(buf[pos:]))
        out.append(buf[pos:end])
        self.pending = buf[end:]
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the stream: what was held back (no value completes it any more)."""
        return self.feed(b"", final=True)

    def _held(self, buf: bytes) -> int:
        """The length of the longest end of ``buf`` that begins some secret."""
        hold = 0
        for s in self.secrets:
            pos = buf.find(s[:1], max(0, len(buf) - len(s) + 1))
            while pos != -1:
                if s.startswith(buf[pos:]):
                    hold = max(hold, len(buf) - pos)
                    break  # the earliest start is the longest end
                pos = buf.find(s[:1], pos + 1)
        return hold


class ByteTail:
    """The last ``limit`` bytes of a process's output, decoded with a mark where the
    output was cut (:func:`capture.mark_cut`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        #: The byte before the kept ones, once some were dropped.
        self.before: int | None = None

    def add(self, chunk: bytes) -> None:
        self.kept.extend(chunk)
        extra = len(self.kept) - self.limit
        if extra > 0:
            self.before = self.kept[extra - 1]
            del self.kept[:extra]

    def text(self) -> str:
        kept, before = bytes(self.kept), self.before
        if before is not None:
            # A character the cut split would decode as U+FFFD: start after it.
            start = 0
            while start < min(len(kept), 3) and 0x80 <= kept[start] < 0xC0:
                start += 1
            if start:
                kept, before = kept[start:], kept[start - 1]
        return capture.mark_cut(kept.decode("utf-8", "replace"), self.limit,
                                None if before is None else chr(before))


class Output:
    """A run's two output streams: masked, then into the tail (both streams, merged in
    the order they were read) and the log (kept apart).

    :param tail: the run record's tail.
    :param log: the run's full log, or None (logs off).
    :param secrets: the job's env values.
    """

    def __init__(self, tail: ByteTail, log: RunLog | None, secrets: Iterable[str]) -> None:
        values = list(secrets)
        self.tail = tail
        self.log = log
        self._scrub = (Scrubber(values), Scrubber(values))

    def add(self, chunk: bytes, err: bool = False) -> None:
        data = self._scrub[err].feed(chunk)
        if data:
            self.tail.add(data)
            if self.log is not None:
                self.log.write(data, err)

    def finish(self) -> None:
        """The streams ended: pass on what was held back."""
        for err in (False, True):
            data = self._scrub[err].flush()
            if data:
                self.tail.add(data)
                if self.log is not None:
                    self.log.write(data, err)

    def text(self) -> str:
        return self.tail.text()


__all__ = ["MASK", "MIN_SECRET_CHARS", "ByteTail", "Output", "Scrubber"]
