"""Issue 29 item 5: ``job put --dry-run`` and ``job next FILE`` refuse exactly what
``job put`` refuses, with the same error text (naming the field) and exit code."""

from __future__ import annotations

import json
import re
import time

import pytest

from raftsched.core.durations import format_timestamp
from raftsched.faces.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_JOB = 'id = "{id}"\nschedule = {{every = "1h"}}\ncommand = ["true"]\n'


def _ago(seconds: int) -> str:
    return format_timestamp((int(time.time()) - seconds) * 1000)


#: Files ``job put`` refuses, each with the field its error must name.
REFUSED = {
    "bad-id": ('id = "bad id!"\nschedule = {every = "1h"}\ncommand = ["true"]\n', "id"),
    "command-string": ('id = "c"\nschedule = {every = "1h"}\ncommand = "echo hi"\n',
                       "command"),
    "env-not-string": ('id = "e"\nschedule = {every = "1h"}\ncommand = ["true"]\n'
                       'env = {A = 1}\n', "env.A"),
    "typo-key": ('id = "t"\nschedule = {every = "1h"}\ncommand = ["true"]\ntimout = "1m"\n',
                 "timout"),
    "past-at": (f'id = "p"\nschedule = {{at = "{_ago(600)}"}}\ncommand = ["true"]\n',
                "schedule.at"),
    # A file of several jobs: the error names the job by its place and id.
    "second-of-two": ("[[jobs]]\n" + _JOB.format(id="ok1") + "[[jobs]]\n"
                      'id = "bad2"\nschedule = {every = "1h"}\ncommand = ["true"]\n'
                      'overlap = "sometimes"\n', "jobs[1] ('bad2').overlap"),
    "same-id-twice": ("[[jobs]]\n" + _JOB.format(id="twin") + "[[jobs]]\n"
                      + _JOB.format(id="twin"), "jobs[1] ('twin').id"),
}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, _timeless(out.out), _timeless(out.err)


def _timeless(text: str) -> str:
    # How far in the past an `at` is grows between the calls compared.
    return re.sub(r"is [0-9hms]+ in the past", "is (elapsed) in the past", text)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    from tests.support.harness import Cluster

    c = Cluster(str(tmp_path_factory.mktemp("put-validation")), 1)
    try:
        c.start_all()
        c.wait_leader()
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_dry_run_and_next_refuse_what_put_refuses(case, one_node, tmp_path, capsys) -> None:
    text, field = REFUSED[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    addr = ["--addr", one_node.api["n1"]]
    put = _run(capsys, "job", "put", str(path), *addr)
    assert put[0] == 1, put
    error = put[2].strip()
    assert error.startswith(f"error: invalid_spec: {field}: "), error
    for argv in (("job", "put", "--dry-run", str(path), *addr),
                 ("job", "next", str(path), *addr)):
        rc, out, err = _run(capsys, *argv)
        assert (rc, out, err.strip()) == (1, "", error), (argv, rc, out, err)
    # Under --json the error is the same, as JSON on stdout.
    for argv in (("job", "put", str(path), "--json", *addr),
                 ("job", "put", "--dry-run", str(path), "--json", *addr),
                 ("job", "next", str(path), "--json", *addr)):
        rc, out, _ = _run(capsys, *argv)
        assert rc == 1 and json.loads(out)["error"]["message"] == \
            error.removeprefix("error: invalid_spec: "), (argv, out)
    with one_node.client() as cl:
        assert cl.list_jobs()["total"] == 0


def test_a_valid_file_still_previews_and_a_stored_past_at_is_not_refused_again(
        one_node, tmp_path, capsys) -> None:
    """The past-`at` check is put's own: an `at` within its grace is accepted (it fires
    late), and a dry run of the stored job's unchanged file is no refusal either."""
    path = tmp_path / "late.toml"
    path.write_text(f'id = "late"\nschedule = {{at = "{_ago(5)}"}}\ncommand = ["true"]\n')
    addr = ["--addr", one_node.api["n1"]]
    assert _run(capsys, "job", "put", "--dry-run", str(path), *addr)[:2] == \
        (0, "late: would be created\n(dry run: nothing was changed)\n")
    assert _run(capsys, "job", "next", str(path), *addr)[0] == 0
    rc, out, err = _run(capsys, "job", "put", str(path), *addr)
    assert (rc, out) == (0, "put late (version 1, created)\n"), err
    try:
        # Later (beyond a short grace the node would refuse a new `at` this old) the
        # same file is still the stored job's: unchanged, not refused.
        stale = tmp_path / "stale.toml"
        at = _ago(7200)
        stale.write_text(f'id = "stale"\nschedule = {{at = "{at}"}}\ncommand = ["true"]\n'
                         'misfire = {grace = "3h"}\n')
        assert _run(capsys, "job", "put", str(stale), *addr)[0] == 0
        stale.write_text(f'id = "stale"\nschedule = {{at = "{at}"}}\ncommand = ["true"]\n'
                         'misfire = {grace = "1m"}\n')
        rc, out, err = _run(capsys, "job", "put", "--dry-run", str(stale), *addr)
        assert rc == 0 and out.startswith("stale: would be updated (misfire)"), (out, err)
    finally:
        with one_node.client() as cl:
            for job in ("late", "stale"):
                cl.delete_job(job)
