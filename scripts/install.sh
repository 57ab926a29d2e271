#!/usr/bin/env bash
# Build kvix in release mode and install it as a systemd service.
# Usage: sudo scripts/install.sh [extra kvix flags...]
# Flags go to /etc/default/kvix as KVIX_ARGS; edit that file and
# `systemctl restart kvix` to change them later.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin kvix
install -m 0755 target/release/kvix /usr/local/bin/kvix
install -m 0644 scripts/kvix.service /etc/systemd/system/kvix.service
if [ ! -f /etc/default/kvix ]; then
    echo "KVIX_ARGS=\"--port 8090 ${*:-}\"" > /etc/default/kvix
fi
systemctl daemon-reload
systemctl enable --now kvix
systemctl --no-pager status kvix
