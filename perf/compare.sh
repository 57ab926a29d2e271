#!/usr/bin/env bash
# kvix against Dynamo's standalone indexer, side by side in one run, with the HTTP
# ceilings of a plain tokio + hyper server and of kvix's own runtime (glommio) doing
# no work; writes results and a ratio table.
#
#   perf/compare.sh [--repeat N] [--quick] [--out DIR] [--no-build]
#                   [--requests N] [--duration S] [--workloads "trace shared-prefix"]
#                   [--systems "kvix dynamo hello ghello"] [--threads "1 2"] [--rate R]
#                   [--before DIR] [--pair 0|1]
#
# Builds kvix (release) and scripts/dynamo_peer (dynamo-peer: the published crate
# dynamo-kv-router 1.6.1 run by its own run_server; tokio-hello: tokio + hyper
# answering a constant /query-sized body) and kvix-hello (ghello, glommio-hello:
# kvix's runtime, its executors placed and polling as kvix's, the same HTTP stack,
# the same constant body, no index). Then, --repeat times, for each workload
#   trace          first --requests requests of the Mooncake conversation trace,
#                  16 workers, prefix-affinity routing
#   shared-prefix  kvix-load's generated workload (6 x --requests requests, so the
#                  index is of the trace's order of size): a few long system prompts and
#                  few-shot prefixes opening most requests, 64 workers, random routing
# and for each system at --threads 1 and 2 (kvix: executors; Dynamo: indexer threads
# and as many tokio workers): a fresh server, the event load (blocks applied/s,
# settled RSS per live (block, worker)), then closed-loop /query with 1k-token
# prompts at 16 connections and at 1, then open loop at --rate req/s (default 6000,
# a rate every system sustains here) over 16 connections, latency from each
# request's intended send time; tokio-hello and glommio-hello take the same query
# phases, answering a constant body of the mean size of kvix's replies in that
# workload: what tokio-hello cannot reach on this machine, no server can, and
# glommio-hello is kvix's runtime without kvix's work.
# Then kvix and Dynamo, both filled, share one open loop at --rate, 100 ms each in
# turn (pair-t<n>-open.json), so that both meet the same machine (--pair 0: not).
# The event streams are vLLM's wire format with two choices Dynamo 1.6.1 needs, made
# for both systems: batches carry the (nil) dp-rank element, and a block has the
# same engine hash on every worker (under per-worker hashes Dynamo's indexer drops
# stores whose parent another worker also holds; the log counts such failures).
# Then, on a fresh server, the same event load with one engine hash per worker
# (engines seeding their hashes apart, vLLM's default): <system>-t<n>-events-apart.
# A discarded warm-up (each system, each workload's event load) comes first. Systems
# alternate which goes first from one repeat to the next, so the machine's drift
# does not favour one. Everything runs on this machine, client included.
#
# --before DIR adds a system `before`: DIR/kvix (another build, e.g. a worktree's
# target/release) taking every phase kvix takes, in the same run, for a before-and-
# after table (compare.md's last section).
#
# Output: DIR/run-R/<workload>/<system>-t<threads>-{events,query}.json (kvix-load
# --json reports) and .log (the server's stderr), pair-t<threads>-open.json (the
# interleaved open loop: kvix's phase, then Dynamo's), DIR/run-R/results.json (the
# figures of that run), and DIR/compare.md: per workload and thread count, every
# system's latency (closed and open loop, never best-of) with kvix's ratios as median
# and range over the runs; throughput, events and memory at each system's best
# thread count. DIR/compare.log: progress.
#
# Builds run under `nice -n 10`; set CARGO_BUILD_JOBS to bound their parallelism.
# Needs a C/C++ compiler (libzmq and ring are built from source), python3, curl.
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=3 QUICK=0 BUILD=1 REQUESTS=6000 DURATION=10 RATE=6000 BEFORE_BIN="" PAIR=1
WORKLOADS="trace shared-prefix" SYSTEMS="kvix dynamo hello ghello" THREADS="1 2"
OUT="perf/out/compare-$(date +%Y%m%d-%H%M%S)"
quick() { QUICK=1; REPEAT=1; REQUESTS=1000; DURATION=2; }
. perf/lib.sh
parse_options "REPEAT QUICK OUT NO_BUILD REQUESTS DURATION RATE WORKLOADS SYSTEMS THREADS BEFORE=BEFORE_BIN PAIR" "$@"
pick_trace
log_to compare

