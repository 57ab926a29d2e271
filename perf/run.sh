#!/usr/bin/env bash
# Measure kvix on this machine and write every result to a folder (never the terminal).
#
#   perf/run.sh [--threads N] [--workers W] [--requests R] [--duration S] [--out DIR] [--quick]
#
# Runs, against a freshly started release kvix and in one go (so every figure shares
# the machine's state): the event load (kvix-load, Mooncake trace), the query load
# (1 and 16 connections, 1k and 8k-token prompts), the HTTP ceiling (kvix-hello, same
# runtime answering a constant) and the index ceiling (criterion, hashbrown 1M).
# Around the run: `perf stat` (hardware counters where the machine has them,
# software ones otherwise), a `perf record` flame graph (inferno) of a query phase,
# and, where hardware counters are missing, a `valgrind --tool=callgrind` profile of
# a short event + query load, which counts instructions whatever the noise.
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=2 WORKERS=16 REQUESTS=6000 DURATION=10 QUICK=0
OUT="perf/out/$(date +%Y%m%d-%H%M%S)"
quick() { QUICK=1; REQUESTS=500; DURATION=2; }
. perf/lib.sh
parse_options "THREADS WORKERS REQUESTS DURATION OUT QUICK" "$@"
pick_trace
log_to run

build_release
describe_machine "$OUT/machine.txt" "threads: $THREADS workers: $WORKERS requests: $REQUESTS duration: $DURATION trace: $TRACE"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

HW=1
perf stat -e instructions true 2>&1 | grep -q "not supported" && HW=0
command -v perf >/dev/null || HW=0
EVENTS="task-clock,context-switches,cpu-migrations,page-faults"
[ "$HW" = 1 ] && EVENTS="$EVENTS,cycles,instructions,cache-references,cache-misses,branches,branch-misses"

# 1. kvix under the full benchmark, with perf stat attached.
PORT=$(free_port)
$BIN/kvix --host 127.0.0.1 --port "$PORT" --threads "$THREADS" 2>"$OUT/kvix.log" &
KVIX=$!; PIDS+=("$KVIX")
wait_health "$PORT"
if command -v perf >/dev/null; then
    perf stat -e "$EVENTS" -p "$KVIX" -o "$OUT/perf-stat.txt" &
    PSTAT=$!; PIDS+=("$PSTAT")
fi
say "event + query load against kvix (pid $KVIX, $THREADS threads, $WORKERS workers)"
$BIN/kvix-load bench --url "http://127.0.0.1:$PORT" --trace "$TRACE" --requests "$REQUESTS" \
    --workers-count "$WORKERS" --pid "$KVIX" --keep --quiet --json \
    --connections 1,16 --prompt-tokens 1024,8192 --endpoint query,query-by-hash \
    --duration "$DURATION" >"$OUT/kvix-bench.json"
[ -n "${PSTAT:-}" ] && kill -INT "$PSTAT" && wait "$PSTAT" 2>/dev/null || true

# 2. A flame graph of kvix serving 16 connections of 1k-token queries.
if command -v perf >/dev/null; then
    command -v inferno-flamegraph >/dev/null || cargo install --locked inferno >&2
    say "flame graph of a query phase"
    perf record -F 499 -e cpu-clock -g -p "$KVIX" -o "$OUT/perf.data" -- sleep "$DURATION" &
    PREC=$!
    $BIN/kvix-load query --url "http://127.0.0.1:$PORT" --trace "$TRACE" --requests "$REQUESTS" \
        --connections 16 --prompt-tokens 1024 --duration "$DURATION" --quiet --json >"$OUT/kvix-query-profiled.json"
    wait "$PREC" || true
    perf script -i "$OUT/perf.data" 2>/dev/null | inferno-collapse-perf >"$OUT/query.folded"
    inferno-flamegraph <"$OUT/query.folded" >"$OUT/query-flame.svg"
fi
kill "$KVIX"; wait "$KVIX" 2>/dev/null || true

# 3. The HTTP ceiling: the same runtime answering a constant, same query load.
HPORT=$(free_port)
$BIN/kvix-hello --port "$HPORT" --threads "$THREADS" &
HELLO=$!; PIDS+=("$HELLO")
wait_health "$HPORT"
say "HTTP ceiling (kvix-hello)"
$BIN/kvix-load query --url "http://127.0.0.1:$HPORT" --trace "$TRACE" --requests "$REQUESTS" \
    --connections 1,16 --prompt-tokens 1024,8192 --duration "$DURATION" --quiet --json >"$OUT/hello-query.json"
kill "$HELLO"; wait "$HELLO" 2>/dev/null || true

# 4. The index ceiling and the per-stage micro-benchmarks.
if [ "$QUICK" = 0 ]; then
    say "criterion benches"
    cargo bench --bench kvix -- --warm-up-time 1 --measurement-time 3 >"$OUT/criterion.txt"
fi

# 5. Instruction counts where the hardware has no counters.
if [ "$HW" = 0 ] && command -v valgrind >/dev/null; then
    say "callgrind profile (no hardware counters here)"
    CPORT=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
        $BIN/kvix --host 127.0.0.1 --port "$CPORT" --threads 1 2>"$OUT/callgrind.log" &
    VG=$!; PIDS+=("$VG")
    if wait_health "$CPORT"; then
        $BIN/kvix-load bench --url "http://127.0.0.1:$CPORT" --trace tests/data/mooncake_trace_head500.jsonl \
            --requests 200 --workers-count 4 --connections 1 --duration 2 --quiet --json \
            --settle-timeout 60 >"$OUT/callgrind-load.json" || true
    fi
    kill -INT "$VG" 2>/dev/null || true
    wait "$VG" 2>/dev/null || true
    callgrind_annotate "$OUT/callgrind.out" 2>/dev/null | head -60 >"$OUT/callgrind-top.txt" || true
fi

say "results in $OUT"
