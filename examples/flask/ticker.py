"""A Flask app with a scheduled job that appends to a file — once per fire time, however
many instances or workers run the app. No Redis, no database: the instances are the
Raft cluster.

Which member this instance is comes from the environment (one image, every replica):
RAFTSCHED_PEERS="n1=RAFT/API,n2=...,n3=..." and RAFTSCHED_NODE_ID=n2; with neither it
is a single node (data in ./raftsched-embedded), which every gunicorn worker of this
host shares. TICKS_FILE names the file the job appends to.
"""

from __future__ import annotations

import datetime
import os

from flask import Flask

import raftsched

TICKS = os.environ.get("TICKS_FILE", "ticks.txt")

sched = raftsched.Scheduler(stop_timeout=10)


@sched.job(every="1s", id="append-tick", overlap="allow",
           misfire={"policy": "all", "grace": "1m", "max_catchup": 100})
def append_tick(ctx: raftsched.RunContext) -> None:
    ran = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    with open(TICKS, "a", encoding="utf-8") as f:
        f.write(f"{ctx.scheduled_at} {ctx.node_id} pid={os.getpid()} attempt={ctx.attempt} "
                f"ran={ran}\n")


app = Flask(__name__)


@app.get("/")
def index() -> dict[str, object]:
    """This worker's role and the job's newest runs (a client worker asks the node)."""
    runs = sched.runs("append-tick", limit=3)["runs"]
    return {"role": sched.role, "pid": os.getpid(),
            "runs": [(r["run_id"], r["state"], r["node"]) for r in runs]}


sched.start()
