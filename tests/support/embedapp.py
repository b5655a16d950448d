"""An app with an embedded raftsched member, for the issue 15 tests: run as
``python -m tests.support.embedapp`` (one instance) or imported by gunicorn
(``tests.support.embedapp:app``, a WSGI app).

Environment: RAFTSCHED_CONFIG or RAFTSCHED_PEERS, RAFTSCHED_NODE_ID (the member);
EMBEDAPP_WITNESS (a file every execution appends one JSON line to); EMBEDAPP_JOBS
(how many 1 s jobs, default 10); EMBEDAPP_IDLE (also declare that many per-minute jobs
that do nothing, for the reconcile test); EMBEDAPP_CHANGED (the id of one idle job whose
cron this instance's code changes); EMBEDAPP_SLEEP (seconds each execution takes).
The instance prints one JSON line ``{"declared": ...}`` once its declarations committed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import raftsched

ENV = os.environ
WITNESS = ENV.get("EMBEDAPP_WITNESS", "")
SLEEP_S = float(ENV.get("EMBEDAPP_SLEEP", "0"))

sched = raftsched.Scheduler(data_dir=ENV.get("EMBEDAPP_DATA"), stop_timeout=10)


def tick(ctx: raftsched.RunContext) -> str:
    """Appends the run's identity to the witness file (the fire time executed here)."""
    rec = {"run_id": ctx.run_id, "job": ctx.job_id, "fence": ctx.fence,
           "attempt": ctx.attempt, "node": ctx.node_id, "pid": os.getpid(),
           "t": time.time()}
    if SLEEP_S:
        ctx.cancelled.wait(SLEEP_S)
    fd = os.open(WITNESS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)
    return f"pid {os.getpid()}"


def idle(ctx: raftsched.RunContext) -> None:
    """Declared only to be reconciled."""


for i in range(int(ENV.get("EMBEDAPP_JOBS", "10"))):
    sched.add_job(tick, id=f"tick{i}", every="1s", timeout="20s", overlap="allow",
                  misfire={"policy": "all", "grace": "60s", "max_catchup": 100})
for i in range(int(ENV.get("EMBEDAPP_IDLE", "0"))):
    job_id = f"idle{i}"
    sched.add_job(idle, id=job_id,
                  cron="*/5 * * * *" if ENV.get("EMBEDAPP_CHANGED") == job_id else "0 * * * *")


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """WSGI: ``/runs/<job>`` answers that job's runs (a client-mode worker asks the
    node), ``/role`` which role this worker has."""
    path = environ.get("PATH_INFO", "/")
    if path.startswith("/runs/"):
        body: Any = sched.runs(path[len("/runs/"):])
    else:
        body = {"role": sched.role, "pid": os.getpid()}
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


def _announce() -> None:
    report = sched.wait_declared(120)
    sys.stdout.write(json.dumps({"declared": {
        "pid": os.getpid(), "role": sched.role, "created": len(report.created),
        "updated": list(report.updated), "unchanged": len(report.unchanged)}}) + "\n")
    sys.stdout.flush()


sched.start()
threading.Thread(target=_announce, daemon=True).start()

if __name__ == "__main__":
    while True:  # until SIGTERM: the Scheduler exits cleanly and drains at exit
        time.sleep(3600)
