"""Issue 32 items 1, 2, 4 through the CLI of a real node: dependent jobs (``after``) in a
job file, shown as a graph by ``job ls`` and as "after extract" by ``job next``; their
refusals naming the field; a concurrency key shown by ``status``; ``job backfill``,
``job backfills`` and ``job backfill-cancel``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from raftsched.faces.cli import main
from tests.support.harness import Cluster, read_witness, wait_until, witness_command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "deps-cli-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def node(tmp_path_factory: Any) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("deps")), 1, secret=SECRET)
    try:
        c.start_all()
        c.wait_leader()
        yield c
    finally:
        c.close()


def cli(capsys: Any, c: Cluster, *argv: str) -> tuple[int, str, str]:
    rc = main([*argv, "--addr", c.api["n1"], "--secret-env", "RS_TEST_SECRET"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_dependent_jobs_through_the_cli(node: Cluster, capsys: Any, tmp_path: Any,
                                        monkeypatch: Any) -> None:
    monkeypatch.setenv("RS_TEST_SECRET", SECRET)
    ran = str(tmp_path / "ran.jsonl")
    jobs = tmp_path / "jobs.toml"
    cmd = json.dumps(witness_command(ran))
    # The child comes first in the file: a file is one change, its graph checked whole.
    jobs.write_text(
        f'[[jobs]]\nid = "load"\nafter = ["extract"]\ncommand = {cmd}\n'
        f'[[jobs]]\nid = "extract"\nschedule = {{every = "1h"}}\ncommand = {cmd}\n'
        f'[[jobs]]\nid = "report"\nafter = ["load"]\non = "always"\ncommand = {cmd}\n'
        f'concurrency = {{key = "warehouse", max = 1}}\n')
    rc, out, err = cli(capsys, node, "job", "put", str(jobs))
    assert rc == 0, err
    rc, out, _ = cli(capsys, node, "job", "ls")
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "THEN" in out.splitlines()[0]
    assert "after extract" in rows["load"] and rows["extract"].rstrip().endswith("load")
    assert "after load (on always) [warehouse 1]" in rows["report"]
    rc, out, _ = cli(capsys, node, "job", "next", "load")
    assert rc == 0 and out.startswith("load: after extract"), out
    # Run the chain: the parent's trigger makes one run of each dependent.
    rc, out, err = cli(capsys, node, "job", "trigger", "extract")
    assert rc == 0, err
    fire = int(out.split()[2].rpartition("@")[2])  # "triggered run extract@<ms> (...)"

    def chain_done() -> list[dict[str, Any]] | None:
        seen = read_witness(ran)
        return seen if len(seen) >= 3 else None

    seen = wait_until(chain_done, 60, "extract, load and report each to run")
    ids = sorted(w["RUN_ID"] for w in seen)
    stamp = ids[0].rpartition("@")[2]
    assert ids == sorted(f"{j}@{stamp}" for j in ("extract", "load", "report")), ids
    assert int(stamp) == fire
    # Refusals name the field.
    cyc = tmp_path / "cycle.toml"
    cyc.write_text(f'id = "extract"\nafter = ["report"]\ncommand = {cmd}\n')
    rc, _, err = cli(capsys, node, "job", "put", str(cyc))
    assert rc == 1 and "after" in err and "cycle" in err, err
    rc, _, err = cli(capsys, node, "job", "rm", "extract")
    assert rc == 1 and "error: conflict: after:" in err, err
    both = tmp_path / "both.toml"
    both.write_text(f'id = "x"\nafter = ["extract"]\nschedule = {{every = "1s"}}\n'
                    f"command = {cmd}\n")
    rc, _, err = cli(capsys, node, "job", "put", str(both))
    assert rc == 1 and "after:" in err and "not both" in err, err
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(f'id = "x"\nafter = ["nope"]\ncommand = {cmd}\n')
    rc, _, err = cli(capsys, node, "job", "put", str(unknown))
    assert rc == 1 and "after[0]: unknown job 'nope'" in err, err
    rc, out, _ = cli(capsys, node, "status")
    assert "concurrency: warehouse 0/1 running" in out, out


def test_backfill_through_the_cli(node: Cluster, capsys: Any, tmp_path: Any,
                                  monkeypatch: Any) -> None:
    monkeypatch.setenv("RS_TEST_SECRET", SECRET)
    ran = str(tmp_path / "bf.jsonl")
    spec = tmp_path / "bf.json"
    spec.write_text(json.dumps({"id": "daily", "schedule": {"cron": "0 3 * * *"},
                                "command": witness_command(ran, 0.2)}))
    assert cli(capsys, node, "job", "put", str(spec))[0] == 0
    rc, out, err = cli(capsys, node, "job", "backfill", "daily", "--from",
                       "2026-03-01T00:00:00Z", "--to", "2026-03-05T23:00:00Z", "--max", "2")
    assert rc == 0, err
    assert out.startswith("bf-") and "daily: " in out and "/5 fire times running" in out, out
    bf_id = out.split()[0]
    wait_until(lambda: len(read_witness(ran)) >= 5, 60, "the five fire times to run")
    rc, out, _ = cli(capsys, node, "job", "backfills", "daily")
    assert rc == 0 and bf_id in out
    wait_until(lambda: "done" in cli(capsys, node, "job", "backfills", "daily")[1], 30,
               "the backfill done")
    runs = sorted(w["RUN_ID"] for w in read_witness(ran))
    assert runs == [f"daily@{t}" for t in sorted(
        1772334000000 + k * 86_400_000 for k in range(5))], runs
    # Again: every fire time is recorded now, so none runs (unless --rerun).
    rc, out, _ = cli(capsys, node, "job", "backfill", "daily", "--from",
                     "2026-03-01T00:00:00Z", "--to", "2026-03-05T23:00:00Z", "--json")
    again = json.loads(out)
    assert rc == 0
    wait_until(lambda: "done" in cli(capsys, node, "job", "backfills", "daily")[1].split(
        again["id"])[1].splitlines()[0], 30, "the second backfill done")
    assert len(read_witness(ran)) == 5
    rc, out, _ = cli(capsys, node, "job", "backfill", "daily", "--from",
                     "2026-03-01T00:00:00Z", "--to", "2026-03-02T23:00:00Z", "--rerun")
    assert rc == 0
    wait_until(lambda: len(read_witness(ran)) >= 7, 60, "the two reruns")
    reruns = [w for w in read_witness(ran)][5:]
    assert {w["ATTEMPT"] for w in reruns} == {"2"}, reruns
    # A long range, cancelled: its runs not started are cancelled.
    rc, out, _ = cli(capsys, node, "job", "backfill", "daily", "--from",
                     "2025-01-01T00:00:00Z", "--to", "2025-06-01T00:00:00Z")
    long_id = out.split()[0]
    rc, out, err = cli(capsys, node, "job", "backfill-cancel", long_id)
    assert rc == 0 and "cancelled" in out, (out, err)
    rc, _, err = cli(capsys, node, "job", "backfill", "daily", "--from", "soon", "--to",
                     "2026-03-02T00:00:00Z")
    assert rc == 1 and "from:" in err, err
    rc, _, err = cli(capsys, node, "job", "backfill", "daily", "--from",
                     "2000-01-01T00:00:00Z", "--to", "2026-03-02T00:00:00Z")
    assert rc == 1 and "to:" in err and "split" in err, err
