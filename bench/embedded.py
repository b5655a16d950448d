"""Embedded, side by side (issue 15): the same 20 every-second jobs in 3 app processes,
scheduled by APScheduler 3 (each process its own ``BackgroundScheduler``, the usual
deployment) and by raftsched embedded (the 3 processes are the cluster).

``python -m bench.embedded [--seconds 40] [--jobs 20] [--out bench/results]``

Per scheduler: executions per fire time (APScheduler: one per process; raftsched: one),
lag = call time - fire time (p50/p99/max), and what a SIGKILL of one process half-way
does (fire times executed 0 times, executions per fire time after it, the worst lag
around it). Writes ``<out>/<date>-embedded.md``, ``.json`` and a plot (executions per
second, if matplotlib is installed); prints the table. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.stats import pct
from raftsched.faces.launcher import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = ("n1", "n2", "n3")


def _lines(path: str) -> list[list[Any]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def run_one(mode: str, seconds: float, jobs: int, work: str,
            kill_phase: float = 0.5) -> dict[str, Any]:
    """Start 3 processes, wait until each executes, measure ``seconds``, SIGKILL the
    third half-way, ``kill_phase`` of a second after a fire time; the figures."""
    ports = free_ports(6)
    peers = ",".join(f"{nid}=127.0.0.1:{ports[i]}/127.0.0.1:{ports[3 + i]}"
                     for i, nid in enumerate(IDS))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outs = {nid: os.path.join(work, f"{mode}-{nid}.jsonl") for nid in IDS}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for nid in IDS:
            with open(os.path.join(work, f"{mode}-{nid}.log"), "ab") as log:
                procs[nid] = subprocess.Popen(
                    [sys.executable, "-m", "bench.embapp", mode, "--out", outs[nid],
                     "--jobs", str(jobs), "--node", nid, "--peers", peers,
                     "--data", os.path.join(work, f"{mode}-data")],
                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        # Warm: the cluster formed and every job ran at least once somewhere.
        while len({ln[0] for nid in IDS for ln in _lines(outs[nid])}) < jobs \
                or (mode == "aps" and not all(_lines(outs[n]) for n in IDS)):
            if time.time() > deadline:
                raise RuntimeError(f"{mode}: the processes did not start executing")
            time.sleep(0.2)
        time.sleep(3)
        t0 = int(time.time()) + 1
        kill_at = t0 + int(seconds / 2) + kill_phase
        time.sleep(max(0.0, kill_at - time.time()))
        os.killpg(procs["n3"].pid, signal.SIGKILL)
        t_kill = time.time()
        t_end = t0 + int(seconds)
        time.sleep(max(0.0, t_end - time.time()) + 5)  # late executions of the window
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    return _figures(mode, outs, t0, t_end, t_kill, jobs)


def _figures(mode: str, outs: dict[str, str], t0: int, t_end: int, t_kill: float,
             jobs: int) -> dict[str, Any]:
    execs: collections.Counter[tuple[str, int]] = collections.Counter()
    lags: dict[str, list[float]] = {"before": [], "after": []}
    per_second: collections.Counter[int] = collections.Counter()
    worst: dict[int, float] = {}
    for nid in IDS:
        for job, fire, call in _lines(outs[nid]):
            f = round(fire)
            if not t0 <= f < t_end:
                continue
            execs[(job, f)] += 1
            per_second[f] += 1
            lag = (call - fire) * 1000
            lags["before" if f < t_kill else "after"].append(lag)
            worst[f] = max(worst.get(f, lag), lag)
    fires = [(f"j{i}", s) for i in range(jobs) for s in range(t0, t_end)]
    counts = {"before": collections.Counter(), "after": collections.Counter()}
    for key in fires:
        counts["before" if key[1] < t_kill else "after"][execs.get(key, 0)] += 1
    all_lags = lags["before"] + lags["after"]
    return {
        "mode": mode, "window_s": t_end - t0, "fire_times": len(fires),
        "executions": sum(execs.values()),
        "executions_per_fire_time": {k: dict(sorted(v.items())) for k, v in counts.items()},
        "lag_ms": {"p50": pct(all_lags, 50), "p99": pct(all_lags, 99),
                   "max": max(all_lags) if all_lags else None},
        "lag_after_kill_ms": {"p99": pct(lags["after"], 99),
                              "max": max(lags["after"]) if lags["after"] else None},
        "per_second": {str(s - t0): per_second.get(s, 0) for s in range(t0, t_end)},
        "worst_lag_ms_per_second": {str(s - t0): round(worst[s]) for s in sorted(worst)},
        "kill_at_s": round(t_kill - t0, 2),
    }


def _fmt_counts(c: dict[int, int]) -> str:
    total = sum(c.values()) or 1
    return ", ".join(f"{n}×: {k} ({100 * k / total:.0f}%)" for n, k in sorted(c.items()))


def report(results: list[dict[str, Any]], cmd: str) -> str:
    rows = ["| scheduler | executions per fire time, before the kill | after SIGKILL of one "
            "process | lag p50 / p99 / max (ms) | worst lag after the kill (ms) |",
            "|---|---|---|---|---|"]
    for r in results:
        lag, after = r["lag_ms"], r["lag_after_kill_ms"]
        name = ("APScheduler 3, a BackgroundScheduler per process" if r["mode"] == "aps"
                else "raftsched embedded, the 3 processes are the cluster")
        rows.append(f"| {name} | {_fmt_counts(r['executions_per_fire_time']['before'])} | "
                    f"{_fmt_counts(r['executions_per_fire_time']['after'])} | "
                    f"{_n(lag['p50'])} / {_n(lag['p99'])} / {_n(lag['max'])} | "
                    f"{_n(after['max'])} |")
    load = os.getloadavg()
    return "\n".join([
        f"# Embedded: 3 app processes, {results[0]['fire_times'] // results[0]['window_s']} "
        "every-second jobs", "",
        f"`{cmd}` — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f}.", "",
        f"Window {results[0]['window_s']} s per scheduler; one process SIGKILLed at "
        f"{results[0]['kill_at_s']} s. `k×: n` = n fire times executed k times. raftsched: "
        "a run the killed process executed but had not yet recorded finished is run again "
        "(`on_node_lost = retry`, at-least-once; `fail` makes it at-most-once) — a kill at "
        "a fire instant (`--kill-phase 0`) shows it.", "",
        *rows, ""])


def _n(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f}"


def plot(results: list[dict[str, Any]], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in results:
        xs = [int(k) for k in r["per_second"]]
        ax.step(xs, list(r["per_second"].values()), where="post",
                label="APScheduler 3 ×3 processes" if r["mode"] == "aps" else
                "raftsched embedded in 3 processes")
        ax.axvline(r["kill_at_s"], color="grey", linestyle=":")
    ax.set_xlabel("second of the window (dotted: one process SIGKILLed)")
    ax.set_ylabel("executions per fire second (20 jobs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--only", choices=["aps", "raftsched"], help="one scheduler only")
    ap.add_argument("--kill-phase", type=float, default=0.5,
                    help="the SIGKILL this many seconds after a fire time (0: at it)")
    args = ap.parse_args()
    # SIGTERM (a timeout) ends like Ctrl-C: every process started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cmd = "python -m bench.embedded " + " ".join(sys.argv[1:])
    results = []
    with tempfile.TemporaryDirectory(prefix="rs-bench-emb-") as work:
        for mode in [args.only] if args.only else ["aps", "raftsched"]:
            results.append(run_one(mode, args.seconds, args.jobs, work, args.kill_phase))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{dt.date.today():%Y-%m-%d}-embedded")
    text = report(results, cmd.strip())
    if plot(results, stem + ".png"):
        text += f"\n![executions per second]({os.path.basename(stem)}.png)\n"
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
