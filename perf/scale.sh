#!/usr/bin/env bash
# How cost grows with the index: kvix and Dynamo's standalone indexer side by side on
# the shared-prefix workload at several index sizes, one row per size.
#
#   perf/scale.sh [--sizes "1 10 50"] [--threads "1 2"] [--repeat N] [--out DIR]
#                 [--no-build] [--duration S]
#
# A size is millions of live (block, worker) pairs at the end of the event load,
# approximately: the workload leaves ~37 live pairs per generated request over 64
# workers, so a size of M generates M * 27,000 requests. Each size is one
# perf/compare.sh run (shared-prefix only, kvix and Dynamo at each of --threads) in
# DIR/size-<M>M; DIR/scale.md is the table (perf/compare.py scale), DIR/scale.svg the
# same figures plotted against the index size (kvix-load plot --scale). kvix-load
# generates the requests again for each pass instead of holding them; it holds the
# encoded frames and its simulated workers' caches, ~250 MB per million pairs (12.5 GB
# at 50M, beside the server's index), and simulates for ~10 s per million pairs before
# each system's run.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES="1 10 50" THREADS="1 2" REPEAT=1 BUILD=1 DURATION=10
OUT="perf/out/scale-$(date +%Y%m%d-%H%M%S)"
. perf/lib.sh
parse_options "SIZES THREADS REPEAT OUT NO_BUILD DURATION" "$@"
mkdir -p "$OUT"
build=()
[ "$BUILD" = 1 ] || build=(--no-build)
for m in $SIZES; do
    # compare.sh generates 6 x --requests shared-prefix requests.
    requests=$((m * 27000 / 6))
    echo "perf/scale.sh: ${m}M pairs ($((6 * requests)) requests)" >&2
    perf/compare.sh "${build[@]}" --repeat "$REPEAT" --workloads shared-prefix \
        --systems "kvix dynamo" --pair 0 --threads "$THREADS" --requests "$requests" \
        --duration "$DURATION" --out "$OUT/size-${m}M"
    build=(--no-build)
    cp "$OUT/size-${m}M/machine.txt" "$OUT/machine.txt"
done
python3 perf/compare.py scale "$OUT" >"$OUT/scale.md"
python3 perf/compare.py scale-series "$OUT" >"$OUT/scale.json"
target/release/kvix-load plot --scale "$OUT/scale.json" --out "$OUT" >/dev/null
cat "$OUT/scale.md"
