#!/usr/bin/env bash
# The figures of BENCHMARKS.md, measured in one run on this machine, written to a folder.
#
#   perf/bench.sh [--out DIR] [--requests N] [--duration S] [--repeat N] [--quick]
#
# For each shard count (--threads 1, 2) and worker count (16, 64): a fresh kvix,
# the Mooncake trace's event load (kvix-load events) → applied blocks/s and RSS per
# live (block, worker). Then, on a --threads 2 kvix holding the 16-worker index:
# closed-loop /query and /query_by_hash at 1 and 16 connections with 1k and 8k-token
# prompts, an open-loop sweep of offered load, and RSS after every worker is
# unregistered (memory returned). The same query phases against kvix-hello (same
# runtime, constant answer) give the HTTP ceiling. Plots and a summary table follow.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=6000 DURATION=10 QUICK=0 REPEAT=3
OUT="perf/out/bench-$(date +%Y%m%d-%H%M%S)"
RATES="1000,2000,5000,10000,20000,30000,40000"
quick() { QUICK=1; REQUESTS=300; DURATION=1; RATES="1000,4000"; REPEAT=1; }
. perf/lib.sh
parse_options "OUT REQUESTS DURATION REPEAT QUICK" "$@"
pick_trace
log_to bench

build_release
describe_machine "$OUT/machine.txt" "requests: $REQUESTS duration: $DURATION trace: $TRACE"

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
start() { # start BINARY THREADS [ARGS...] → sets PID and PORT
    local bin=$1 threads=$2
    shift 2
    PORT=$(free_port)
    "$BIN/$bin" --host 127.0.0.1 --port "$PORT" --threads "$threads" "$@" 2>>"$OUT/server.log" &
    PID=$!
    wait_health "$PORT"
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""; }
LOAD=("$BIN/kvix-load")
COMMON=(--trace "$TRACE" --requests "$REQUESTS" --quiet --json)

# 1. Event load: applied blocks/s and memory, per shard count and worker count. This
# VM's first-touch page faults make one event run vary by ±25%, so each configuration
# runs --repeat times on a fresh kvix; NAME.json is the run with the median rate.
events_run() { # events_run NAME THREADS WORKERS [KVIX ARGS...]
    local name=$1 threads=$2 workers=$3
    shift 3
    for r in $(seq 1 "$REPEAT"); do
        say "events: $name, run $r/$REPEAT"
        start kvix "$threads" "$@"
        "${LOAD[@]}" events --url "http://127.0.0.1:$PORT" "${COMMON[@]}" --workers-count "$workers" \
            --pid "$PID" --keep >"$OUT/$name-r$r.json"
        stop
    done
    python3 - "$OUT" "$name" <<'PY'
import glob, json, os, shutil, sys
out, name = sys.argv[1], sys.argv[2]
runs = sorted(glob.glob(os.path.join(out, f"{name}-r*.json")),
              key=lambda f: json.load(open(f))["events"]["blocks_applied_per_sec"])
shutil.copy(runs[len(runs) // 2], os.path.join(out, f"{name}.json"))
PY
}
for threads in 1 2; do
    for workers in 16 64; do
        events_run "events-t$threads-w$workers" "$threads" "$workers"
    done
done
# Ingest threads: the serial stage of the event path, spread over 1-3 threads.
for ingest in 1 2 3; do
    events_run "events-t2-w16-i$ingest" 2 16 --ingest-threads "$ingest"
done

# 2. Queries against a --threads 2 kvix holding the 16-worker index.
say "queries against kvix"
start kvix 2
"${LOAD[@]}" events --url "http://127.0.0.1:$PORT" "${COMMON[@]}" --workers-count 16 --pid "$PID" \
    --keep >"$OUT/kvix-index.json"
"${LOAD[@]}" query --url "http://127.0.0.1:$PORT" "${COMMON[@]}" --connections 1,16 \
    --prompt-tokens 1024,8192 --endpoint query,query-by-hash --duration "$DURATION" >"$OUT/kvix-closed.json"
"${LOAD[@]}" query --url "http://127.0.0.1:$PORT" "${COMMON[@]}" --connections 16 --rate "$RATES" \
    --prompt-tokens 1024 --duration "$DURATION" >"$OUT/kvix-open.json"
# Memory after churn: every worker unregistered (its blocks cleared).
echo "rss_loaded_kib: $(rss_kib "$PID")" >"$OUT/kvix-churn.txt"
for i in $(seq 1 16); do
    curl -fs -X POST "http://127.0.0.1:$PORT/unregister" -H 'Content-Type: application/json' \
        -d "{\"instance_id\": $i, \"model_name\": \"kvix-load\"}" >/dev/null
done
sleep 2
echo "rss_after_unregister_kib: $(rss_kib "$PID")" >>"$OUT/kvix-churn.txt"
stop
start kvix 2
echo "rss_fresh_kib: $(rss_kib "$PID")" >>"$OUT/kvix-churn.txt"
stop

# 3. The HTTP ceiling: kvix-hello under the same query phases.
say "queries against kvix-hello (HTTP ceiling)"
start kvix-hello 2
"${LOAD[@]}" query --url "http://127.0.0.1:$PORT" "${COMMON[@]}" --connections 1,16 \
    --prompt-tokens 1024,8192 --duration "$DURATION" >"$OUT/hello-closed.json"
"${LOAD[@]}" query --url "http://127.0.0.1:$PORT" "${COMMON[@]}" --connections 16 --rate "$RATES" \
    --prompt-tokens 1024 --duration "$DURATION" >"$OUT/hello-open.json"
stop

# 4. Plots and the summary table.
"${LOAD[@]}" plot --out "$OUT" --latency "kvix=$OUT/kvix-open.json,kvix-hello=$OUT/hello-open.json" \
    --events "1 shard=$OUT/events-t1-w16.json,1 shard=$OUT/events-t1-w64.json,2 shards=$OUT/events-t2-w16.json,2 shards=$OUT/events-t2-w64.json" >&2
python3 perf/summary.py "$OUT" >"$OUT/summary.md"
say "results in $OUT (summary.md, latency.svg, events.svg)"
