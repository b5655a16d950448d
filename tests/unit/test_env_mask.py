"""Issue 12 item 5: the env mask ``job get`` shows (``***``) never becomes a job's value.

A put carrying the mask is refused where it enters, naming the field; a spec already
in a journal is still replayed (replicas must agree), and the executor refuses to run
it (tests/cluster/test_job_files.py runs the whole get -> put round trip)."""

from __future__ import annotations

import asyncio

import pytest

from raftsched.core.errors import InvalidSpec
from raftsched.core.model import ENV_MASK, JobSpec
from raftsched.node.worker.executor import Execution
from raftsched.node.worker.runtypes import ExecutionResult, RunContext

SPEC = {"id": "m", "schedule": {"every": "1s"}, "command": ["true"],
        "env": {"A": "fine", "TARGET": "s3://bucket"}}


def test_the_redacted_spec_put_back_is_refused_naming_the_field() -> None:
    job = JobSpec.from_spec(SPEC, allowed_call_prefixes=())
    shown = job.redacted()
    assert shown["env"] == {"A": ENV_MASK, "TARGET": ENV_MASK}
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec(shown, allowed_call_prefixes=())
    assert info.value.field == "env.A"
    assert str(info.value).startswith("env.A: '***' is the mask")
    with pytest.raises(InvalidSpec) as info:
        JobSpec.from_spec(dict(SPEC, env={"A": "x", "TARGET": "***"}), allowed_call_prefixes=())
    assert info.value.field == "env.TARGET"
    # Values merely containing the mask are values.
    JobSpec.from_spec(dict(SPEC, env={"A": "a***b", "B": "**"}), allowed_call_prefixes=())


def test_replay_keeps_an_accepted_spec_but_the_executor_never_runs_it(tmp_path) -> None:
    masked = dict(SPEC, command=["sh", "-c", f"echo $TARGET > {tmp_path}/ran"],
                  env={"TARGET": ENV_MASK})
    job = JobSpec.from_spec(masked, allowed_call_prefixes=None)  # the state machine's replay
    assert job.env == {"TARGET": ENV_MASK}
    ctx = RunContext(job_id="m", run_id="m@1000", scheduled_ms=1000, fence=1, attempt=1,
                     node_id="n1")
    execution = Execution(spec=job, ctx=ctx, base_env={}, tail_bytes=64, allowed=(),
                          kill_grace_s=0.5)
    result: ExecutionResult = asyncio.run(execution.run())
    assert result.outcome == "failed"
    assert result.reason.startswith("env.TARGET holds the display mask")
    assert not (tmp_path / "ran").exists()
