"""What every test gets: its tier's markers (from its folder), the hypothesis profile,
a temporary cluster of real node processes (cleaned up always), and CI's skip policy.

The tiers (docs/development.md): ``tests/unit`` pure and process-free;
``tests/inprocess`` threads, sockets, in-process replicas and embedded nodes, child
processes that are not nodes; ``tests/cluster`` real node processes; ``tests/faults``
faults injected in real time (SIGKILL, SIGSTOP, pauses, partitions, power cuts,
overload). A test file anywhere else (a new one not yet placed) counts as ``cluster``:
never in the fast loop by mistake.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TESTS = Path(__file__).resolve().parent
#: Folder -> tier marker. The fast loop is the first two (``-m "not integration"``).
TIERS = {"unit": "unit", "inprocess": "inprocess", "cluster": "cluster", "faults": "faults"}
#: Tiers whose tests start node processes or inject faults in real time.
INTEGRATION_TIERS = {"cluster", "faults"}

# Hypothesis: "ci" (the default) runs every property at the budget its test names;
# HYPOTHESIS_PROFILE=dev runs each at a tenth of it (tests.support.budget.examples),
# for the fast loop. Both keep hypothesis's example database (a failure found is
# replayed first next time).
settings.register_profile("ci", deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def tier_of(path: Path) -> str:
    """The tier of a test file, from the folder under tests/ it sits in."""
    try:
        folder = Path(path).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return "cluster"
    return TIERS.get(folder, "cluster")


#: Tests that load both cores for a minute or more (a storm of thousands of runs, the
#: nemesis's network namespaces): one xdist group, so no two of them run at once.
HEAVY = {"test_nemesis.py", "test_overload.py"}
#: Tests that must have the machine to themselves: a storm driven past capacity on
#: purpose, which asserts that no node loses its lease; beside two other workers (and a
#: loaded CI machine) its nodes were once starved into a self-fence.
ALONE = {"test_overload.py"}
#: The order tests are handed to the xdist workers: the heavy group, then the most
#: expensive tier first, so the long tests do not start last and leave workers idle.
ORDER = {"heavy": 0, "faults": 1, "cluster": 2, "inprocess": 3, "unit": 4}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (before ``-m`` selects): ``integration`` on the
    cluster and faults tiers, ``slow`` on faults; group the heavy ones, and order the
    whole by cost (stable: a module's tests stay together and in order)."""
    rank: dict[str, int] = {}
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(tier)
        if tier in INTEGRATION_TIERS:
            item.add_marker("integration")
        if tier == "faults":
            item.add_marker("slow")
        heavy = item.path.name in HEAVY
        if heavy:
            item.add_marker(pytest.mark.xdist_group("heavy"))
        rank[item.nodeid] = ORDER["heavy" if heavy else tier]
    items.sort(key=lambda item: rank[item.nodeid])

@contextlib.contextmanager
def _machine_share(alone: bool) -> Iterator[None]:
    """Under xdist, a test of ALONE waits until no other test runs and keeps the others
    out while it runs; every other test shares the machine with its peers. Two lock
    files of this run: the gate (a test of ALONE closes it: no new test enters, so it is
    not starved) and the room (shared by running tests, exclusive for one of ALONE)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    base = os.path.join(tempfile.gettempdir(), f"raftsched-xdist-{run}")
    with open(base + ".gate", "a") as gate, open(base + ".room", "a") as room:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(room, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(room, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Outside pytest-timeout's own wrapper: the wait for the machine is not the test's
    time."""
    with _machine_share(item.path.name in ALONE):
        yield


# Nodes without a configured secret leave pointers to their generated secret for the
# local clients (raftsched.wire.secretfile); this run's go to a private temp dir, not
# the user's home. Node processes inherit it.
os.environ.setdefault("RAFTSCHED_RUNTIME_DIR", tempfile.mkdtemp(prefix="rs-runtime-"))


@pytest.fixture
def cluster_factory(tmp_path):
    """Build :class:`tests.support.harness.Cluster` objects; all are closed at the end."""
    from tests.support.harness import Cluster

    made = []

    def make(n: int = 3, **kw):
        c = Cluster(str(tmp_path), n, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# Issue 27: a CI run cannot go green with its hardest tests skipped. With
# RAFTSCHED_REQUIRE_ALL=1 (.ci/run sets it) any skip whose reason is not listed here
# fails the session, and the summary names each one.
ALLOWED_SKIPS = {
    # The container image is built and run by hand (docs/operations.md): CI machines
    # have a docker client at most, no daemon.
    "no container engine answers here": "no Docker daemon on CI machines",
}
_SKIPPED: list[tuple[str, str]] = []
#: Seconds per test (setup + call + teardown), for the tiers' totals and CI's file.
_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _SKIPPED.append((report.nodeid, str(reason)))


def disallowed_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips ALLOWED_SKIPS does not account for."""
    return [(node, why) for node, why in skipped
            if not any(fragment in why for fragment in ALLOWED_SKIPS)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    """Seconds per tier; with ``RAFTSCHED_DURATIONS=FILE`` (.ci/run sets it) every test's
    seconds and tier into FILE as JSON, slowest first: which tier a test belongs in is
    read from data."""
    if not _DURATIONS:
        return
    tiers = {node: tier_of(config.rootpath / node.split("::")[0]) for node in _DURATIONS}
    seconds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for node, took in _DURATIONS.items():
        seconds[tiers[node]] += took
        counts[tiers[node]] += 1
    terminalreporter.write_sep("-", "seconds per tier (setup + call + teardown)")
    terminalreporter.write_line("  ".join(f"{t}: {seconds[t]:.0f} s, {counts[t]} tests"
                                          for t in TIERS.values() if counts[t]))
    path = os.environ.get("RAFTSCHED_DURATIONS")
    if path:
        ranked = sorted(_DURATIONS.items(), key=lambda kv: -kv[1])
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"tiers": {t: {"seconds": round(seconds[t], 2), "tests": counts[t]}
                                 for t in TIERS.values() if counts[t]},
                       "tests": [{"test": node, "tier": tiers[node], "seconds": round(took, 3)}
                                 for node, took in ranked]}, f, indent=1)
        terminalreporter.write_line(f"every test's duration: {path}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("RAFTSCHED_REQUIRE_ALL") != "1":
        return
    bad = disallowed_skips(_SKIPPED)
    if not bad:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", f"{len(bad)} test(s) skipped where CI requires them "
                                "(RAFTSCHED_REQUIRE_ALL=1)", red=True)
        for node, why in bad:
            reporter.write_line(f"SKIPPED {node}: {why}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
