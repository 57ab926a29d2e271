#!/usr/bin/env bash
# Seed the fuzz corpora, tests/fuzz/corpus/<target>/ (gitignored), from the
# repository: wire fixtures, a snapshot image, /dump and /workers documents, --workers
# strings, and the HTTP request bodies of README.md and the tests (tests/**/*.rs).
# The `seed` binary is built by cargo-fuzz with the targets' own flags (FUZZ_SANITIZER
# as for scripts/fuzz.sh), so it shares their build instead of compiling kvix a second
# time. Existing corpus files are kept.
# Needs cargo-fuzz; sanitizer flags are unstable, hence RUSTC_BOOTSTRAP=1 on stable.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RUSTC_BOOTSTRAP=1
# shellcheck source=tests/fuzz/build_flags.sh
. tests/fuzz/build_flags.sh
cargo fuzz build "${FUZZ_BUILD_FLAGS[@]}" seed
triple=$(rustc -vV | sed -n 's/^host: //p')
"$FUZZ_TARGET_DIR/$triple/release/seed" . tests/fuzz/corpus
