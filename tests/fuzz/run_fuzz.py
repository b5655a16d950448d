"""A long fuzz run against one real node, by hand (not collected by pytest).

    python -m tests.fuzz.run_fuzz --count 100000 [--seed N] [--check-every 1000]

Starts one node with a secret (tests.support.harness.Cluster), creates a protected
job with one finished run, then throws ``--count`` generated and mutated inputs
(tests.fuzz.Gen) at the API: well-framed bodies on an authenticated connection (each
must get exactly one well-formed reply) and raw byte streams on fresh connections
(every reply well-formed, then EOF). Every ``--check-every`` inputs and at the end it
checks that the node process is alive, answers ``status`` with health ok, and that the
protected job is byte-identical. Prints a summary; exits 1 on any failure (a malformed
reply, an ``internal`` error, a missing reply, a hang, a dead node, a changed job, a
traceback or the secret in the node's log).
"""

# ruff: noqa: T201
# (a command-line tool: printing is its output)

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from tests.fuzz import (
    PROTECTED_JOB,
    Gen,
    RawConn,
    body_touches_protected,
    check_reply,
    frame,
    packb,
    protected_spec,
)
from tests.support.harness import Cluster, wait_until

SECRET = "run-fuzz-secret-0123456789abcdef"
SOCK_TIMEOUT = 10.0
MAX_FAILURES_SHOWN = 20


