"""Issue 17 item 4 through real nodes: failure notifications are signed webhooks, retried
with backoff, tracked in the replicated state (``notify`` in ``runs``), and delivered by
whichever node leads — also when the leader is SIGKILLed in the middle of a delivery
(then the receiver sees that delivery's idempotency key again: at least once)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from raftsched.wire import webhook
from tests.cluster.test_readme import block as readme_block
from tests.support.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SECRET = "notify-test-secret"


class Receiver:
    """A loopback webhook receiver. Per path: ``fail[path]`` first requests of each
    delivery key answer 500 (``-1``: all of them); ``hold`` (an Event) keeps the first
    request of a key ``hold_key`` matches (a key, or a predicate of the key) waiting
    until it is set."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail: dict[str, int] = {}
        self.hold_key: str | Callable[[str], bool] | None = None
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        key = webhook.notify_key(SECRET)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                h = self.headers
                rec = {"path": self.path, "key": h[webhook.DELIVERY_HEADER],
                       "attempt": h[webhook.ATTEMPT_HEADER], "body": json.loads(body),
                       "valid": webhook.verify(key, h[webhook.TIMESTAMP_HEADER],
                                               h[webhook.SIGNATURE_HEADER], body)}
                with outer.lock:
                    seen = sum(r["key"] == rec["key"] for r in outer.requests)
                    outer.requests.append(rec)
                hold = outer.hold_key
                if seen == 0 and (rec["key"] == hold or (callable(hold) and hold(rec["key"]))):
                    outer.held.set()
                    outer.release.wait(60)
                fail = outer.fail.get(self.path, 0)
                status = 500 if fail == -1 or seen < fail else 200
                rec["status"] = status
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, key: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["key"] == key]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _cluster(cluster_factory, n: int, receiver: Receiver, attempts: int = 4):
    c = cluster_factory(n, secret=SECRET)
    with open(c.config, "a", encoding="utf-8") as f:
        f.write(f'\n[notify]\nurl = "{receiver.url}/default"\non = ["failed"]\n'
                f'attempts = {attempts}\nbackoff = "200ms"\nbackoff_max = "1s"\n')
    c.start_all()
    c.wait_leader()
    wait_until(lambda: c.status(c.ids[0])["notify"]["default"], 20,
               "the leader committed the cluster default")
    return c


def _notify(c, job: str) -> dict[str, Any] | None:
    with c.client() as cl:
        runs = cl.runs(job)["runs"]
    done = [r for r in runs if r["state"] not in ("pending", "assigned", "started")]
    return done[0].get("notify") if done else None


def test_retries_until_delivered_per_job_and_default_webhooks_give_up(
        cluster_factory, receiver):
    receiver.fail = {"/default": 2, "/never": -1}
    c = _cluster(cluster_factory, 1, receiver)
    far = {"at": "2099-01-01T00:00:00Z"}
    with c.client() as cl:
        cl.put_job({"id": "fails", "schedule": far, "command": ["false"]})
        cl.put_job({"id": "ok", "schedule": far, "command": ["true"]})
        cl.put_job({"id": "quiet", "schedule": far, "command": ["false"],
                    "notify": {"on": []}})
        cl.put_job({"id": "slow", "schedule": far, "command": ["sleep", "10"],
                    "timeout": "1s", "notify": {"on": ["timed_out"],
                                                "url": receiver.url + "/slow"}})
        cl.put_job({"id": "never", "schedule": far, "command": ["false"],
                    "notify": {"url": receiver.url + "/never"}})
        for job in ("fails", "ok", "quiet", "slow", "never"):
            cl.trigger(job)

    st = wait_until(lambda: (s := _notify(c, "fails")) and s["state"] == "delivered" and s,
                    40, "fails' notification delivered")
    assert st["attempts"] == 3 and st["key"].startswith("fails@") \
        and st["key"].endswith("/failed"), st
    reqs = receiver.of(st["key"])
    # Two refused, the third accepted: the same key and body each time, each signed.
    assert [r["status"] for r in reqs] == [500, 500, 200], reqs
    assert [r["attempt"] for r in reqs] == ["1", "2", "3"]
    assert all(r["valid"] and r["path"] == "/default" for r in reqs)
    body = reqs[0]["body"]
    assert all(r["body"] == body for r in reqs)
    assert body["delivery"] == st["key"] and body["outcome"] == "failed"
    assert body["run"]["state"] == "failed" and body["run"]["exit_code"] == 1
    sample = json.loads(readme_block("", '{"v": 1, "delivery"').text)
    assert set(sample) == set(body) and set(sample["run"]) == set(body["run"]), body

    st = wait_until(lambda: (s := _notify(c, "slow")) and s["state"] == "delivered" and s,
                    40, "slow's timed_out notification delivered")
    assert [r["path"] for r in receiver.of(st["key"])] == ["/slow"]
    st = wait_until(lambda: (s := _notify(c, "never")) and s["state"] == "failed" and s,
                    40, "never's notification given up")
    assert st["attempts"] == 4 and st["error"] == "HTTP 500", st
    assert len(receiver.of(st["key"])) == 4
    # Succeeded runs and opted-out jobs tell nobody.
    assert _notify(c, "ok") is None and _notify(c, "quiet") is None
    assert not [r for r in receiver.requests if r["key"].startswith(("ok@", "quiet@"))]
    assert c.status("n1")["notify"]["pending"] == 0
    # No key was acknowledged twice (no failover here).
    acked = [r["key"] for r in receiver.requests if r.get("status") == 200]
    assert len(acked) == len(set(acked)) == 2


def test_a_delivery_cut_off_by_a_leader_sigkill_is_completed_by_the_next_leader(
        cluster_factory, receiver):
    c = _cluster(cluster_factory, 3, receiver)
    # Set before the trigger: on a loaded machine the run can fail and its
    # notification be posted before trigger() returns the run id.
    receiver.hold_key = lambda key: key.startswith("boom@") and key.endswith("/failed")
    with c.client() as cl:
        cl.put_job({"id": "boom", "schedule": {"at": "2099-01-01T00:00:00Z"},
                    "command": ["false"]})
        run_id = cl.trigger("boom")["run_id"]
    key = f"{run_id}/failed"
    assert receiver.held.wait(40), "the leader posted the notification"
    assert receiver.of(key), receiver.requests
    leader = c.wait_leader()
    c.kill(leader)
    receiver.release.set()  # answers 200 to a sender that is gone
    survivors = [n for n in c.ids if n != leader]
    c.wait_leader(among=survivors)

    def delivered() -> dict[str, Any] | None:
        with c.client(survivors) as cl:
            runs = cl.runs("boom")["runs"]
        st = runs[0].get("notify") if runs else None
        return st if st and st["state"] == "delivered" else None

    st = wait_until(delivered, 60, "the new leader delivered the notification")
    reqs = receiver.of(key)
    assert len(reqs) >= 2, reqs  # the cut-off attempt, then the new leader's
    assert all(r["valid"] and r["body"] == reqs[0]["body"] for r in reqs)
    assert reqs[0]["body"]["run"]["run_id"] == run_id
    assert st["key"] == key
