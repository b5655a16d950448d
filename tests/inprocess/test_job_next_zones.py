"""``raftsched job next FILE`` computes fire times without a node, in the CLI's own
process: they come from the pinned ``tzdata`` package, as a node's do, never from the
host's zone files. A host whose ``Europe/Berlin`` differs (here: Tokyo's file under that
name, on ``PYTHONTZPATH``) changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.timeout(60)

#: Fixed 02:30 Berlin, from the Saturday before the 2031 spring-forward: 02:30 does not
#: exist on Sunday 2031-03-30, so that day fires at the first instant after the gap.
JOB = """\
id = "berlin"
schedule = { cron = "30 2 * * *", tz = "Europe/Berlin" }
start = "2031-03-29T00:00:00Z"
end = "2031-04-01T00:00:00Z"
command = ["true"]
"""
#: The tzdata rules' fire times: +01:00 until the change (01:00 UTC), then +02:00.
WANT = ["2031-03-29T01:30:00Z", "2031-03-30T01:00:00Z", "2031-03-31T00:30:00Z"]


def _next(job: Path, tzpath: str | None) -> list[dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONTZPATH", None)
    if tzpath is not None:
        env["PYTHONTZPATH"] = tzpath
    out = subprocess.run([sys.executable, "-m", "raftsched", "job", "next", str(job),
                          "--count", "5", "--json"], capture_output=True, text=True,
                         env=env, timeout=30, check=True)
    return json.loads(out.stdout)["fires"]


def test_job_next_file_ignores_a_host_zone_file_that_differs(tmp_path: Path) -> None:
    job = tmp_path / "berlin.toml"
    job.write_text(JOB, encoding="utf-8")
    host = tmp_path / "zoneinfo"
    (host / "Europe").mkdir(parents=True)
    with resources.files("tzdata").joinpath("zoneinfo", "Asia", "Tokyo").open("rb") as src, \
            open(host / "Europe" / "Berlin", "wb") as dst:
        shutil.copyfileobj(src, dst)
    # The premise: a process reading zones through the search path gets +09:00 there.
    probe = subprocess.run(
        [sys.executable, "-c", "import zoneinfo, datetime; print(datetime.datetime(2031, 3, "
         "29, tzinfo=zoneinfo.ZoneInfo('Europe/Berlin')).utcoffset())"],
        capture_output=True, text=True, timeout=30, check=True,
        env=dict(os.environ, PYTHONTZPATH=str(host)))
    assert probe.stdout.strip() == "9:00:00"

    plain = _next(job, None)
    crafted = _next(job, str(host))
    assert [f["utc"] for f in plain] == WANT
    assert [f["local"] for f in plain] == ["2031-03-29T02:30:00+01:00",
                                           "2031-03-30T03:00:00+02:00",
                                           "2031-03-31T02:30:00+02:00"]
    assert crafted == plain
