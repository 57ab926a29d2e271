#!/usr/bin/env bash
# Server CPU per query: a fresh kvix holding a compare.sh workload's index (or a
# hello server), one closed-loop 16-connection phase of 1k-token /query, and the
# server's utime+stime (from /proc/PID/stat) divided by the queries answered.
#
#   perf/cpu_per_query.sh [kvix|kvix-hello|tokio-hello] [--threads N] [other server flags]
#
# WORKLOAD=trace (default) or shared-prefix picks the index and the prompts, as in
# perf/compare.sh. The hello servers answer a constant; pass `--body-bytes N` (kvix's
# reply size, e.g. 7195 on shared-prefix) to send as many bytes as kvix does.
# tokio-hello comes from scripts/dynamo_peer (built by perf/compare.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
pick_trace
SERVER=${1:-kvix}
shift || true
WORKLOAD=${WORKLOAD:-trace}
build_release
SERVER_BIN=$BIN
[ "$SERVER" = tokio-hello ] && SERVER_BIN=scripts/dynamo_peer/target/release
start_server "$SERVER_BIN/$SERVER" "$@"
read -r -a wl <<<"$(workload_args "$WORKLOAD")"
COMMON=(--url "http://127.0.0.1:$PORT" "${wl[@]}" --quiet)
if [ "$SERVER" = kvix ]; then
    read -r -a ev <<<"$(worker_args "$WORKLOAD")"
    "$BIN/kvix-load" events "${COMMON[@]}" "${ev[@]}" --pid "$PID" --keep >/dev/null
fi
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
c0=$(cpu)
"$BIN/kvix-load" query "${COMMON[@]}" --connections 16 --prompt-tokens 1024 --duration 8 --json >"${TMPDIR:-/tmp}/cpu_per_query.json"
c1=$(cpu)
python3 - "$c0" "$c1" "${TMPDIR:-/tmp}/cpu_per_query.json" <<'PY'
import json, os, sys
c0, c1 = int(sys.argv[1]), int(sys.argv[2])
q = json.load(open(sys.argv[3]))["queries"][0]
tick = os.sysconf("SC_CLK_TCK")
print(f"{q['achieved_rps']:.0f} req/s, p50 {q['p50_us']:.0f} µs, p99 {q['p99_us']:.0f} µs; "
      f"server CPU {(c1 - c0) / tick / q['completed'] * 1e6:.1f} µs per query")
PY
