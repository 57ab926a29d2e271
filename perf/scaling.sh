#!/usr/bin/env bash
# How kvix and Dynamo's standalone indexer scale with threads: the compare.sh
# workload at 1, 2, 4, 8 and 16 threads (kvix: executors, that is shards; Dynamo:
# indexer threads and as many tokio workers), each in a fresh server, and per
# thread count: blocks applied/s, closed-loop /query at 16 connections (req/s,
# p50, p99), open-loop p99 at --rate, and the server's CPU per query.
#
#   perf/scaling.sh [--no-build] [--threads "1 2 4 8 16"] [--workload trace|shared-prefix]
#                   [--duration S] [--rate R] [--requests N] [--out DIR] [--bin DIR]
#                   [--peer-bin DIR] [--shards-per-index "1 4 16"] [--systems "kvix dynamo"]
#
# A query visits every shard that can hold one of the index's slots (a shard owns
# whole slots, partition.rs): with W workers, S shards and an index spread over at
# most N of them (--shards-per-index) it is min(W, N, S) shard lookups of the whole
# prompt plus one gather, so the CPU a query costs grows with the shards it visits,
# and the index's events are filed by as many cores. kvix runs once per N in the list
# (rows `kvix N=…` when more than one; none given: kvix's default). Run it where there are at least as many cores as the largest thread
# count plus one for the client: kvix clamps --threads to the cores it may use
# (its log's `shards=`), so on fewer cores its larger counts repeat the largest
# that fits, while Dynamo's threads oversubscribe (machine.txt records nproc). --bin / --peer-bin take prebuilt
# binaries (kvix, kvix-load; dynamo-peer), e.g. stripped ones carried to a larger
# machine; with --no-build and no dynamo-peer, kvix runs alone.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=1 THREADS="1 2 4 8 16" WORKLOAD=trace DURATION=8 RATE=6000 REQUESTS=6000
BIN=target/release PEER_BIN=scripts/dynamo_peer/target/release SHARDS_PER_INDEX="" SYSTEMS=""
OUT="perf/out/scaling-$(date +%Y%m%d-%H%M%S)"
. perf/lib.sh
parse_options "NO_BUILD THREADS WORKLOAD DURATION RATE REQUESTS OUT BIN PEER_BIN SHARDS_PER_INDEX SYSTEMS" "$@"
pick_trace
mkdir -p "$OUT"
if [ "$BUILD" = 1 ]; then
    cargo build --release --locked --workspace --bin kvix --bin kvix-load
    cargo build --release --locked --manifest-path scripts/dynamo_peer/Cargo.toml
fi
if [ -z "$SYSTEMS" ]; then
    SYSTEMS="kvix"
    [ -x "$PEER_BIN/dynamo-peer" ] && SYSTEMS="kvix dynamo"
fi
# kvix once per --shards-per-index: runs named kvix (one or none) or kvix-n<N>.
RUNS=""
for s in $SYSTEMS; do
    if [ "$s" = kvix ] && [ "$(wc -w <<<"$SHARDS_PER_INDEX")" -gt 1 ]; then
        for n in $SHARDS_PER_INDEX; do RUNS="$RUNS kvix-n$n"; done
    else
        RUNS="$RUNS $s"
    fi
done
describe_machine "$OUT/machine.txt" "threads: $THREADS workload: $WORKLOAD duration: $DURATION rate: $RATE
systems: $SYSTEMS shards per index: ${SHARDS_PER_INDEX:-default}"

PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
read -r -a wl <<<"$(workload_args "$WORKLOAD")"
read -r -a ev <<<"$(worker_args "$WORKLOAD")"
for t in $THREADS; do
    for system in $RUNS; do
        n=${system#kvix-n}
        [ "$n" = "$system" ] && n=$SHARDS_PER_INDEX
        KVIX_ARGS=${n:+--shards-per-index $n} start_indexer "${system%%-n*}" "$t" "$OUT/$system-t$t.log"
        common=(--url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}")
        "$BIN/kvix-load" events "${common[@]}" "${ev[@]}" --pid "$PID" --keep \
            >"$OUT/$system-t$t-events.json" || [ $? = 2 ]
        c0=$(cpu)
        "$BIN/kvix-load" query "${common[@]}" --connections 16 --prompt-tokens 1024 \
            --duration "$DURATION" >"$OUT/$system-t$t-query.json" || [ $? = 2 ]
        c1=$(cpu)
        echo "{\"cpu_ticks\": $((c1 - c0)), \"tick_hz\": $(getconf CLK_TCK)}" >"$OUT/$system-t$t-cpu.json"
        "$BIN/kvix-load" query "${common[@]}" --connections 16 --rate "$RATE" --prompt-tokens 1024 \
            --duration "$DURATION" >"$OUT/$system-t$t-open.json" || [ $? = 2 ]
        kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
    done
done

python3 - "$OUT" "$THREADS" "$RUNS" >"$OUT/scaling.md" <<'EOF'
import json, sys
out, threads, systems = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
print("# Scaling with threads (perf/scaling.sh)\n")
print("```\n" + open(f"{out}/machine.txt").read().strip() + "\n```\n")
print("| system | threads | blocks applied/s | 16c req/s | 16c p50 µs | 16c p99 µs "
      "| server CPU µs / query | open-loop p99 µs |")
print("|---|---|---|---|---|---|---|---|")
for s in systems:
    for t in threads:
        ev = load(f"{out}/{s}-t{t}-events.json") or {}
        q = ((load(f"{out}/{s}-t{t}-query.json") or {}).get("queries") or [None])[0]
        o = ((load(f"{out}/{s}-t{t}-open.json") or {}).get("queries") or [None])[0]
        cpu = load(f"{out}/{s}-t{t}-cpu.json")
        e = ev.get("events") or {}
        applied = e.get("blocks_applied_per_sec")
        cells = [
            f"{applied / 1e6:.2f}M" if applied else "—",
            f"{q['achieved_rps']:.0f}" if q and q["completed"] else "—",
            f"{q['p50_us']:.0f}" if q and q["completed"] else "—",
            f"{q['p99_us']:.0f}" if q and q["completed"] else "—",
            f"{cpu['cpu_ticks'] / cpu['tick_hz'] / q['completed'] * 1e6:.1f}" if cpu and q and q["completed"] else "—",
            f"{o['p99_us']:.0f}" if o and o["completed"] and not o.get("unsent") else "—",
        ]
        name = s.replace("kvix-n", "kvix N=")
        print(f"| {name} | {t} | " + " | ".join(cells) + " |")
EOF
cat "$OUT/scaling.md"
