"""Hand-made histories for the nemesis checker's tests: run records and witness lines."""

from __future__ import annotations


def rec(job: str, t: int, state: str = "succeeded", **kw):
    """A run record as the API lists it (``kw`` overrides fields)."""
    r = {"run_id": f"{job}@{t}", "job_id": job, "scheduled_ms": t, "state": state,
         "attempt": 1, "fence": 1, "until_ms": None, "count": 1, "manual": False,
         "started_ms": t, "transitions": []}
    r.update(kw)
    return r


def wl(run_id, fence, pid, phase, t, attempt=1, node="n1"):
    """A witness line of an execution (``phase``: start, tick or end)."""
    return {"RUN_ID": run_id, "JOB_ID": run_id.split("@")[0], "FENCE": str(fence),
            "ATTEMPT": str(attempt), "NODE_ID": node, "pid": pid, "phase": phase, "t": t}
