"""A short seeded nemesis run in the suite: 3 nodes in network namespaces, one fault
of every kind (slow links, wall-clock steps and the leader's isolation included), then
the checker. It fails on the violation classes in :data:`tests.nemesis.run.STRICT`:
every guarantee, and the promises kept by doing work (a succeeded run executed,
nothing left unsettled, progress away from faults, no two runs of a skip/queue job at
once, read errors only around faults, a leader after every heal, no guard kill as a
run starts). The whole-node freeze window is measured and bounded
(``checker.FREEZE_WINDOW_BOUND_S``); unavailability is printed."""

from __future__ import annotations

import json

import pytest

from tests.nemesis.faults import KINDS
from tests.nemesis.net import available
from tests.nemesis.run import STRICT, Busy, run

#: Faults in the CI run: one of each kind (at most 120 s of them; with setup, the quiet
#: tail and settling about 2.5 minutes; the 1,000-fault runs by hand are the evidence).
CI_FAULTS = len(KINDS)
CI_SEED = 14


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_seeded_nemesis_run_keeps_the_strict_guarantees(tmp_path) -> None:
    why = available()
    if why:
        pytest.skip(why)
    try:
        report = run(nodes=3, faults=CI_FAULTS, seed=CI_SEED, out=str(tmp_path), jobs=10,
                     budget_s=120, lock_wait_s=120, kinds=KINDS, log=lambda m: None)
    except Busy as exc:
        pytest.skip(str(exc))
    summary = {k: report[k] for k in ("faults_by_kind", "fire_times_checked", "executions",
                                      "progress",
                                      "violations", "unavailability",
                                      "freeze_window_after_thaw_s",
                                      "guard_kills_within_300ms_of_start",
                                      "releases_of_lost_nodes")}
    print("\n" + json.dumps(summary))  # noqa: T201 - the report-only figures
    assert report["faults_by_kind"] == dict.fromkeys(KINDS, 1), report["faults_by_kind"]
    assert report["fire_times_checked"] > 100
    assert report["writes_acknowledged"] > 0 and report["reads"] > 0
    broken = {c: report["examples"].get(c) for c in STRICT if report["violations"][c]}
    assert not broken, json.dumps(broken, indent=1, default=str)[:6000]


def test_the_cli_documents_its_options() -> None:
    import subprocess
    import sys

    from tests.support.harness import ROOT
    out = subprocess.run([sys.executable, "-m", "tests.nemesis", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for opt in ("--nodes", "--faults", "--seed", "--out", "--budget-s"):
        assert opt in out
