# Sourced by scripts/fuzz.sh and seed_corpus.sh (run from the repository root): the
# cargo-fuzz flags every build and run of the targets shares, so the `seed` binary,
# the targets and their runs use one build. Sets FUZZ_BUILD_FLAGS from FUZZ_SANITIZER
# (address, the default, or none) and FUZZ_TARGET_DIR; changes nothing else.
# shellcheck shell=bash
FUZZ_SANITIZER=${FUZZ_SANITIZER:-address}
FUZZ_TARGET_DIR=$PWD/tests/fuzz/target
if [ "$FUZZ_SANITIZER" != address ]; then
    # Another RUSTFLAGS set: a directory of its own, or each switch rebuilds all.
    FUZZ_TARGET_DIR=$PWD/tests/fuzz/target/sanitizer-$FUZZ_SANITIZER
fi
# shellcheck disable=SC2034 # used by the scripts that source this
FUZZ_BUILD_FLAGS=(--fuzz-dir tests/fuzz --sanitizer "$FUZZ_SANITIZER"
    --target-dir "$FUZZ_TARGET_DIR")
