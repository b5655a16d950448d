"""W1 storms of another source tree, in the same invocation (a regression's baseline).

``python -m bench --only W1 --baseline-tree /path/to/old/checkout`` runs, beside this
tree's W1, the same storm (J every-second no-op jobs, 3 nodes, the same window) with the
other tree's own ``bench.w1.run_raftsched`` and node code, in a process whose working
directory and ``PYTHONPATH`` are that tree (its nodes start from it too). Any tree
since the first wave (6b29c78) has that function. The rows go into one table with this
tree's, so a regression shows as a ratio measured minutes apart on one machine.

``python -m bench.w1tree TREE J SECONDS`` prints one storm's summary as a JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

#: The figures of a storm kept for the comparison (present in every tree's result).
KEYS = ("jobs", "fires", "succeeded", "runs_per_s", "outcomes", "term_start", "term_end",
        "cpu_ms_per_run", "lag_call", "lag_start")

_SCRIPT = """
import json, sys, tempfile
from bench.common import Ctx
from bench.w1 import run_raftsched
from bench.cluster import close_all
j, s, warm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tmp = tempfile.mkdtemp(prefix="rs-w1tree-")
try:
    r = run_raftsched(Ctx(quick=True, tmp=tmp, out=tmp, stamp="x"), j, s, warm)
finally:
    close_all()
print(json.dumps({k: r.get(k) for k in KEYS}, default=str))
""".replace("KEYS", repr(KEYS))


def storm(tree: str, jobs: int, seconds: int, warmup: int = 5,
          timeout_s: float = 600.0) -> dict[str, Any]:
    """One W1 storm run by ``tree``'s own code; its summary, or ``{"error": ...}``."""
    env = dict(os.environ, PYTHONPATH=tree)
    with tempfile.TemporaryDirectory(prefix="rs-w1tree-") as tmp:
        script = os.path.join(tmp, "storm.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(_SCRIPT)
        try:
            proc = subprocess.run([sys.executable, script, str(jobs), str(seconds),
                                   str(warmup)], cwd=tree, env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"the storm in {tree} timed out"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tree, jobs, seconds = args[0], int(args[1]), int(args[2])
    sys.stdout.write(json.dumps(storm(os.path.abspath(tree), jobs, seconds)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
