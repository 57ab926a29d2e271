#!/usr/bin/env bash
# Slot tracker, kvix against Dynamo's (dynamo-kv-router 1.6.1, scripts/dynamo_peer's
# dynamo-slot-tracker), same run, same thread count:
#   1. /add + /free pairs per second (closed loop, 1 and 8 connections);
#   2. /potential_loads per second with 256 requests booked;
#   3. kvix's /query against /query with "loads": true, index filled by an event run,
#      the same 256 requests booked.
# Usage: perf/slots.sh [--threads N] [--duration S] [--no-build]
# Writes $OUT (default perf/out/slots-<commit>) with one JSON line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 DURATION=5 BUILD=1
OUT=perf/out/slots-$(git rev-parse --short HEAD)
while [ $# -gt 0 ]; do
    case $1 in
        --threads) THREADS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$BUILD" = 1 ]; then
    cargo build --release --locked -p kvix -p kvix-load
    cargo build --release --locked --manifest-path scripts/dynamo_peer/Cargo.toml --bin dynamo-slot-tracker
fi
mkdir -p "$OUT"
: > "$OUT/slots.jsonl"
LOAD=target/release/kvix-load
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
KP=$(free_port) KS=$(free_port) DS=$(free_port)
target/release/kvix --host 127.0.0.1 --port "$KP" --slot-tracker-port "$KS" --threads "$THREADS" 2>"$OUT/kvix.log" &
KPID=$!
scripts/dynamo_peer/target/release/dynamo-slot-tracker --port "$DS" --runtime-threads "$THREADS" 2>"$OUT/dynamo.log" &
DPID=$!
trap 'kill $KPID $DPID 2>/dev/null || true' EXIT
for u in "http://127.0.0.1:$KS/health" "http://127.0.0.1:$DS/health" "http://127.0.0.1:$KP/ready"; do
    for _ in $(seq 100); do curl -sf "$u" >/dev/null && break; sleep 0.1; done
done
for who in kvix:$KS dynamo:$DS; do
    name=${who%%:*} port=${who#*:}
    $LOAD slots --url "http://127.0.0.1:$port" --connections 1,8 --duration "$DURATION" \
        | sed "s/^/{\"server\":\"$name\",\"run\":/; s/\$/}/" | tee -a "$OUT/slots.jsonl"
    $LOAD slots --url "http://127.0.0.1:$port" --potential --active 256 --connections 8 --duration "$DURATION" \
        | sed "s/^/{\"server\":\"$name\",\"run\":/; s/\$/}/" | tee -a "$OUT/slots.jsonl"
done
# /query with and without loads: the trace's first 2000 requests indexed, the slot
# tracker's workers holding 256 booked requests.
$LOAD slots --url "http://127.0.0.1:$KS" --potential --active 256 --keep-active --connections 1 --duration 0.1 >/dev/null
$LOAD events --url "http://127.0.0.1:$KP" --requests 2000 --keep --quiet --json > "$OUT/events.json"
for loads in "" --loads; do
    $LOAD query --url "http://127.0.0.1:$KP" --requests 2000 --connections 8 --rate 0 \
        --duration "$DURATION" --quiet --json $loads > "$OUT/query${loads:+-loads}.json"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'server':8} {'mode':16} {'conns':>5} {'per s':>10} {'p50 us':>8} {'p99 us':>8} {'errors':>6}")
for line in open(f"{out}/slots.jsonl"):
    r = json.loads(line); x = r["run"]
    print(f"{r['server']:8} {x['mode']:16} {x['connections']:5} {x['per_second']:10.0f} {x['p50_us']:8.0f} {x['p99_us']:8.0f} {x['errors']:6}")
for name in ("query", "query-loads"):
    q = json.load(open(f"{out}/{name}.json"))["queries"][0]
    print(f"kvix     /{name:15} {q.get('connections', 8):5} {q['achieved_rps']:10.0f} {q['p50_us']:8.0f} {q['p99_us']:8.0f} {q['errors']:6}")
PY
