#!/usr/bin/env bash
# Three instances of the Flask app on loopback, each a member of one raftsched cluster
# (ports 7011-7013 Raft, 7111-7113 API, 8001-8003 HTTP). Runs SECONDS (default 20) from
# the first tick, restarting instance n1 half-way (a deploy), then stops all (SIGTERM
# drains) and prints how the job's fire times were executed. Files go to $WORKDIR
# (default: a temp dir).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${1:-20}"
work="${WORKDIR:-$(mktemp -d)}"
mkdir -p "$work"
export RAFTSCHED_PEERS="n1=127.0.0.1:7011/127.0.0.1:7111,n2=127.0.0.1:7012/127.0.0.1:7112,n3=127.0.0.1:7013/127.0.0.1:7113"
export TICKS_FILE="$work/ticks.txt" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
declare -A pids
start() {  # start instance n$1 (HTTP on 800$1), data in $work/data
  (cd "$work" && RAFTSCHED_NODE_ID="n$1" exec gunicorn -w 1 -b "127.0.0.1:800$1" --timeout 90 \
      --log-level warning ticker:app >>"$work/n$1.log" 2>&1) &
  pids[$1]=$!
}
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true; wait' EXIT
for i in 1 2 3; do start "$i"; done
for _ in $(seq 600); do [ -s "$TICKS_FILE" ] && break; sleep 0.1; done  # the first tick
sleep $((secs / 2))
kill -TERM "${pids[1]}"; wait "${pids[1]}" || true    # a deploy: n1 drains and leaves...
start 1                                                # ...and comes back
sleep $((secs - secs / 2))
curl -s 127.0.0.1:8002/ && echo
kill -TERM "${pids[@]}"; wait || true
trap - EXIT
python3 "$here/summary.py" "$TICKS_FILE"