class Runner:
    def __init__(self, cluster: Cluster, seed: int) -> None:
        self.cluster = cluster
        self.addr = cluster.api["n1"]
        self.gen = Gen(seed)
        self.client = cluster.client(timeout=15.0)
        self.codes: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.failures: list[str] = []
        self.skipped = 0
        self.conn: RawConn | None = None
        self.auth_failures = 0
        self.before: tuple[bytes, bytes] | None = None

    # ------------------------------------------------------------ setup / checks

    def setup(self) -> None:
        self.client.put_job(protected_spec(["true"]))
        self.client.trigger(PROTECTED_JOB)
        wait_until(lambda: all(r["state"] == "succeeded" for r in
                               self.client.runs(PROTECTED_JOB)["runs"] or [{"state": "-"}]),
                   20, "the protected job's run to finish")
        self.before = self.snapshot()

    def snapshot(self) -> tuple[bytes, bytes]:
        return (packb(self.client.get_job(PROTECTED_JOB)),
                packb(self.client.runs(PROTECTED_JOB, limit=1000)))

    def check_node(self, where: str) -> bool:
        if not self.cluster.alive("n1"):
            self.fail(f"{where}: the node process is dead")
            return False
        try:
            status = self.client.status()
            if status.get("health") != "ok":
                self.fail(f"{where}: status health {status.get('health')}: {status['summary']}")
            if self.snapshot() != self.before:
                self.fail(f"{where}: the protected job changed")
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the finding
            self.fail(f"{where}: status/get_job failed: {exc!r}")
            return False
        return True

    def check_log(self) -> None:
        with open(self.cluster.logs["n1"], encoding="utf-8", errors="replace") as f:
            text = f.read()
        if SECRET in text:
            self.fail("the node log holds the cluster secret")
        if "keep-env-value" in text:
            self.fail("the node log holds a job env value")
        if "Traceback" in text:
            at = text.index("Traceback")
            self.fail("the node logged a traceback: " + text[max(0, at - 300):at + 1500])

    def fail(self, what: str) -> None:
        self.failures.append(what)
        if len(self.failures) <= MAX_FAILURES_SHOWN:
            print(f"FAILURE: {what}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ inputs

    def _authed(self) -> RawConn:
        if self.conn is None:
            self.conn = RawConn(self.addr, SOCK_TIMEOUT)
            self.conn.auth(SECRET)
            self.auth_failures = 0
        return self.conn

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def framed(self, body: bytes, i: int) -> None:
        if body_touches_protected(body):
            self.skipped += 1
            return
        conn = self._authed()
        try:
            conn.send(frame(body))
            reply = conn.recv_frame()
        except TimeoutError:
            self.fail(f"input {i}: no reply within {SOCK_TIMEOUT}s to body {body[:80].hex()}")
            self._drop()
            return
        except OSError as exc:
            self.fail(f"input {i}: connection failed ({exc!r}) on body {body[:80].hex()}")
            self._drop()
            return
        if reply is None:
            self.fail(f"input {i}: closed without a reply to body {body[:80].hex()}")
            self._drop()
            return
        self._record(reply, i, body)
        if reply.get("error", {}).get("code") == "unauthenticated":
            # Only failed auths answer unauthenticated on an authenticated connection;
            # the third one ends it.
            self.auth_failures += 1
            if self.auth_failures >= 3:
                self._drop()

    def stream(self, data: bytes, i: int) -> None:
        try:
            with RawConn(self.addr, SOCK_TIMEOUT) as conn:
                try:
                    conn.send(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the node may close first (frame_too_large); read what it said
                for reply in conn.drain():
                    self._record(reply, i, data)
        except TimeoutError:
            self.fail(f"input {i}: stream not closed within {SOCK_TIMEOUT}s: {data[:80].hex()}")
        except ConnectionError as exc:
            self.fail(f"input {i}: stream {exc!r}: {data[:80].hex()}")

    def _record(self, reply: Any, i: int, data: bytes) -> None:
        try:
            code = check_reply(reply)
        except AssertionError as exc:
            self.fail(f"input {i}: malformed reply ({exc}) to {data[:80].hex()}")
            return
        self.codes[code] += 1
        if code == "internal":
            self.fail(f"input {i}: internal error {reply['error']['message']!r} for "
                      f"{data[:120].hex()}")

    def run(self, count: int, check_every: int) -> float:
        t0 = time.monotonic()
        inputs = self.gen.inputs()
        for i in range(1, count + 1):
            kind, data = next(inputs)
            self.kinds[kind] += 1
            if kind == "framed":
                self.framed(data, i)
            else:
                self.stream(data, i)
            if i % check_every == 0:
                if not self.check_node(f"after {i} inputs"):
                    break
                if i % (check_every * 10) == 0:
                    rate = i / (time.monotonic() - t0)
                    print(f"  {i} inputs, {rate:.0f}/s, {len(self.failures)} failures",
                          flush=True)
            if len(self.failures) > 1000:
                break
        elapsed = time.monotonic() - t0
        self._drop()
        self.check_node("at the end")
        self.check_log()
        return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.run_fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100_000, help="inputs to send")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--check-every", type=int, default=1000, metavar="N",
                   help="check the node every N inputs")
    p.add_argument("--keep-tmp", action="store_true", help="keep the node's directory")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    tmp = tempfile.mkdtemp(prefix="rs-run-fuzz-")
    print(f"run_fuzz: count={args.count} seed={seed} dir={tmp}", flush=True)
    cluster = Cluster(tmp, 1, secret=SECRET)
    runner: Runner | None = None
    try:
        cluster.start_all()
        cluster.wait_leader()
        runner = Runner(cluster, seed)
        runner.setup()
        elapsed = runner.run(args.count, args.check_every)
    finally:
        if runner is not None:
            runner.client.close()
        cluster.close()
    sent = sum(runner.kinds.values())
    print(f"inputs: {sent} ({dict(runner.kinds)}), skipped (would touch {PROTECTED_JOB!r}): "
          f"{runner.skipped}")
    print(f"time: {elapsed:.1f}s, {sent / elapsed:.0f} inputs/s")
    print("replies by code: " + ", ".join(f"{k}={v}" for k, v in runner.codes.most_common()))
    print(f"failures: {len(runner.failures)}")
    for what in runner.failures[:MAX_FAILURES_SHOWN]:
        print(f"  - {what[:500]}")
    if runner.failures or args.keep_tmp:
        print(f"node log kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if runner.failures else 0


if __name__ == "__main__":
    sys.exit(main())
