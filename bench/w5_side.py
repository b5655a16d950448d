"""W5's raftsched side alone (no APScheduler), for bisecting: ``python -m bench.w5_side``
from a tree; the window is ``BENCH_W5_WINDOW_S`` seconds (60 by default here) across
the DST change, 10,000 cron jobs as in the full W5. Prints one JSON line: fire times,
lag(start rec) and lag(call) percentiles (ms), plans per second, CPU ms per run."""

from __future__ import annotations

import json
import os
import tempfile

from bench import w5
from bench.common import Ctx


def main() -> None:
    os.environ.setdefault("BENCH_W5_WINDOW_S", "60")
    ctx = Ctx(quick=False, tmp=tempfile.mkdtemp(prefix="w5side-"), out=tempfile.mkdtemp(),
              stamp="w5side")
    jobs, window, setup = w5.sizes(ctx)
    r = w5.run_raftsched(ctx, jobs, window, setup)
    print(json.dumps({k: r.get(k) for k in ("fires", "lag_start", "lag_call", "plans_per_s",
                                            "cpu_ms_per_run", "outcomes")}, default=str))


if __name__ == "__main__":
    main()
