#!/usr/bin/env bash
# Server CPU per query: a fresh kvix (or kvix-hello) holding the 16-worker index, one
# closed-loop 16-connection phase of 1k-token /query, and the server's utime+stime
# (from /proc/PID/stat) divided by the queries answered.
#
#   perf/cpu_per_query.sh [kvix|kvix-hello] [--threads N] [other kvix flags]
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
pick_trace
SERVER=${1:-kvix}
shift || true
build_release
PORT=$(free_port)
"$BIN/$SERVER" --host 127.0.0.1 --port "$PORT" "$@" 2>/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; wait 2>/dev/null || true' EXIT
wait_health "$PORT"
COMMON=(--url "http://127.0.0.1:$PORT" --trace "$TRACE" --requests 6000 --quiet)
if [ "$SERVER" = kvix ]; then
    "$BIN/kvix-load" events "${COMMON[@]}" --workers-count 16 --keep >/dev/null
fi
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
c0=$(cpu)
"$BIN/kvix-load" query "${COMMON[@]}" --connections 16 --duration 8 --json >"${TMPDIR:-/tmp}/cpu_per_query.json"
c1=$(cpu)
python3 - "$c0" "$c1" "${TMPDIR:-/tmp}/cpu_per_query.json" <<'PY'
import json, os, sys
c0, c1 = int(sys.argv[1]), int(sys.argv[2])
q = json.load(open(sys.argv[3]))["queries"][0]
tick = os.sysconf("SC_CLK_TCK")
print(f"{q['achieved_rps']:.0f} req/s, p50 {q['p50_us']:.0f} µs, p99 {q['p99_us']:.0f} µs; "
      f"server CPU {(c1 - c0) / tick / q['completed'] * 1e6:.1f} µs per query")
PY
