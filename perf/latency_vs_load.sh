#!/usr/bin/env bash
# Latency against offered load, kvix and Dynamo's standalone indexer side by side:
# for each system at each thread count, a fresh server, the trace's event load,
# then open-loop /query (1k-token prompts, 16 connections) at each rate, latency
# from each request's intended send time; one SVG (kvix-load plot --latency).
#
#   perf/latency_vs_load.sh [--no-build] [--threads "1 2"] [--rates "2000,4000,..."]
#                           [--duration S] [--out DIR]
#
# Builds as perf/compare.sh does (dynamo-peer from scripts/dynamo_peer).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=1 THREADS="1 2" RATES="2000,4000,6000,8000,10000,12000,16000" DURATION=3
OUT="perf/out/latency-$(date +%Y%m%d-%H%M%S)"
. perf/lib.sh
parse_options "NO_BUILD THREADS RATES DURATION OUT" "$@"
pick_trace
mkdir -p "$OUT"
BIN=target/release PEER_BIN=scripts/dynamo_peer/target/release
if [ "$BUILD" = 1 ]; then
    cargo build --release --locked --workspace --bin kvix --bin kvix-load
    cargo build --release --locked --manifest-path scripts/dynamo_peer/Cargo.toml
fi
describe_machine "$OUT/machine.txt" "threads: $THREADS rates: $RATES duration: $DURATION"

PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
read -r -a wl <<<"$(workload_args trace)"
read -r -a ev <<<"$(worker_args trace)"
series=()
for t in $THREADS; do
    for system in kvix dynamo; do
        start_indexer "$system" "$t" "$OUT/$system-t$t.log"
        common=(--url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}")
        "$BIN/kvix-load" events "${common[@]}" "${ev[@]}" --keep >/dev/null || [ $? = 2 ]
        "$BIN/kvix-load" query "${common[@]}" --connections 16 --rate "$RATES" \
            --prompt-tokens 1024 --duration "$DURATION" >"$OUT/$system-t$t.json" || [ $? = 2 ]
        kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
        series+=(--latency "$system --threads $t=$OUT/$system-t$t.json")
    done
done
"$BIN/kvix-load" plot "${series[@]}" --out "$OUT"
echo "perf/latency_vs_load.sh: $OUT/latency.svg"
