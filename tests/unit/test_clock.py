"""The test-only clock hooks: a fixed offset, and an offset file re-read at runtime."""

from __future__ import annotations

import time

import pytest

from raftsched.node import clock


@pytest.fixture(autouse=True)
def _reset():
    yield
    clock.set_offset_ms(0)
    clock.set_offset_file(None)


def test_off_by_default_follows_time() -> None:
    assert abs(clock.now_ms() - time.time_ns() // 1_000_000) < 1000


def test_offset_file_moves_the_clock_forward_and_back(tmp_path) -> None:
    path = tmp_path / "clock"
    path.write_text("3600000\n")
    clock.set_offset_file(str(path))
    assert clock.now_ms() - time.time_ns() // 1_000_000 > 3_500_000
    path.write_text("-3600000\n")
    time.sleep(clock.FILE_REREAD_S + 0.05)
    assert clock.now_ms() - time.time_ns() // 1_000_000 < -3_500_000


def test_offset_file_adds_to_the_fixed_offset_and_survives_bad_content(tmp_path) -> None:
    path = tmp_path / "clock"
    path.write_text("1000000")
    clock.set_offset_ms(1_000_000)
    clock.set_offset_file(str(path))
    assert clock.now_ms() - time.time_ns() // 1_000_000 > 1_900_000
    path.write_text("garbage")
    time.sleep(clock.FILE_REREAD_S + 0.05)
    assert clock.now_ms() - time.time_ns() // 1_000_000 > 1_900_000  # last good offset kept
    path.unlink()
    time.sleep(clock.FILE_REREAD_S + 0.05)
    assert clock.now_ms() - time.time_ns() // 1_000_000 > 1_900_000
