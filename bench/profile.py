"""Profile: W1 at J=10,000 once (J=1,000 with --quick), with py-spy sampling the leader
during the window: where the CPU of a run goes when one group is past its ceiling.

py-spy (``pip install py-spy``) samples every thread of the leader process (the Raft
tick thread, the asyncio loop, the callable threads) without restarting it:
``py-spy record --pid <leader> -d <s> -r 400 -f raw --nolineno --threads
--gil --nonblocking``: only samples of the thread holding the GIL, i.e. Python CPU
(blocking poll/select release the GIL and drop out). The collapsed stacks are turned
into the top functions by inclusive ("cumulative") and by self samples, a per-thread
split, and an SVG flame graph drawn here (``<stamp>-flame.svg``).

Without py-spy the workload reports an error (cProfile would only see the main
thread, not the Raft tick thread where commands are applied).
"""

from __future__ import annotations

import collections
import html
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from bench.cluster import track
from bench.common import Ctx, Result, fmt

#: Samples per second (the leader is mostly idle at J=1,000: sample densely).
RATE = 400


def pyspy_path() -> str | None:
    cand = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return cand if os.path.exists(cand) else shutil.which("py-spy")


def record_pyspy(ctx: Ctx, pid: int, seconds: float, tag: str) -> dict[str, Any]:
    """Start py-spy on ``pid`` in the background; :func:`finish_pyspy` collects it."""
    exe = pyspy_path()
    if exe is None:
        return {"error": "py-spy not installed"}
    path = os.path.join(ctx.dir(tag), "pyspy.raw")
    proc = track(subprocess.Popen(
        [exe, "record", "--pid", str(pid), "-d", str(int(seconds)), "-r", str(RATE), "-f", "raw",
         "--nolineno", "--threads", "--gil", "--nonblocking", "-o", path],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return {"proc": proc, "path": path, "seconds": int(seconds), "t0": time.monotonic()}


def finish_pyspy(prof: dict[str, Any]) -> dict[str, Any]:
    proc = prof.get("proc")
    if proc is None:
        return prof
    try:
        _, err = proc.communicate(timeout=prof["seconds"] + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    out = {"path": prof["path"], "seconds": prof["seconds"], "returncode": proc.returncode}
    if not os.path.exists(prof["path"]):
        out["error"] = f"py-spy wrote nothing: {(err or '').strip()[-300:]}"
    return out


def parse_collapsed(path: str) -> list[tuple[list[str], int]]:
    stacks = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                continue
            stacks.append((stack.split(";"), n))
    return stacks


def _thread_label(frames: list[str]) -> str:
    """Which of the node's threads a stack belongs to, from its frames."""
    text = ";".join(frames)
    if "_autoTickThread" in text or "pysyncobj" in text:
        return "Raft tick thread (pysyncobj: network, apply, effects)"
    if "rs-call" in text or "concurrent/futures/thread.py" in text or "thread.py" in text \
            and "_worker" in text:
        return "callable threads (ThreadPoolExecutor)"
    if "asyncio" in text or "base_events" in text:
        return "asyncio loop (API, leader loop, worker pool)"
    if "http" in text or "socketserver" in text:
        return "metrics HTTP"
    return "other"


#: Entry/dispatch frames every stack of a thread shares; left out of the cumulative list.
_ENTRY = ("Thread._bootstrap", "Thread.run (", "_run_module_as_main", "_run_code (",
          "(raftsched/__main__.py)", "main (raftsched/faces/cli.py)", "_cmd_node (", "run_node (",
          "Runner.run (", "run (asyncio/runners.py)", "run_until_complete (", "run_forever (",
          "._run_once (", "Handle._run (", "_autoTickThread (", "_worker (concurrent")


def analyse(stacks: list[tuple[list[str], int]], top: int = 25) -> dict[str, Any]:
    total = sum(n for _, n in stacks)
    incl: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        fr = [f for f in frames if not f.startswith("thread (")]
        threads[_thread_label(fr)] += n
        for f in set(fr):
            if not any(p in f for p in _ENTRY):
                incl[f] += n
        if fr:
            self_[fr[-1]] += n
    return {"total": total, "inclusive": incl.most_common(top), "self": self_.most_common(top),
            "threads": threads.most_common()}


def flame_svg(stacks: list[tuple[list[str], int]], path: str, title: str) -> None:
    """A plain flame graph (root at the bottom), no JavaScript."""
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for frames, n in stacks:
        node = tree
        node["n"] += n
        for f in frames:
            node = node["kids"].setdefault(f, {"n": 0, "kids": {}})
            node["n"] += n

    def depth(node: dict[str, Any]) -> int:
        return 1 + max((depth(k) for k in node["kids"].values()), default=0)

    width, row = 1600.0, 16
    rows = depth(tree)
    height = rows * row + 40
    total = max(tree["n"], 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{int(width)}" height="{height}" '
           f'font-family="monospace" font-size="10">',
           f'<text x="4" y="14" font-size="13">{html.escape(title)} — {total} samples</text>']

    def draw(node: dict[str, Any], name: str, x: float, level: int) -> None:
        w = node["n"] / total * width
        if w < 0.3:
            return
        y = height - (level + 1) * row
        if level > 0:
            hue = (hash(name.split(" (")[-1]) % 60) + 5
            label = html.escape(name)
            pct = 100 * node["n"] / total
            out.append(f'<g><title>{label} ({node["n"]} samples, {pct:.1f}%)</title>'
                       f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" '
                       f'fill="hsl({hue},85%,60%)"/>')
            chars = int(w / 6.2)
            if chars >= 4:
                short = name if len(name) <= chars else name[:chars - 2] + ".."
                out.append(f'<text x="{x + 2:.1f}" y="{y + row - 4}">{html.escape(short)}'
                           f'</text>')
            out.append("</g>")
        cx = x
        for kname, kid in sorted(node["kids"].items()):
            draw(kid, kname, cx, level + 1)
            cx += kid["n"] / total * width

    draw(tree, "all", 0.0, 0)
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


def run_profile(ctx: Ctx) -> Result:
    from bench import w1

    jobs = 1000 if ctx.quick else 10_000
    res = Result("PROF", f"Profile: W1 at J={jobs:,}, leader node sampled by py-spy")
    seconds, window = (8, 10) if ctx.quick else (10, 15)
    if pyspy_path() is None:
        res.error = "py-spy is not installed (pip install py-spy)"
        return res
    r = w1.run_raftsched(ctx, jobs, window, 3, profile_s=seconds, name=f"prof-{jobs}")
    res.locks.append((f"W1 J={jobs:,} under py-spy", r["lock"]))
    prof = r.get("profile") or {}
    res.raw = {k: v for k, v in r.items() if not k.endswith("_sorted")}
    if prof.get("error") or not prof.get("path"):
        res.error = prof.get("error", "no profile")
        return res
    stacks = parse_collapsed(prof["path"])
    a = analyse(stacks)
    res.raw["profile_analysis"] = a
    total = a["total"] or 1
    svg = os.path.join(ctx.out, f"{ctx.stamp}-flame.svg")
    flame_svg(stacks, svg, f"raftsched leader {r['leader']}, W1 J={jobs:,}, "
                           f"{prof['seconds']} s, py-spy {RATE} Hz --gil")
    res.plots.append(svg)
    raw_copy = os.path.join(ctx.out, f"{ctx.stamp}-pyspy-collapsed.txt")
    shutil.copyfile(prof["path"], raw_copy)
    res.tables.append((f"threads of the leader ({a['total']} samples of active threads, "
                       f"{prof['seconds']} s at {RATE} Hz)", ["thread", "samples", "share"],
                       [[t, fmt(n), f"{100 * n / total:.1f}%"] for t, n in a["threads"]]))
    res.tables.append(("top 25 functions by cumulative (inclusive) samples",
                       ["#", "function (file)", "samples", "share"],
                       [[str(i + 1), f"`{f}`", fmt(n), f"{100 * n / total:.1f}%"]
                        for i, (f, n) in enumerate(a["inclusive"])]))
    res.tables.append(("top 25 functions by self samples",
                       ["#", "function (file)", "samples", "share"],
                       [[str(i + 1), f"`{f}`", fmt(n), f"{100 * n / total:.1f}%"]
                        for i, (f, n) in enumerate(a["self"])]))
    res.notes += [
        f"Run figures during the profile: runs/s {fmt(r['runs_per_s'])}, lag(call) p50/p99 "
        f"{fmt(r['lag_call']['p50'])}/{fmt(r['lag_call']['p99'])} ms, leader CPU "
        f"{fmt(r['cpu_s'].get(r['leader']), 2)} s in the {window} s window.",
        f"py-spy `--gil`: a sample is the stack of the thread holding the GIL; "
        f"{a['total']} samples of {prof['seconds'] * RATE} sampling ticks = the leader held "
        f"the GIL {100 * a['total'] / max(prof['seconds'] * RATE, 1):.0f}% of the time. "
        "Shares are of GIL-holding samples. The cumulative list leaves out the entry frames "
        "every stack of a thread shares (threading bootstrap, runpy, asyncio runner, "
        "pysyncobj `_autoTickThread`, asyncio `Handle._run`). `--nonblocking`: the leader "
        "is not paused; py-spy still takes CPU on this 2-core machine, so lags during "
        "profiling are worse.",
        f"Collapsed stacks: `{os.path.relpath(raw_copy, ctx.out)}`; flame graph: "
        f"`{os.path.relpath(svg, ctx.out)}`.",
    ]
    return res
