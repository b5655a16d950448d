"""The test-only clock hooks (a fixed offset, an offset file re-read at runtime) and the
Clock a clocked shell is given: the system one and the fake one tests step."""

from __future__ import annotations

import time

import pytest

from raftsched.node.observe import clock


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


def test_the_system_clock_reads_the_node_clock_with_its_offsets() -> None:
    clock.set_offset_ms(60_000)
    assert abs(clock.SYSTEM_CLOCK.now_ms() - clock.now_ms()) < 1000
    assert clock.SYSTEM_CLOCK.now_ms() - time.time_ns() // 1_000_000 > 59_000
    m = time.monotonic()
    assert m <= clock.SYSTEM_CLOCK.monotonic() < m + 60


def test_a_fake_clock_moves_only_when_told() -> None:
    fake = clock.FakeClock(wall_ms=1_000_000, mono=5.0)
    assert (fake.now_ms(), fake.monotonic()) == (1_000_000, 5.0)
    fake.advance(1.5)
    assert (fake.now_ms(), fake.monotonic()) == (1_001_500, 6.5)
    # A stepped host clock: the wall moves either way, monotonic time does not.
    fake.step_wall(-10_000)
    assert (fake.now_ms(), fake.monotonic()) == (991_500, 6.5)
    with pytest.raises(ValueError, match="seconds"):
        fake.advance(-0.1)
    assert fake.monotonic() == 6.5
