"""The library paths change nothing process-wide: the core reads time zones from the
pinned ``tzdata`` package whatever ``zoneinfo``'s search path says (and no module moves
that path), and encoding or decoding a state leaves the garbage collector alone."""

from __future__ import annotations

import ast
import gc
import shutil
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest

from raftsched.core import cron
from raftsched.core.codec import decode_state, encode_state
from raftsched.core.trigger import next_fire, schedule_from_spec
from tests.support.stateutil import ok

pytestmark = pytest.mark.timeout(60)

PKG = Path(__file__).resolve().parents[2] / "raftsched"
WINTER = datetime(2026, 1, 15, 12, tzinfo=UTC)
SUMMER = datetime(2026, 7, 15, 12, tzinfo=UTC)


@pytest.fixture
def host_zones(tmp_path: Path) -> Iterator[Path]:
    """A zone search path whose Europe/Berlin is Tokyo's file (+9 h, no DST), as a host
    with different zone files would have; caches cleared before and after."""
    tokyo = resources.files("tzdata").joinpath("zoneinfo", "Asia", "Tokyo")
    (tmp_path / "Europe").mkdir()
    with tokyo.open("rb") as src, open(tmp_path / "Europe" / "Berlin", "wb") as dst:
        shutil.copyfileobj(src, dst)
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    zoneinfo.ZoneInfo.clear_cache()
    cron.zone_of.cache_clear()
    try:
        yield tmp_path
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()
        cron.zone_of.cache_clear()


def test_zones_come_from_tzdata_whatever_the_search_path(host_zones: Path) -> None:
    # The premise: zoneinfo itself now reads the crafted file.
    assert zoneinfo.ZoneInfo("Europe/Berlin").utcoffset(WINTER) == timedelta(hours=9)
    zone = cron.zone_of("Europe/Berlin")
    assert zone is not None and str(zone) == "Europe/Berlin"
    assert zone.utcoffset(WINTER) == timedelta(hours=1)
    assert zone.utcoffset(SUMMER) == timedelta(hours=2)
    # A fire time: 02:30 Berlin on 2026-03-29 does not exist (clocks jump 02:00 -> 03:00);
    # the fixed job fires at the first instant after the gap, 01:00 UTC.
    sched = schedule_from_spec({"cron": "30 2 * * *", "tz": "Europe/Berlin"})
    after = int(datetime(2026, 3, 28, 12, tzinfo=UTC).timestamp() * 1000)
    assert next_fire(sched, after) == int(datetime(2026, 3, 29, 1, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize("name", ["", "/etc/localtime", "../zoneinfo/UTC", "Europe//Berlin",
                                  "Europe/./Berlin", "Mars/Olympus", "Europe", "Europe\\Berlin"])
def test_a_name_that_is_no_tzdata_zone_is_refused(name: str) -> None:
    with pytest.raises((ValueError, OSError)):
        cron.zone_of(name)


def test_no_module_moves_the_zone_search_path() -> None:
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else \
                node.id if isinstance(node, ast.Name) else None
            assert name != "reset_tzpath", f"{path.relative_to(PKG)}:{node.lineno}"


def test_encoding_and_decoding_a_state_leave_the_collector_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from raftsched.core.machine import ClusterState

    st = ClusterState()
    ok(st, {"op": "put_job", "at": 1000, "spec": {"id": "a", "schedule": {"every": "10s"},
                                                   "command": ["true"]}})
    calls: list[str] = []
    monkeypatch.setattr(gc, "disable", lambda: calls.append("disable"))
    monkeypatch.setattr(gc, "enable", lambda: calls.append("enable"))
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    back = decode_state(encode_state(st))
    assert list(back.jobs) == ["a"]
    assert calls == []


def test_the_node_pauses_the_collector_around_a_snapshot_and_restores_it() -> None:
    from raftsched.node.observe import gcwatch

    assert gc.isenabled()
    with gcwatch.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gcwatch.paused():
            pass
        assert not gc.isenabled(), "an embedder's own choice is left as it was"
    finally:
        gc.enable()
