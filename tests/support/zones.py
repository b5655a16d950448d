"""Time zones for the tests' oracles, read from the pinned ``tzdata`` package as the
core reads them (``raftsched.core.cron.zone_of``): an oracle and the code under test
then agree on each zone's rules whatever zone files the host holds (``ZoneInfo(name)``
would read the host's ``/usr/share/zoneinfo`` first, which may be older or newer)."""

from __future__ import annotations

import functools
from importlib import resources
from zoneinfo import ZoneInfo


@functools.cache
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` from the tzdata package."""
    with resources.files("tzdata").joinpath("zoneinfo", *name.split("/")).open("rb") as f:
        return ZoneInfo.from_file(f, key=name)
