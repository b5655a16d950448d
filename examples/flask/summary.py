"""Prints how the job's fire times in a ticks file were executed: each once, none skipped."""

import collections
import datetime
import sys

lines = [ln.split() for ln in open(sys.argv[1], encoding="utf-8") if ln.strip()]
per_time = collections.Counter(ln[0] for ln in lines)
stamps = sorted(datetime.datetime.fromisoformat(t) for t in per_time)
span = int((stamps[-1] - stamps[0]).total_seconds()) + 1 if stamps else 0
twice = sum(1 for n in per_time.values() if n > 1)
print(f"{len(per_time)} fire times, {span - len(per_time)} missing, {twice} executed twice, "
      f"by {len({ln[1] for ln in lines})} members in {len({ln[2] for ln in lines})} processes")
