"""Issue 29 papercut: an output tail cut off inside a line read as a whole line (an
error message without its start, and no sign that anything came before it)."""

from __future__ import annotations

import pytest

from raftsched.node.worker.capture import CUT_LINE, CUT_MARK, Tail, mark_cut
from raftsched.node.worker.executor import _ByteTail

pytestmark = pytest.mark.timeout(30)

LIMIT = 64
ROOM = LIMIT - len(CUT_MARK) - len(CUT_LINE)


def test_an_output_that_fits_is_kept_as_it_is() -> None:
    assert mark_cut("one\ntwo\n", LIMIT) == "one\ntwo\n"
    assert mark_cut("x" * LIMIT, LIMIT) == "x" * LIMIT


def test_a_cut_inside_a_line_is_marked_there_and_the_tail_stays_within_its_limit() -> None:
    out = mark_cut("first line\n" + "a" * 100 + "\nlast line\n", LIMIT)
    assert out.startswith(CUT_MARK + CUT_LINE + "aaa"), out
    assert out.endswith("a\nlast line\n") and len(out) <= LIMIT


def test_a_cut_at_a_line_start_says_only_that_earlier_output_is_gone() -> None:
    whole = "b" * (ROOM - 1) + "\n"
    out = mark_cut("x" * 40 + "\n" + whole, LIMIT)
    assert out == CUT_MARK + whole


def test_text_dropped_earlier_still_gets_its_mark() -> None:
    assert mark_cut("abc\n", LIMIT, before="z") == CUT_MARK + CUT_LINE + "abc\n"
    assert mark_cut("abc\n", LIMIT, before="\n") == CUT_MARK + "abc\n"


def test_a_tail_too_small_for_the_mark_is_the_bare_end() -> None:
    assert mark_cut("0123456789" * 3, 10) == "0123456789"


def test_a_callable_s_tail_is_marked_when_its_output_was_dropped() -> None:
    tail = Tail(LIMIT)
    for i in range(100):
        tail.write(f"line {i:03d} of the output\n")
    text = tail.text()
    assert text.startswith(CUT_MARK + CUT_LINE) and text.endswith("line 099 of the output\n")
    assert len(text) <= LIMIT
    with_value = tail.text("returned 7")
    assert with_value.startswith(CUT_MARK) and with_value.endswith("output\nreturned 7")


def test_a_process_s_tail_cut_inside_a_character_starts_after_it() -> None:
    tail = _ByteTail(LIMIT)
    for _ in range(20):
        tail.add("h\u00e9llo w\u00f6rld\n".encode())
    text = tail.text()
    assert "\ufffd" not in text and text.startswith(CUT_MARK)
    assert text.endswith("h\u00e9llo w\u00f6rld\n") and len(text) <= LIMIT
    short = _ByteTail(LIMIT)
    short.add(b"no cut\n")
    assert short.text() == "no cut\n"
