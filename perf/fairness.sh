#!/usr/bin/env bash
# Does one executor share itself fairly between its connections under a
# saturating closed-loop load? The regression check for the runtime's tail.
#
#   perf/fairness.sh [--no-build] [--duration S] [--connections "16 32"]
#                    [--spread X] [--tail X] [--out DIR] [--servers DIR]
#
# --servers DIR takes kvix and kvix-hello from DIR (another build, for a before
# and after); kvix-load always comes from this tree's release build.
#
# For kvix-hello (the runtime alone) and kvix (the trace's events loaded), each at
# --threads 1 with the load client pinned to another CPU: closed-loop /query with
# 1k-token prompts at each connection count. It fails (exit 1) when, in any phase,
#   - the slowest connection's p99 exceeds --spread (default 3) × the median
#     connection's p99: some connections are served after others, or
#   - p99.9 exceeds --tail (default 20) × p50: every connection is held at times
#     (glommio's 100 ms preempt timer showed here as a p99.9 of 100 ms at a p50
#     of 1 ms).
# The bounds are wide because the machine is noisy; the faults they catch are
# two orders of magnitude. A benchmark, not a unit test: run it by hand or on a
# quiet machine, not in CI.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVERS="" BUILD=1 DURATION=5 CONNECTIONS="16 32" SPREAD=3 TAIL=20
OUT="perf/out/fairness-$(date +%Y%m%d-%H%M%S)"
. perf/lib.sh
parse_options "NO_BUILD DURATION CONNECTIONS SPREAD TAIL OUT SERVERS" "$@"
pick_trace
mkdir -p "$OUT"
BIN=target/release
SERVERS=${SERVERS:-$BIN}
[ "$BUILD" = 1 ] && cargo build --release --locked --workspace --bin kvix --bin kvix-load --bin kvix-hello
describe_machine "$OUT/machine.txt" "duration: $DURATION connections: $CONNECTIONS servers: $SERVERS"

# The client on the last CPU, the executor wherever glommio pins it (the first).
CLIENT_CPU=$(($(nproc) - 1))
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

conns=$(echo "$CONNECTIONS" | tr ' ' ',')
for system in kvix-hello kvix; do
    PORT=$(free_port)
    case "$system" in
        kvix-hello) "$SERVERS/kvix-hello" --host 127.0.0.1 --port "$PORT" --threads 1 \
            --body-bytes 2000 2>"$OUT/$system.log" & ;;
        kvix) "$SERVERS/kvix" --host 127.0.0.1 --port "$PORT" --threads 1 2>"$OUT/$system.log" & ;;
    esac
    PID=$!
    wait_health "$PORT" || { echo "$system did not answer /health" >&2; exit 1; }
    wl=(--url "http://127.0.0.1:$PORT" --quiet --json --workload trace --trace "$TRACE"
        --requests 6000)
    if [ "$system" = kvix ]; then
        "$BIN/kvix-load" events "${wl[@]}" --workers-count 16 --policy prefix-affinity \
            --keep >"$OUT/$system-events.json" || [ $? = 2 ]
    fi
    taskset -c "$CLIENT_CPU" "$BIN/kvix-load" query "${wl[@]}" --connections "$conns" \
        --prompt-tokens 1024 --duration "$DURATION" >"$OUT/$system-query.json" || [ $? = 2 ]
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
done

python3 - "$OUT" "$SPREAD" "$TAIL" <<'EOF'
import json, sys
out, spread, tail = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
failed = []
print(f"| system | conns | req/s | p50 µs | p99 µs | p99.9 µs | max µs | conn p99 median / slowest µs | verdict |")
print("|---|---|---|---|---|---|---|---|---|")
for system in ("kvix-hello", "kvix"):
    for q in json.load(open(f"{out}/{system}-query.json"))["queries"]:
        why = []
        if not q["completed"]:
            why.append("no request completed")
        else:
            med, worst = q["conn_p99_median_us"], q["conn_p99_max_us"]
            if med and worst > spread * med:
                why.append(f"slowest connection's p99 {worst / med:.1f}× the median's")
            if q["p999_us"] > tail * q["p50_us"]:
                why.append(f"p99.9 {q['p999_us'] / q['p50_us']:.0f}× p50")
        verdict = "; ".join(why) or "ok"
        if why:
            failed.append(f"{system} at {q['connections']} connections: {verdict}")
        print(f"| {system} | {q['connections']} | {q['achieved_rps']:.0f} | {q['p50_us']:.0f} "
              f"| {q['p99_us']:.0f} | {q['p999_us']:.0f} | {q['max_us']:.0f} "
              f"| {q['conn_p99_median_us']:.0f} / {q['conn_p99_max_us']:.0f} | {verdict} |")
for f in failed:
    print(f"perf/fairness.sh: FAILED: {f}", file=sys.stderr)
sys.exit(1 if failed else 0)
EOF
