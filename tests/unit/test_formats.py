"""Upgrades (issue 16 item 6): every release reads the formats of the fixtures under
tests/fixtures (written by earlier releases), and refuses newer ones by name."""

from __future__ import annotations

import os

import pytest

from raftsched.core.codec import (
    COMMAND_VERSIONS,
    SNAPSHOT_VERSION,
    UNBOUNDED_SNAPSHOT_VERSION,
    decode_command,
    decode_state,
    encode_state,
    format_problem,
    packb,
    unknown_command_version,
)
from raftsched.core.errors import ProtocolError
from raftsched.core.machine import ClusterState
from tests.fixtures.formats import FIXTURES, expected, fixture_dir, journal_blobs

#: A command version no release of this code reads.
NEWER_COMMAND_VERSION = max(COMMAND_VERSIONS) + 1


def views(st: ClusterState) -> dict:
    return {"jobs": [st.job_view(j) for j in sorted(st.jobs)],
            "runs": {j: st.run_views(j, 1000) for j in sorted(st.jobs)}}


@pytest.mark.parametrize("name", FIXTURES)
def test_old_journal_replays_to_the_old_snapshot_and_the_api_view(name, tmp_path):
    journal = tmp_path / "raft.journal"
    journal.write_bytes(open(os.path.join(fixture_dir(name), "journal", "raft.journal"),
                             "rb").read())
    blobs = journal_blobs(str(journal))
    assert blobs, "the fixture journal holds commands"
    replayed = ClusterState()
    for blob in blobs:
        cmd = decode_command(blob)
        assert cmd is not None, blob[:60]
        replayed.apply_map(cmd)
    with open(os.path.join(fixture_dir(name), "snapshot.msgpack"), "rb") as f:
        old = decode_state(f.read())
    assert views(replayed) == views(old)
    exp = expected(name)
    got = views(old)
    assert [j["id"] for j in got["jobs"]] == sorted(j["id"] for j in exp["jobs"])
    api_jobs = {j["id"]: j for j in exp["jobs"]}
    for job in got["jobs"]:
        spec = dict(job["spec"], env={k: "***" for k in job["spec"].get("env", {})})
        # Keys a later release adds to the view (``done``) may join; none may go.
        want = api_jobs[job["id"]]
        assert {k: v for k, v in dict(job, spec=spec).items() if k in want} == want
    # The same for runs (``executed_ms`` joined later).
    assert sorted(got["runs"]) == sorted(exp["runs"])
    for job, want_runs in exp["runs"].items():
        assert [{k: v for k, v in r.items() if k in w}
                for r, w in zip(got["runs"][job], want_runs, strict=True)] == want_runs
    # What this release writes, it reads back the same.
    assert views(decode_state(encode_state(old))) == got


def test_a_newer_command_format_is_named_not_skipped():
    blob = packb({"op": "put_job", "at": 1, "v": NEWER_COMMAND_VERSION})
    assert decode_command(blob) is None
    assert unknown_command_version(blob) == NEWER_COMMAND_VERSION
    for known in COMMAND_VERSIONS:
        assert unknown_command_version(packb({"op": "read", "at": 1, "v": known})) is None
    assert unknown_command_version(b"\xc1garbage") is None
    msg = format_problem("command", NEWER_COMMAND_VERSION, COMMAND_VERSIONS)
    assert f"v{NEWER_COMMAND_VERSION}" in msg and "newer raftsched" in msg and "upgrade" in msg


def test_a_newer_snapshot_format_is_refused_with_a_clear_message():
    blob = encode_state(ClusterState())
    # A state without bounded jobs is written in the first version (see codec).
    newer = blob.replace(packb("v") + packb(UNBOUNDED_SNAPSHOT_VERSION),
                         packb("v") + packb(SNAPSHOT_VERSION + 1), 1)
    assert newer != blob
    with pytest.raises(ProtocolError, match="newer raftsched.*upgrade raftsched"):
        decode_state(newer)
