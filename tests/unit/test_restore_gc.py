"""A restore keeps the collector off the state it decoded: frozen before the collector
is back on (its first young collection walked every decoded object: 0.3 s of a
1M-job restart)."""

from __future__ import annotations

import gc
from typing import Any

from raftsched.core.codec import encode_state
from raftsched.core.machine import ClusterState
from raftsched.node.replica.replica import Replica

T0 = 1_800_000_000_000


def _blob(n: int) -> bytes:
    st = ClusterState()
    for i in range(0, n, 500):
        st.apply_map({"op": "put_jobs", "at": T0, "rid": f"p{i}", "specs": [
            {"id": f"j{k:06d}", "schedule": {"at": "2099-01-01T00:00:00Z"},
             "command": ["true"]} for k in range(i, min(i + 500, n))]})
        st.take_effects()
    return encode_state(st)


def test_a_restore_runs_no_collection_over_the_state_it_decoded() -> None:
    blob = _blob(20_000)
    seen: list[dict[str, Any]] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info)

    rep = Replica(sync=None, history_limit=10, on_effects=lambda _e: None,  # type: ignore[arg-type]
                  on_fatal=None)
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(700, 10, 10)
    gc.callbacks.append(watch)
    try:
        rep.restore(blob)
        during = list(seen)
        young_after = gc.get_count()[0]
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*thresholds)
        if not was:
            gc.disable()
        gc.unfreeze()
    assert len(rep.read(lambda st: st.jobs)) == 20_000
    # Before, the collector came back on with every decoded object young: the first
    # allocation after it ran a collection over all of them, inside restore().
    assert during == [], during
    assert young_after < 700
