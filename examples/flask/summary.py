"""Prints how the job's fire times in a ticks file were executed: each once, none skipped.

A fire time whose attempt 1 ran in a process SIGKILLed before the run's end was recorded
runs again as attempt 2 (``on_node_lost = "retry"``: at least once across a crash); that
is counted as retried, apart from a fire time executed twice by one attempt."""

import collections
import datetime
import sys

lines = [ln.split() for ln in open(sys.argv[1], encoding="utf-8") if ln.strip()]
attempts = collections.defaultdict(list)
for ln in lines:
    attempts[ln[0]].append(ln[3] if len(ln) > 3 else "attempt=1")
stamps = sorted(datetime.datetime.fromisoformat(t) for t in attempts)
span = int((stamps[-1] - stamps[0]).total_seconds()) + 1 if stamps else 0
twice = sum(1 for a in attempts.values() if len(a) != len(set(a)))
retried = sum(1 for a in attempts.values() if len(set(a)) > 1)
print(f"{len(attempts)} fire times, {span - len(attempts)} missing, {twice} executed twice "
      f"({retried} retried after a crash), by {len({ln[1] for ln in lines})} members in "
      f"{len({ln[2] for ln in lines})} processes")
# How late the latest execution came after its fire time: a takeover after a SIGKILL
# (the new holder certifies the killed worker's node dead and runs on at once).
late = [(datetime.datetime.fromisoformat(ln[4][4:]) - datetime.datetime.fromisoformat(ln[0]))
        .total_seconds() for ln in lines if len(ln) > 4 and ln[4].startswith("ran=")]
if late:
    mid = sorted(late)[len(late) // 2]
    print(f"slowest execution: {max(late):.2f}s after its fire time (median {mid:.2f}s)")
