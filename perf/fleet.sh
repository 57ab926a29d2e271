#!/usr/bin/env bash
# Fleets: kvix and Dynamo's standalone indexer as the worker count grows, in one run,
# one table and one plot (DIR/fleet.md, DIR/fleet.svg; perf/fleet_table.py).
#
#   perf/fleet.sh [--out DIR] [--requests N] [--duration S] [--workers "16 300 1000 3000 8000"]
#                 [--systems "kvix dynamo"] [--no-build]
#
# For each worker count, each system on a fresh server at --threads 2: the Mooncake
# trace's first --requests requests routed at random over that many engines (kvix-load
# events: one PUB socket and one /register each, vLLM's three-field batches, one
# engine hash per block on every worker as Dynamo 1.6.1 needs), then closed-loop
# /query with 1k-token prompts at 16 and at 1 connection. Recorded: the wall time of
# registering and applying everything, blocks applied/s (timed by the indexer's tree
# sizes adding up to every block published, one /query a poll, `--wait-tree-sizes`:
# a query per worker, each of kvix's answers listing every worker, would time the
# load tool; Dynamo's answers list matched workers only and carry no tree sizes, so
# it is timed by its sentinels as before),
# settled RSS per live (block, worker) pair, query p50/p99 at each connection count,
# and the server's open descriptors while every engine is connected (sampled every
# 0.2 s). A system that fails at one size (it exits or refuses) is marked so and not
# tried at larger ones. The load tool holds three descriptors a worker (mailbox,
# listening socket, the indexer's connection), so above 4,000 workers several run side
# by side, each with its own instance ids and an equal share of the requests (their
# figures summed).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=30000 DURATION=5 WORKERS="16 300 1000 3000 8000" SYSTEMS="kvix dynamo" BUILD=1
PER_LOADER=4000
OUT="perf/out/fleet-$(date +%Y%m%d-%H%M%S)"
. perf/lib.sh
parse_options "OUT REQUESTS DURATION WORKERS SYSTEMS NO_BUILD" "$@"
pick_trace
log_to fleet

if [ "$BUILD" = 1 ]; then
    build_release
    cargo build --release --locked --manifest-path scripts/dynamo_peer/Cargo.toml >&2
fi
BIN=target/release PEER_BIN=scripts/dynamo_peer/target/release
describe_machine "$OUT/machine.txt" "requests: $REQUESTS duration: $DURATION trace: $TRACE"

PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
load() { "$BIN/kvix-load" "$@" || [ $? = 2 ]; }

declare -A FAILED
for workers in $WORKERS; do
    for system in $SYSTEMS; do
        name="$system-w$workers"
        if [ -n "${FAILED[$system]:-}" ]; then
            echo "{\"skipped\": \"failed at ${FAILED[$system]} workers\"}" >"$OUT/$name.json"
            continue
        fi
        say "$system, $workers workers"
        start_indexer "$system" 2 "$OUT/$name.log"
        common=(--url "http://127.0.0.1:$PORT" --quiet --json --workload trace --trace "$TRACE")
        # One load tool drives at most PER_LOADER workers (three descriptors each);
        # more run side by side, each with its own instance ids and its share of the
        # requests.
        loaders=$(( (workers + PER_LOADER - 1) / PER_LOADER ))
        t0=$(date +%s.%N)
        pids=()
        for k in $(seq 0 $((loaders - 1))); do
            load events "${common[@]}" --requests $((REQUESTS / loaders)) \
                --workers-count $((workers / loaders)) --first-instance-id $((k * workers / loaders + 1)) \
                --policy random --shared-engine-hashes --wait-tree-sizes --pid "$PID" --keep \
                >"$OUT/$name-events-$k.json" 2>>"$OUT/$name.log" &
            pids+=($!)
        done
        # The server's open descriptors while every engine is connected (the most seen).
        fds=0
        alive() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
        while alive; do
            n=$(ls "/proc/$PID/fd" 2>/dev/null | wc -l)
            [ "$n" -gt "$fds" ] && fds=$n
            sleep 0.2
        done
        ok=1
        for p in "${pids[@]}"; do wait "$p" || ok=0; done
        if [ "$ok" = 0 ] || ! kill -0 "$PID" 2>/dev/null; then
            FAILED[$system]=$workers
            echo "{\"failed\": true}" >"$OUT/$name.json"
            cleanup
            PID=""
            continue
        fi
        t1=$(date +%s.%N)
        load query "${common[@]}" --requests "$REQUESTS" --connections 16,1 --prompt-tokens 1024 --duration "$DURATION" \
            >"$OUT/$name-query.json"
        echo "{\"events_wall_secs\": $(echo "$t1 - $t0" | bc), \"fds\": $fds}" >"$OUT/$name.json"
        kill "$PID"
        wait "$PID" 2>/dev/null || true
        PID=""
    done
done

perf/fleet_table.py "$OUT" "$WORKERS" "$SYSTEMS"
"$BIN/kvix-load" plot --fleet "$OUT/fleet.json" --out "$OUT" >/dev/null
say "results in $OUT (fleet.md, fleet.svg)"
cat "$OUT/fleet.md" >&3
