"""Issue 32 item 3, the node's side: full run logs on disk — stdout and stderr apart,
the job's env values masked (also split across reads), bounded per run, per job and
per node with the oldest removed first, found again after a restart, read in chunks
that end on whole characters; and the config keys that bound them."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any

import pytest

from raftsched.core.errors import ConfigError
from raftsched.core.model import JobSpec
from raftsched.faces.cli_logs import notes
from raftsched.node.config.config import Limits, parse_config
from raftsched.node.worker.executor import Execution
from raftsched.node.worker.output import MASK, ByteTail, Output, Scrubber
from raftsched.node.worker.runlog import LogLimits, RunLogs, job_dir, split_run_id
from raftsched.node.worker.runtypes import ExecutionResult, RunContext

BIG = LogLimits(run_bytes=1 << 20, job_bytes=1 << 22, job_runs=100, node_bytes=1 << 24)


def written(store: RunLogs, run: str, attempt: int, out: bytes = b"", err: bytes = b"") -> None:
    log = store.open(run, attempt)
    assert log is not None
    log.write(out)
    log.write(err, True)
    log.close()


def read_all(store: RunLogs, run: str, attempt: int = 1, stream: int = 0) -> bytes:
    job, ms = split_run_id(run) or ("", 0)
    return store.read((job, ms, attempt), stream, 0, 1 << 30)["data"]


def test_streams_apart_lazily_created_private_and_read_in_chunks(tmp_path) -> None:
    store = RunLogs(str(tmp_path / "logs"), BIG)
    written(store, "a@1000", 1, b"out\n", "érr\n".encode())
    written(store, "a@2000", 1)  # printed nothing: no file
    assert read_all(store, "a@1000") == b"out\n"
    assert read_all(store, "a@1000", stream=1) == "érr\n".encode()
    assert sorted(os.listdir(job_dir(store.root, "a"))) == ["1000-1.err", "1000-1.out"]
    assert os.stat(job_dir(store.root, "a")).st_mode & 0o077 == 0
    assert os.stat(os.path.join(job_dir(store.root, "a"), "1000-1.out")).st_mode & 0o077 == 0
    part = store.read(("a", 2000, 1), 0, 0, 10)
    assert part["data"] == b"" and part["size"] == 0 and not part["writing"]
    # A chunk ends on a whole character while the log grows, or where the limit cut it.
    log = store.open("a@3000", 1)
    assert log is not None
    log.write("ab€".encode()[:-1])
    assert store.read(("a", 3000, 1), 0, 0, 100)["data"] == b"ab"
    log.write("€".encode()[-1:] + b"c")
    got = store.read(("a", 3000, 1), 0, 0, 4)
    assert got["data"] == b"ab" and got["next_offset"] == 2 and got["writing"]
    log.close()
    assert store.read(("a", 3000, 1), 0, -3, 100)["data"] == "€".encode()[1:] + b"c"
    # Job ids "." and ".." are valid: their folders stay inside the logs folder.
    written(store, "..@5", 1, b"dots")
    assert os.path.isdir(os.path.join(store.root, "job-..")) and read_all(store, "..@5") == b"dots"
    assert split_run_id("nope") is None and split_run_id("a@-1") is None


def test_a_run_over_its_bound_keeps_its_start_and_says_what_was_cut(tmp_path) -> None:
    store = RunLogs(str(tmp_path), LogLimits(run_bytes=1024, job_bytes=4096, job_runs=10,
                                             node_bytes=8192))
    log = store.open("big@1", 1)
    assert log is not None
    for _ in range(30):
        log.write(b"x" * 100)
    log.write(b"e" * 50, True)
    log.close()
    out = read_all(store, "big@1")
    assert out.startswith(b"x" * 1024)
    assert out.endswith(b"[raftsched: 1976 more bytes of stdout not kept: "
                        b"limits.log_bytes_per_run (1024) reached; the run record's tail "
                        b"has the end]\n")
    assert b"50 more bytes of stderr" in read_all(store, "big@1", stream=1)


def test_oldest_logs_go_first_per_job_and_per_node_never_one_being_written(tmp_path) -> None:
    lim = LogLimits(run_bytes=1024, job_bytes=3000, job_runs=3, node_bytes=5000)
    store = RunLogs(str(tmp_path), lim)
    writing = store.open("a@0", 1)
    assert writing is not None
    writing.write(b"w" * 1000)
    for ms in range(1, 6):  # a: five runs; three kept (log_runs_per_job)
        written(store, f"a@{ms}", 1, b"a" * 100)
    assert [k[1] for k in store._jobs["a"]] == [3, 4, 5]
    assert store.removed(("a", 1, 1)) == "log_runs_per_job"
    for ms in range(1, 4):  # b: 3 x 1000 bytes; over its 3000 with the 4th
        written(store, f"b@{ms}", 1, b"b" * 1000)
    written(store, "b@4", 1, b"b" * 1000)
    assert [k[1] for k in store._jobs["b"]] == [2, 3, 4]
    assert store.removed(("b", 1, 1)) == "log_bytes_per_job"
    # The node's bound: 3,300 + 2,000 more goes over 5,000; the oldest (a's) go first.
    written(store, "c@1", 1, b"c" * 1000)
    written(store, "c@2", 1, b"c" * 1000)
    assert store.total == lim.node_bytes and "a" not in store._jobs
    assert store.removed(("a", 5, 1)) == "log_bytes_per_node" and ("b", 2, 1) in store._done
    assert read_all(store, "a@3") == b"" and read_all(store, "b@4") == b"b" * 1000
    # The one being written was never a candidate.
    assert read_all(store, "a@0") == b"w" * 1000 and store.is_open(("a", 0, 1))
    writing.close()


def test_after_a_restart_the_logs_on_disk_are_indexed_and_pruned(tmp_path) -> None:
    store = RunLogs(str(tmp_path), BIG)
    for ms in range(1, 6):
        written(store, f"j@{ms}", 1, b"x" * 100, b"e")
        os.utime(os.path.join(job_dir(store.root, "j"), f"{ms}-1.out"), (ms, ms))
        os.utime(os.path.join(job_dir(store.root, "j"), f"{ms}-1.err"), (ms, ms))
    (tmp_path / "job-j" / "stray.txt").write_text("not a log")
    again = RunLogs(str(tmp_path), LogLimits(run_bytes=1024, job_bytes=4096, job_runs=2,
                                             node_bytes=1 << 20))
    written(again, "k@1", 1, b"new")  # finished before the scan ended: newer than all
    again.adopt(again.scan())
    assert [k[1] for k in again._jobs["j"]] == [4, 5] and ("k", 1, 1) in again._done
    assert again.total == 2 * 101 + 3
    assert sorted(os.listdir(tmp_path / "job-j")) == ["4-1.err", "4-1.out", "5-1.err",
                                                      "5-1.out", "stray.txt"]
    # A node with log_bytes_per_node = 0 keeps none, and removes what is left.
    off = RunLogs(str(tmp_path), LogLimits(run_bytes=1024, job_bytes=4096, job_runs=2,
                                           node_bytes=0))
    assert off.open("j@9", 1) is None
    off.adopt(off.scan())
    assert off.total == 0 and not os.path.exists(tmp_path / "job-k")


def test_env_values_are_masked_even_split_across_reads() -> None:
    s = Scrubber(["hunter2-secret", "tiny", "hunter2"])
    pieces = [b"pass: hunt", b"er2-sec", b"ret and hun", b"ter2 and tiny, hu"]
    got = b"".join(s.feed(p) for p in pieces) + s.flush()
    assert got == b"pass: *** and *** and tiny, hu"
    assert s.feed(b"") == b""
    # However the bytes are split, the result is that of the whole text at once.
    import random
    rnd = random.Random(7)
    values = ["abcdef", "defxyz", "abcdefgh", "zzzzzz"]
    for _ in range(300):
        text = bytes(rnd.choice(b"abcdefghxyz ") for _ in range(rnd.randrange(0, 60)))
        whole = Scrubber(values)
        want = whole.feed(text) + whole.flush()
        cuts = sorted(rnd.sample(range(len(text) + 1), min(len(text) + 1, 4)))
        split = Scrubber(values)
        got = b"".join(split.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)],
                                                             strict=True)) + split.flush()
        assert got == want, (text, cuts)
        assert b"abcdef" not in got and b"defxyz" not in got
    plain = Scrubber([])
    assert plain.feed(b"anything") == b"anything" and plain.flush() == b""
    tail = ByteTail(64)
    out = Output(tail, None, ["s3cr3t-value"])
    for chunk in (b"token=s3cr", b"3t-value\n"):
        out.add(chunk)
    out.finish()
    assert out.text() == "token=***\n" and MASK == b"***"


def _execution(spec: dict[str, Any], store: RunLogs, run_id: str = "e@1000") -> Execution:
    job = JobSpec.from_spec(dict({"id": "e", "schedule": {"every": "1s"}}, **spec),
                            allowed_call_prefixes=("tests",))
    ctx = RunContext(job_id="e", run_id=run_id, scheduled_ms=1000, fence=7, attempt=2,
                     node_id="n1")
    return Execution(spec=job, ctx=ctx, base_env=dict(os.environ), tail_bytes=4096,
                     allowed=("tests",), kill_grace_s=0.5, logs=store)


def _run(execution: Execution) -> ExecutionResult:
    async def go() -> ExecutionResult:
        done: asyncio.Future[ExecutionResult] = asyncio.get_running_loop().create_future()
        execution.start(done.set_result)
        return await asyncio.wait_for(done, 30)
    return asyncio.run(go())


def test_a_process_run_logs_both_streams_masked_and_closes_its_log(tmp_path) -> None:
    store = RunLogs(str(tmp_path), BIG)
    script = "import os,sys\nprint('hello', os.environ['TOKEN'])\nsys.stdout.flush()\n" \
             "print('oops', file=sys.stderr)\n"
    result = _run(_execution({"command": [sys.executable, "-c", script],
                              "env": {"TOKEN": "abc-secret-123"}}, store))
    assert result.outcome == "succeeded", result
    assert read_all(store, "e@1000", 2) == b"hello ***\n"
    assert read_all(store, "e@1000", 2, stream=1) == b"oops\n"
    assert "hello ***" in result.tail and "oops" in result.tail and "abc-secret" not in \
        result.tail
    assert not store.is_open(("e", 1000, 2)) and ("e", 1000, 2) in store._done


def printing_job(ctx: Any) -> str:
    import logging
    print("from the callable")  # noqa: T201 - the output under test
    print("to stderr", file=sys.stderr)  # noqa: T201 - the output under test
    logging.getLogger("tests.job").warning("a warning")

    def other() -> None:  # a thread the callable starts inherits no run: not captured
        print("from another thread")  # noqa: T201 - the output under test

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return "the value"


def test_a_callable_s_prints_and_logs_go_to_its_log(tmp_path) -> None:
    store = RunLogs(str(tmp_path), BIG)
    result = _run(_execution({"call": "tests.unit.test_run_logs:printing_job"}, store))
    assert result.outcome == "succeeded" and result.tail.endswith("the value"), result
    assert read_all(store, "e@1000", 2) == b"from the callable\n"
    err = read_all(store, "e@1000", 2, stream=1).decode()
    assert "to stderr\n" in err and "WARNING tests.job: a warning" in err
    assert "another thread" not in err


def test_the_limits_are_config_keys_validated_by_name() -> None:
    base = {"cluster": {"data_dir": "d"},
            "nodes": [{"id": "n1", "raft": "127.0.0.1:1", "api": "127.0.0.1:2"}]}
    d = Limits()
    assert (d.log_bytes_per_run, d.log_bytes_per_job, d.log_runs_per_job,
            d.log_bytes_per_node) == (16 << 20, 64 << 20, 100, 1 << 30)
    cfg = parse_config(dict(base, limits={"log_bytes_per_node": 0, "log_runs_per_job": 5}))
    assert LogLimits.of(cfg.limits).node_bytes == 0 and cfg.limits.log_runs_per_job == 5
    for limits, key in (({"log_bytes_per_run": 1 << 30}, "limits.log_bytes_per_run"),
                        ({"log_bytes_per_job": 1 << 31}, "limits.log_bytes_per_job"),
                        ({"log_runs_per_job": 0}, "limits.log_runs_per_job"),
                        ({"log_bytes_per_node": -1}, "limits.log_bytes_per_node"),
                        ({"log_bytes_per_run": "1MB"}, "limits.log_bytes_per_run")):
        with pytest.raises(ConfigError) as info:
            parse_config(dict(base, limits=limits))
        assert info.value.key == key, (limits, str(info.value))


def test_the_cli_says_what_the_log_alone_does_not() -> None:
    reply = {"run_id": "j@1", "attempt": 1, "node": "n2", "state": "started", "done": False,
             "sizes": {"stdout": 5, "stderr": 12}, "removed": None}
    assert notes(reply, False, False) == [
        "12 bytes on stderr: raftsched logs j@1 --stderr",
        "j@1 is still running on n2: --follow to keep reading"]
    assert notes(dict(reply, done=True), True, False) == [
        "5 bytes on stdout: raftsched logs j@1"]
    assert notes(dict(reply, done=True, removed="log_runs_per_job",
                      sizes={"stdout": 0, "stderr": 0}), False, False) == [
        "the log of j@1 (attempt 1) was removed from n2 by its limits "
        "(limits.log_runs_per_job)"]
    assert notes(dict(reply, node=None, state="missed", done=True, sizes={}), False,
                 False) == ["j@1 never ran on a node (missed): it has no log"]
