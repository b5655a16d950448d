"""A slow read's log line names its reader by function, never by a partial's repr: the
name is built at every read (under the Raft lock), and a partial's repr formatted
every argument (a worker's read of hundreds of held runs: kilobytes per read)."""

from __future__ import annotations

from functools import partial

from raftsched.node.replica.replica import _reader_name


def _all_held(runs: list[object], node: str) -> bool:
    return bool(runs and node)


def test_a_partial_is_named_by_its_function_and_the_name_is_short() -> None:
    big = [object() for _ in range(10_000)]
    assert _reader_name(partial(partial(_all_held, big), "n2")) == "read _all_held"
    assert _reader_name(_all_held) == "read _all_held"
    assert _reader_name(lambda st: st).startswith("read test_a_partial")


def test_a_callable_object_is_named_by_its_type() -> None:
    class Reader:
        def __call__(self, st: object) -> object:
            return st

    assert _reader_name(Reader()).endswith("Reader")
