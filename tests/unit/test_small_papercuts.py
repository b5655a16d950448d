"""Issue 12 item 14: small things a new user met in the first hour."""

from __future__ import annotations

import functools
import io
import logging
from importlib.metadata import version

import pytest

from raftsched.core.errors import InvalidSpec
from raftsched.core.model import JobSpec
from raftsched.faces import cli, cli_common
from raftsched.faces.embedded import Scheduler
from raftsched.node.observe import events


def _text_line(kind: str, **kw: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(events.TextFormatter())
    log = logging.getLogger("raftsched.events")
    old_level, old_prop = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        events.emit(kind, node="n1", **kw)  # type: ignore[arg-type]
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
        log.propagate = old_prop
    return stream.getvalue()


@pytest.mark.parametrize("kind", ["job.put", "job.paused", "job.removed", "job.resumed"])
def test_text_log_format_names_the_job_of_job_events(kind: str) -> None:
    line = _text_line(kind, job_id="nightly")
    assert kind in line and "job=nightly" in line


def test_text_log_format_keeps_run_and_does_not_repeat_its_job() -> None:
    line = _text_line("run.started", run_id="hello@1000", fence=3)
    assert "run=hello@1000" in line and "job=" not in line and "fence=3" in line


def _tick(ctx: object) -> None:  # pragma: no cover - never called
    pass


@pytest.mark.parametrize("func", [None, functools.partial(_tick), 42, lambda ctx: None])
def test_add_job_with_something_not_importable_is_invalid_spec_naming_call(func: object,
                                                                           tmp_path) -> None:
    sched = Scheduler(data_dir=str(tmp_path / "d"))  # never started: refused before any I/O
    with pytest.raises(InvalidSpec) as info:
        sched.add_job(func, id="x", schedule={"every": "1s"})
    assert info.value.field == "call"
    assert "AttributeError" not in str(info.value)


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"raftsched {version('raftsched')}"


@pytest.mark.parametrize("spec,field,hint", [
    ({"id": "a", "schedule": {"every": "1s"}, "comand": ["true"]}, "comand", "command"),
    ({"id": "a", "schedule": {"evry": "1s"}, "command": ["true"]}, "schedule.evry", "every"),
    ({"id": "a", "schedule": {"every": "1s"}, "command": ["true"],
      "misfire": {"polcy": "once"}}, "misfire.polcy", "policy"),
    ({"id": "a", "schedule": {"every": "1s"}, "command": ["true"],
      "retries": {"max": 1, "bakoff": "1s"}}, "retries.bakoff", "backoff"),
])
def test_job_spec_typos_get_did_you_mean(spec: dict, field: str, hint: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec(spec)
    assert info.value.field == field
    assert f"did you mean {hint!r}?" in str(info.value)


def test_job_spec_unknown_field_far_from_any_gets_no_hint() -> None:
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec({"id": "a", "schedule": {"every": "1s"}, "command": ["true"],
                           "zzzzzzzz": 1})
    assert "did you mean" not in str(info.value)


def test_errors_keep_their_fields_across_the_wire() -> None:
    from raftsched.core.errors import (
        Conflict,
        InvalidArgument,
        InvalidSpec,
        LimitExceeded,
        UnknownJob,
        from_wire,
    )
    for err, attr in ((InvalidSpec("schedule.at", "is 5m in the past"), "field"),
                      (InvalidArgument("specs", "must be a list"), "field"),
                      (Conflict("j1", "previous run still active"), "subject"),
                      (LimitExceeded("max_jobs", "full"), "limit"),
                      (UnknownJob("nightly"), "job_id")):
        back = from_wire(err.to_wire())
        assert type(back) is type(err) and str(back) == str(err)
        assert getattr(back, attr) == getattr(err, attr)


def test_not_ready_says_across_the_wire_whether_the_command_may_still_commit() -> None:
    from raftsched.core.errors import NotReady, from_wire
    for maybe in (True, False):
        back = from_wire(NotReady("leader changed", maybe_committed=maybe).to_wire())
        assert isinstance(back, NotReady) and str(back) == "leader changed"
        assert back.maybe_committed is maybe
    # A node of an older release sends {code, message} only: not "maybe".
    assert from_wire({"code": "not_ready", "message": "no leader"}).maybe_committed is False
    assert NotReady("x").to_wire() == {"code": "not_ready", "message": "x"}


@pytest.mark.parametrize(("count", "words"), [(1, "1 job"), (2, "2 jobs"), (0, "0 jobs")])
def test_export_says_job_in_the_singular(tmp_path, monkeypatch, capsys, count: int,
                                         words: str) -> None:
    """Issue 29: ``exported 1 jobs``."""
    jobs = [{"spec": JobSpec.from_spec({"id": f"j{i}", "schedule": {"every": "1h"},
                                        "command": ["true"]}).redacted()}
            for i in range(count)]

    class Fake:
        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def list_jobs(self, **kw: object) -> dict:
            return {"jobs": jobs, "total": len(jobs)}

    monkeypatch.setattr(cli_common, "connect", lambda args: Fake())
    out_dir = tmp_path / "jobs"
    assert cli.main(["job", "export", "--dir", str(out_dir)]) == 0
    assert capsys.readouterr().out == f"exported {words} to {out_dir}\n"
    assert sorted(p.name for p in out_dir.iterdir()) == [f"j{i}.toml" for i in range(count)]
