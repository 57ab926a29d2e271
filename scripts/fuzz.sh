#!/usr/bin/env bash
# Fuzz every decoder (the cargo-fuzz package in tests/fuzz) for a bounded time each:
# installs cargo-fuzz if missing, seeds the corpora, runs the targets one after the
# other, prints how many inputs each executed, and fails if any target finds a crash
# (the input is then in tests/fuzz/artifacts/<target>/; logs are beside it).
#
# Usage: scripts/fuzz.sh [--sanitizer address|none] [SECONDS_PER_TARGET | --ci] [TARGET...]
#   SECONDS_PER_TARGET defaults to 60, --ci is 20; no TARGET means every target.
#   --sanitizer none (or FUZZ_SANITIZER=none) builds without AddressSanitizer: a
#   cheaper build and faster runs. kvix's decoders are safe Rust except two token-id
#   paths: /query's (atoi_simd, unsafe inside, and the AVX2 window reads in
#   http/token_ids.rs) and the events' AVX2 pairs (raw reads in wire/msgpack.rs):
#   fuzz api_query and decode with the default sanitizer too. A
#   panic is caught either way. Each sanitizer builds in its own
#   target directory, so switching does not rebuild the other's.
#   FUZZ_ARGS adds libFuzzer flags, e.g. FUZZ_ARGS=-runs=10000000 with a long time.
# Runs on the stable toolchain: sanitizer flags are unstable, hence RUSTC_BOOTSTRAP=1.
# Set CARGO_BUILD_JOBS to share the machine while the targets build.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(decode workers_flag dump_import snapshot_load api_control api_query workers_import)
usage() {
    echo "usage: $0 [--sanitizer address|none] [SECONDS_PER_TARGET | --ci] [TARGET...];" \
        "targets: ${TARGETS[*]}" >&2
    exit 2
}
sanitizer=${FUZZ_SANITIZER:-address}
if [ "${1:-}" = --sanitizer ]; then
    [ "$#" -ge 2 ] || usage
    sanitizer=$2 && shift 2
fi
case "$sanitizer" in
    address | none) ;;
    *) usage ;;
esac
export FUZZ_SANITIZER=$sanitizer
secs=60
case "${1:-}" in
    --ci) secs=20 && shift ;;
    "" | *[!0-9]*) ;; # targets, checked below
    [1-9]*) secs=$1 && shift ;;
    *) usage ;;
esac
if [ "$#" -gt 0 ]; then
    for t in "$@"; do
        [[ " ${TARGETS[*]} " == *" $t "* ]] || usage
    done
    TARGETS=("$@")
fi

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# shellcheck source=tests/fuzz/build_flags.sh
. tests/fuzz/build_flags.sh

start=$SECONDS
cargo fuzz build "${FUZZ_BUILD_FLAGS[@]}"
echo "built ($sanitizer) in $((SECONDS - start)) s"
tests/fuzz/seed_corpus.sh

failed=()
for t in "${TARGETS[@]}"; do
    mkdir -p "tests/fuzz/artifacts/$t"
    log="tests/fuzz/artifacts/$t.log"
    args=(-max_total_time="$secs" -print_final_stats=1
        # A slow input is a finding too; libFuzzer's default would never fire here.
        -timeout=10)
    # shellcheck disable=SC2206 # FUZZ_ARGS is a list of flags
    args+=(${FUZZ_ARGS:-})
    if [ -f "tests/fuzz/dicts/$t.dict" ]; then
        args+=(-dict="tests/fuzz/dicts/$t.dict")
    fi
    echo "== $t: ${secs} s ($sanitizer)"
    rc=0
    cargo fuzz run "${FUZZ_BUILD_FLAGS[@]}" "$t" -- "${args[@]}" >"$log" 2>&1 || rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    corpus=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    echo "$t: ${runs:-?} inputs executed, corpus $corpus files, exit $rc (log: $log)"
    if [ "$rc" -ne 0 ]; then
        grep -E '^(==[0-9]+==ERROR|thread .* panicked|SUMMARY|artifact_prefix|Test unit written)' "$log" || tail -n 30 "$log"
        failed+=("$t")
    fi
done

echo "total $((SECONDS - start)) s"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FINDINGS in: ${failed[*]} (inputs in tests/fuzz/artifacts/<target>/)" >&2
    exit 1
fi
echo "no findings"
