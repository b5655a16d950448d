"""A Python callable's output capture must not take the app's stderr away: once a
callable has run (raftsched/node/worker/capture.py puts a handler on the root logger),
a warning of an app that configured no logging still reaches stderr, as Python prints
a record no handler takes (``logging.lastResort``); inside a run it reaches the run's
tail once and stderr once; and an app with its own handler gets no extra copy.

Run in a child process: the handler and the stream proxies are process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""\
    import logging
    import sys

    from raftsched.node.worker import capture

    if sys.argv[1] == "configured":
        logging.basicConfig(format="APP %(message)s")
    log = logging.getLogger("app")
    log.warning("before any run")
    capture.install()  # what the first callable's execution does
    log.warning("after a run, outside one")
    log.info("an info record: Python never prints it unhandled")
    tail = capture.Tail(1000)
    with capture.running(tail):
        log.warning("inside a run")
    print("TAIL " + repr(tail.text()))
""")


def _run(mode: str) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_an_app_without_logging_keeps_its_warnings_on_stderr_after_a_callable_ran():
    out, err = _run("plain")
    assert err.splitlines() == ["before any run", "after a run, outside one", "inside a run"]
    assert out.strip() == "TAIL 'WARNING app: inside a run\\n'"


def test_an_app_with_its_own_handler_gets_no_second_copy():
    out, err = _run("configured")
    assert err.splitlines() == ["APP before any run", "APP after a run, outside one",
                                "APP inside a run"]
    assert out.strip() == "TAIL 'WARNING app: inside a run\\n'"