PEER_DIR=scripts/dynamo_peer
PEER_BIN=$PEER_DIR/target/release
if [ "$BUILD" = 1 ]; then
    say "building kvix and kvix-load (release)"
    nice -n 10 cargo build --release --locked --workspace --bin kvix --bin kvix-hello \
        --bin kvix-load >&2
    say "building dynamo-peer and tokio-hello (dynamo-kv-router 1.6.1; slow the first time)"
    if ! nice -n 10 cargo build --release --locked --manifest-path "$PEER_DIR/Cargo.toml" >&2; then
        say "building $PEER_DIR failed (see $OUT/compare.log); it needs a C/C++ compiler: apt-get install build-essential"
        exit 1
    fi
fi
BIN=target/release
[ -n "$BEFORE_BIN" ] && SYSTEMS="$SYSTEMS before"
for b in "$BIN/kvix" "$BIN/kvix-load" "$PEER_BIN/dynamo-peer" "$PEER_BIN/tokio-hello" \
    ${BEFORE_BIN:+"$BEFORE_BIN/kvix"}; do
    [ -x "$b" ] || { say "missing $b (run without --no-build)"; exit 1; }
done
if [[ " $SYSTEMS " == *" ghello "* ]] && [ ! -x "$BIN/kvix-hello" ]; then
    say "missing $BIN/kvix-hello (run without --no-build)"; exit 1
fi
describe_machine "$OUT/machine.txt" "repeat: $REPEAT requests: $REQUESTS duration: $DURATION trace: $TRACE
workloads: $WORKLOADS systems: $SYSTEMS threads: $THREADS open-loop rate: $RATE/s
dynamo: dynamo-kv-router 1.6.1 (scripts/dynamo_peer/Cargo.lock)${BEFORE_BIN:+
before: $BEFORE_BIN/kvix}
load: $(uptime)"

PID="" PAIR_PID=""
cleanup() {
    local p
    for p in $PID $PAIR_PID; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
start() { # start SYSTEM THREADS LOG [HELLO BODY BYTES] → sets PID and PORT
    local system=$1 threads=$2 log=$3 body=${4:-400} cmd
    PORT=$(free_port)
    case "$system" in
        kvix) cmd=("$BIN/kvix" --host 127.0.0.1 --port "$PORT" --threads "$threads") ;;
        before) cmd=("$BEFORE_BIN/kvix" --host 127.0.0.1 --port "$PORT" --threads "$threads") ;;
        dynamo) cmd=("$PEER_BIN/dynamo-peer" --port "$PORT" --threads "$threads"
            --runtime-threads "$threads") ;;
        hello) cmd=("$PEER_BIN/tokio-hello" --host 127.0.0.1 --port "$PORT" --threads "$threads"
            --body-bytes "$body") ;;
        ghello) cmd=("$BIN/kvix-hello" --host 127.0.0.1 --port "$PORT" --threads "$threads"
            --body-bytes "$body") ;;
    esac
    # The server itself, not a subshell, is $PID: its RSS is measured and it is stopped.
    "${cmd[@]}" 2>"$log" &
    PID=$!
    wait_health "$PORT" || { say "$system did not answer /health"; exit 1; }
}
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; }

# Mean reply size of kvix's 16-connection phase in this workload: the hellos' body.
reply_bytes() { # reply_bytes QUERY_JSON
    python3 -c 'import json,sys
q=[p for p in json.load(open(sys.argv[1]))["queries"] if p["completed"]]
print(round(q[0]["reply_bytes_mean"]) if q else 400)' "$1" 2>/dev/null || echo 400
}
# kvix-load exits 2 when it measured a failure (sentinels not seen, query errors):
# the report is kept and the failure shows in the table, the run goes on.
load() { "$BIN/kvix-load" "$@" || [ $? = 2 ]; }

