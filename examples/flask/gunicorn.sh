#!/usr/bin/env bash
# One host, gunicorn -w 4: one worker holds the host's node, the other three are its
# clients. Runs SECONDS (default 20) from the first tick, SIGKILLing the worker that holds the node
# half-way (another takes it over), then stops gunicorn and prints how the job's fire
# times were executed. Files go to $WORKDIR (default: a temp dir).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${1:-20}"
work="${WORKDIR:-$(mktemp -d)}"
mkdir -p "$work"
export TICKS_FILE="$work/ticks.txt" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# --timeout: a worker's boot includes joining the node (slow on a loaded machine).
(cd "$work" && exec gunicorn -w 4 -b 127.0.0.1:8000 --timeout 90 --log-level warning ticker:app \
    >>"$work/gunicorn.log" 2>&1) &
master=$!
trap 'kill -TERM "$master" 2>/dev/null || true; wait' EXIT
for _ in $(seq 600); do [ -s "$TICKS_FILE" ] && break; sleep 0.1; done  # the first tick
sleep $((secs / 2))
for _ in $(seq 300); do    # the data dir's lock names the worker holding the node
  holder="$(cat "$work/raftsched-embedded/n1/lock" 2>/dev/null || true)"
  [ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null && break
  sleep 0.1                # (between two holders: ask again)
done
sleep $((secs - secs / 2))
curl -s 127.0.0.1:8000/ && echo
kill -TERM "$master"; wait || true
trap - EXIT
python3 "$here/summary.py" "$TICKS_FILE"
