"""``python -m bench [--quick] [--only W1,W2,W3,W4,PROF] [--out bench/results]``.

Runs the workloads in one invocation (baselines included, so ratios compare figures
measured minutes apart on the same machine), writes ``<out>/<YYYY-MM-DD>.md`` (plus a
``.json`` of the raw figures and PNG/SVG plots) and prints the tables. It never
asserts timings. Every process it starts is killed on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench.cluster import ROOT, close_all
from bench.common import Ctx, Result, lock_cells

ORDER = ["W1", "W2", "W3", "W4", "W5", "W6", "PROF", "W3F", "DUR", "GROUPS", "IDLE"]
#: Run only when named: W3's killed-follower case on its own (W3 includes it), the
#: cost of group commit (durability sync ÷ none), and an idle cluster's CPU (its
#: windows alone would double the quick run).
NAMED_ONLY = {"W3F", "DUR", "GROUPS", "IDLE"}


def _timing_said() -> str:
    """The ``[timing]`` the clusters ran with, as the report says it."""
    over = os.environ.get("BENCH_TIMING", "").strip()
    if over:
        return (f"`[timing]` from BENCH_TIMING: `{over}` (over the defaults and each "
                "workload's own).")
    return "raftsched's default timing."


def _workloads() -> dict[str, list[Callable[[Ctx], Result]]]:
    from bench import durability, groups, idle, profile, w1, w2, w3, w4, w5, w6
    return {"W1": [w1.run_raw, w1.run_w1], "W2": [w2.run_w2], "W3": [w3.run_w3],
            "W3F": [w3.run_w3f], "W4": [w4.run_w4], "W5": [w5.run_w5], "W6": [w6.run_w6],
            "PROF": [profile.run_profile], "DUR": [durability.run_dur],
            "GROUPS": [groups.run_groups], "IDLE": [idle.run_idle]}


def machine_facts() -> dict[str, Any]:
    import importlib.metadata as md

    mem: dict[str, str] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    mem[key] = value.strip()
    except OSError:
        pass
    cpu_model = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def ver(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    return {"cpu_count": os.cpu_count(), "cpu_model": cpu_model, "meminfo": mem,
            "loadavg": os.getloadavg(), "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "pysyncobj": ver("pysyncobj"), "apscheduler": ver("APScheduler"),
            "msgpack": ver("msgpack"), "matplotlib": ver("matplotlib"),
            "py-spy": "installed" if shutil.which("py-spy") or os.path.exists(
                os.path.join(os.path.dirname(sys.executable), "py-spy")) else "not installed"}


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(cell(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def render(results: list[Result], facts: dict[str, Any], command: str, quick: bool,
           total_s: float, out: str) -> str:
    lines = [f"# raftsched benchmark — {dt.date.today().isoformat()}"
             f"{' (--quick)' if quick else ''}", "",
             f"Command: `{command}`  ", f"Wall time: {total_s:.0f} s  ",
             f"Python {facts['python']} ({facts['implementation']}), pysyncobj "
             f"{facts['pysyncobj']}, APScheduler {facts['apscheduler']}, msgpack "
             f"{facts['msgpack']}, py-spy {facts['py-spy']}  ",
             f"Machine: {facts['cpu_count']} CPUs ({facts['cpu_model']}), MemTotal "
             f"{facts['meminfo'].get('MemTotal', '?')}, MemAvailable at start "
             f"{facts['meminfo'].get('MemAvailable', '?')}, load average at start "
             f"{', '.join(f'{x:.2f}' for x in facts['loadavg'])}, load average at end "
             f"{', '.join(f'{x:.2f}' for x in facts.get('loadavg_end', ()))}  ",
             f"Platform: {facts['platform']}", "",
             "All clusters: 3 `python -m raftsched node` processes on 127.0.0.1, no configured "
             "secret (each node generates one, loopback only; Raft messages are sealed "
             "with it, as by default), `[log] level = \"warning\"`, " + _timing_said() + " "
             "The machine is shared and noisy: read the ratios against baselines measured "
             "in this same invocation, not the absolute figures. Nothing here is asserted.",
             ""]
    for r in results:
        lines += [f"## {r.title}", "", f"*{r.name}, {r.seconds:.0f} s*", ""]
        if r.error:
            lines += [f"**Failed:** `{r.error}`", ""]
        for title, headers, rows in r.tables:
            lines += [f"**{title}**", "", md_table(headers, rows), ""]
        if r.locks:
            lines += ["**Raft lock holds (target: none over 20 ms)**", "", md_table(
                ["cluster", "lock hold max ms (any node, since start)",
                 "holds over 20 ms (3 nodes)", "holds over 20 ms by site (count, max ms)"],
                [[label, *lock_cells(rep)] for label, rep in r.locks]), ""]
        for note in r.notes:
            lines.append(f"- {note}")
        if r.notes:
            lines.append("")
        for p in r.plots:
            rel = os.path.relpath(p, out)
            if p.endswith(".png"):
                lines += [f"![{r.name}]({rel})", ""]
            else:
                lines += [f"Plot: [{rel}]({rel})", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, ≤ 5 minutes")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(ORDER)}")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"),
                    help="results folder (default bench/results)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, data)")
    ap.add_argument("--baseline-tree", metavar="DIR", default="",
                    help="W1 also runs its storms with this source tree's code (e.g. a "
                         "checkout of an older commit), in this invocation")
    args = ap.parse_args(argv)
    only = [x.strip().upper() for x in args.only.split(",") if x.strip()]
    only = ["PROF" if x in ("P", "PROFILE") else x for x in only]
    bad = [x for x in only if x not in ORDER]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {ORDER}")
    chosen = [w for w in ORDER if w in only or (not only and w not in NAMED_ONLY)]
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="raftsched-bench-")
    stamp = dt.date.today().isoformat()
    ctx = Ctx(quick=args.quick, tmp=tmp, out=os.path.abspath(args.out), stamp=stamp)
    command = f"python -m bench {' '.join(sys.argv[1:] if argv is None else argv)}".strip()
    facts = machine_facts()
    if args.baseline_tree:
        ctx.shared["baseline_tree"] = os.path.abspath(args.baseline_tree)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    results: list[Result] = []
    t0 = time.monotonic()
    interrupted = False
    try:
        funcs = _workloads()
        for name in chosen:
            for fn in funcs[name]:
                ctx.log(f"=== {name}: {fn.__name__}")
                ts = time.monotonic()
                try:
                    res = fn(ctx)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # noqa: BLE001 - report it, go on with the rest
                    res = Result(name, f"{name} ({fn.__name__})",
                                 error=f"{type(exc).__name__}: {exc}")
                    res.notes.append("```\n" + traceback.format_exc()[-2000:] + "\n```")
                finally:
                    close_all()
                res.seconds = time.monotonic() - ts
                results.append(res)
                ctx.log(f"=== {name}: {fn.__name__} done in {res.seconds:.0f}s"
                        + (f" (error: {res.error})" if res.error else ""))
    except KeyboardInterrupt:
        interrupted = True
        ctx.log("interrupted: killing every process started here")
    finally:
        close_all()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            ctx.log(f"scratch kept in {tmp}")
    facts["loadavg_end"] = os.getloadavg()
    total = time.monotonic() - t0
    text = render(results, facts, command, args.quick, total, ctx.out)
    if interrupted:
        text += "\n\n**Interrupted before the end.**\n"
    md_path = os.path.join(ctx.out, f"{stamp}.md")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(os.path.join(ctx.out, f"{stamp}.json"), "w", encoding="utf-8") as f:
        json.dump({"command": command, "facts": facts, "quick": args.quick, "total_s": total,
                   "results": [{"name": r.name, "title": r.title, "error": r.error,
                                "seconds": r.seconds, "tables": r.tables, "notes": r.notes,
                                "plots": r.plots, "raw": r.raw, "locks": r.locks}
                               for r in results]},
                  f, indent=1, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.write(f"\nwritten: {md_path}\n")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