run_system() { # run_system RUNDIR WORKLOAD SYSTEM THREADS
    local dir=$1 workload=$2 system=$3 threads=$4 wl ev
    read -r -a wl <<<"$(workload_args "$workload")"
    read -r -a ev <<<"$(worker_args "$workload")"
    local name="$system-t$threads" body="" index=1
    case "$system" in hello | ghello) index=0 body=$(reply_bytes "$dir/kvix-t2-query.json") ;; esac
    say "$(basename "$(dirname "$dir")"), $workload: $system --threads $threads"
    start "$system" "$threads" "$dir/$name.log" "$body"
    local common=(--url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}")
    if [ "$index" = 1 ]; then
        load events "${common[@]}" "${ev[@]}" --pid "$PID" --keep >"$dir/$name-events.json"
    fi
    load query "${common[@]}" --connections 16,1 --prompt-tokens 1024 --duration "$DURATION" \
        >"$dir/$name-query.json"
    load query "${common[@]}" --connections 16 --rate "$RATE" --prompt-tokens 1024 \
        --duration "$DURATION" >"$dir/$name-open.json"
    stop
    # The same event load from engines that seed their hashes apart (vLLM's default),
    # on a fresh server: every engine names a block its own way.
    if [ "$index" = 1 ]; then
        local apart=() a
        for a in "${ev[@]}"; do [ "$a" = --shared-engine-hashes ] || apart+=("$a"); done
        start "$system" "$threads" "$dir/$name-apart.log"
        load events --url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}" "${apart[@]}" \
            --pid "$PID" >"$dir/$name-events-apart.json"
        stop
    fi
}

# kvix and Dynamo filled alike and both up, then one open loop that loads them in
# turn, --slice-ms at a time (kvix-load --interleave-with): whatever the machine does
# meanwhile (a kernel thread, a neighbour on the host) falls on both alike, where in
# their own runs it falls on whichever ran during it.
run_pair() { # run_pair RUNDIR WORKLOAD THREADS
    local dir=$1 workload=$2 threads=$3 wl ev kport
    read -r -a wl <<<"$(workload_args "$workload")"
    read -r -a ev <<<"$(worker_args "$workload")"
    say "$(basename "$(dirname "$dir")"), $workload: kvix and dynamo interleaved, --threads $threads"
    start kvix "$threads" "$dir/pair-kvix-t$threads.log"
    kport=$PORT PAIR_PID=$PID
    load events --url "http://127.0.0.1:$kport" --quiet --json "${wl[@]}" "${ev[@]}" --keep \
        >"$dir/pair-kvix-t$threads-events.json"
    start dynamo "$threads" "$dir/pair-dynamo-t$threads.log"
    load events --url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}" "${ev[@]}" --keep \
        >"$dir/pair-dynamo-t$threads-events.json"
    load query --url "http://127.0.0.1:$kport" --interleave-with "http://127.0.0.1:$PORT" \
        --quiet --json "${wl[@]}" --connections 16 --rate "$RATE" --prompt-tokens 1024 \
        --duration "$DURATION" --slice-ms 100 >"$dir/pair-t$threads-open.json"
    stop
    kill "$PAIR_PID" 2>/dev/null || true; wait "$PAIR_PID" 2>/dev/null || true; PAIR_PID=""
}

# Warm-up, discarded: each system takes each workload's event load once before the
# first run. Without it the first loads of a comparison could read half the rate of
# later ones, and the load tool's own publishing slowed with them: the machine, not
# the system under test, was warming up.
warm_up() {
    local dir="$OUT/warm-up" workload system wl ev
    for workload in $WORKLOADS; do
        mkdir -p "$dir/$workload"
        read -r -a wl <<<"$(workload_args "$workload")"
        read -r -a ev <<<"$(worker_args "$workload")"
        for system in kvix before dynamo; do
            [[ " $SYSTEMS " == *" $system "* ]] || continue
            say "warm-up, $workload: $system"
            start "$system" 1 "$dir/$workload/$system.log"
            load events --url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}" "${ev[@]}" \
                >"$dir/$workload/$system-events.json"
            stop
        done
    done
}
warm_up

for r in $(seq 1 "$REPEAT"); do
    for workload in $WORKLOADS; do
        dir="$OUT/run-$r/$workload"
        mkdir -p "$dir"
        order=(kvix before dynamo hello ghello)
        [ $((r % 2)) = 0 ] && order=(dynamo before kvix ghello hello)
        for system in "${order[@]}"; do
            [[ " $SYSTEMS " == *" $system "* ]] || continue
            for threads in $THREADS; do
                run_system "$dir" "$workload" "$system" "$threads"
            done
        done
        if [ "$PAIR" = 1 ] && [[ " $SYSTEMS " == *" kvix "* && " $SYSTEMS " == *" dynamo "* ]]; then
            for threads in $THREADS; do run_pair "$dir" "$workload" "$threads"; done
        fi
    done
    python3 perf/compare.py run "$OUT/run-$r" >"$OUT/run-$r/results.json"
done
python3 perf/compare.py table "$OUT" >"$OUT/compare.md"
say "results in $OUT (compare.md)"
cat "$OUT/compare.md" >&3
