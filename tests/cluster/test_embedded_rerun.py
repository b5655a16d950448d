"""Issue 29 item 4: the embedded snippet (docs/embedded.md), run again on the same data dir, does
not warn that ``tick`` (which its ``with`` block declares) is no longer declared; a job
the app really no longer declares is reported once, in one wording."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.harness import ROOT, free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The docs snippet's shape (its `with` block declares `tick` with add_job), on ports
# of its own, and saying what wait_declared reported.
APP = textwrap.dedent("""\
    import json
    import os
    import sys

    import raftsched

    def tick(ctx: raftsched.RunContext) -> None:
        print(ctx.run_id, ctx.fence, flush=True)

    def other(ctx: raftsched.RunContext) -> None:
        pass

    with raftsched.Scheduler(data_dir=sys.argv[1], raft=sys.argv[2], api=sys.argv[3]) as sched:
        for name in os.environ["APP_DECLARES"].split():
            sched.add_job(globals()[name], id=name, schedule={"every": "1s"})
        report = sched.wait_declared()
        # To a file: tick's prints (a call-pool thread) could split a line on stdout.
        with open(sys.argv[4], "w") as f:
            json.dump({k: list(getattr(report, k)) for k in
                       ("created", "updated", "unchanged", "undeclared")}, f)
""")


def _run(tmp_path, ports: list[int], declares: str) -> tuple[dict[str, list[str]], str]:
    app = tmp_path / "app.py"
    app.write_text(APP)
    env = dict(os.environ, APP_DECLARES=declares,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(app), str(tmp_path / "data"),
                           f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}", str(out)],
                          env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stderr


def _declared_warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "declare" in ln]


def test_a_rerun_of_the_embedded_snippet_does_not_warn_and_reports_nothing_undeclared(
        tmp_path) -> None:
    ports = free_ports(2)
    runs = [("tick", [], {"created": ["tick"]}),
            # The rerun: the with block declares tick again.
            ("tick", [], {"unchanged": ["tick"]}),
            # An app that no longer declares tick hears it once, in one wording; kept.
            ("other", ["tick"], {"created": ["other"]}),
            ("tick other", [], {"unchanged": ["tick", "other"]})]
    reports = []
    for declares, undeclared, _ in runs:
        report, err = _run(tmp_path, ports, declares)
        reports.append(report)
        warnings = _declared_warnings(err)
        assert report["undeclared"] == undeclared, (declares, report, err)
        if undeclared:
            assert len(warnings) == 1, (declares, err)
            assert warnings[0] == ("jobs in the cluster that this app no longer declares "
                                   "(kept; reconcile(prune=True) removes them): tick"), err
        else:
            assert warnings == [], (declares, err)
    # The with block's add_job is reported like a declaration made before start.
    for (declares, undeclared, puts), report in zip(runs, reports, strict=True):
        assert report == dict({"created": [], "updated": [], "unchanged": []}, **puts,
                              undeclared=undeclared), (declares, report)


def stale(ctx) -> None:
    """A job an earlier version of the app declared."""


def fresh(ctx) -> None:
    """A job this version of the app declares in its ``with`` block."""


def test_the_warning_waits_for_the_with_block_s_declarations_and_comes_once(
        tmp_path, monkeypatch, caplog) -> None:
    import raftsched
    from raftsched.faces import embedded
    from tests.support.harness import wait_until

    ports = free_ports(2)

    def sched() -> raftsched.Scheduler:
        return raftsched.Scheduler(data_dir=str(tmp_path / "data"),
                                   raft=f"127.0.0.1:{ports[0]}", api=f"127.0.0.1:{ports[1]}")

    with sched() as s:
        s.add_job(stale, id="stale", every="1h")
    monkeypatch.setattr(embedded, "DECLARE_SETTLE_S", 1.0, raising=False)
    caplog.set_level(logging.WARNING, logger="raftsched.embedded")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "no longer declare" in r.getMessage()]

    with sched() as s:
        s.add_job(fresh, id="fresh", every="1h")
        assert s.wait_declared().undeclared == ("stale",)
        # Still inside the block: the declarations went quiet, so the log says it.
        wait_until(warnings, 15, "the undeclared warning")
        assert s.client.get_job("stale")["id"] == "stale"  # kept
    assert warnings() == ["jobs in the cluster that this app no longer declares (kept; "
                          "reconcile(prune=True) removes them): stale"]
