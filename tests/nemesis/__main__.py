"""``python -m tests.nemesis --nodes 3 --faults N --seed S --out DIR``: a nemesis run by
hand (root; run it under ``flock /work/heavy.lock``). Prints the report as JSON."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from tests.nemesis.net import available
from tests.nemesis.run import markdown, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    p.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="directory for logs, witness, report")
    p.add_argument("--jobs", type=int, default=12)
    p.add_argument("--per-round", type=int, default=1,
                   help="faults per round on average (1 to 2N-1 overlapping; default 1)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop drawing faults after this many seconds of faults")
    args = p.parse_args(argv)
    # A plain `kill` must still tear the namespaces down (the run cleans up on exceptions).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = available()
    if why:
        sys.stderr.write(f"cannot run the nemesis here: {why}\n")
        return 2
    report = run(nodes=args.nodes, faults=args.faults, seed=args.seed, out=args.out,
                 jobs=args.jobs, budget_s=args.budget_s, per_round=args.per_round,
                 log=lambda m: sys.stderr.write(f"{m}\n"))
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as f:
        f.write(markdown(report))
    sys.stdout.write(json.dumps({k: v for k, v in report.items() if k != "fault_log"},
                                indent=1, default=str) + "\n")
    return 1 if report["strict_violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
