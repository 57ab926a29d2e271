#!/usr/bin/env bash
# Seed the fuzz corpora, tests/fuzz/corpus/<target>/ (gitignored), from the
# repository: wire fixtures, a snapshot image, /dump documents, --workers strings.
# The `seed` binary is built by cargo-fuzz with the targets' own flags, so it shares
# their build instead of compiling kvix a second time. Existing corpus files are kept.
# Needs cargo-fuzz; sanitizer flags are unstable, hence RUSTC_BOOTSTRAP=1 on stable.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RUSTC_BOOTSTRAP=1
cargo fuzz build --fuzz-dir tests/fuzz seed
triple=$(rustc -vV | sed -n 's/^host: //p')
"tests/fuzz/target/$triple/release/seed" . tests/fuzz/corpus
