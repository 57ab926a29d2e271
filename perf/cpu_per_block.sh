#!/usr/bin/env bash
# Server CPU per stored block, thread by thread: a fresh kvix, one event load of a
# compare.sh workload (kept, so no unregistration runs), and each thread's
# utime+stime (from /proc/PID/task/*/stat) divided by the blocks stored. Run it
# alternately against two builds: the rate is noisy on a shared box, a thread's CPU
# per block much less.
#
#   perf/cpu_per_block.sh [--bin DIR] [trace|shared-prefix] [other kvix flags]
#
# Prints the rate and `thread:ns` per busy thread. libzmq's I/O thread inherits the
# name of the ingest thread that made it: it is the `ingest` entry with less CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
pick_trace
# The load tool always comes from this tree's release build; --bin DIR takes the
# server from DIR instead (a copy of another build's target/release/kvix).
build_release >/dev/null
SERVER_BIN=$BIN
if [ "${1:-}" = --bin ]; then
    SERVER_BIN=$2
    shift 2
fi
WORKLOAD=${1:-trace}
shift || true
start_server "$SERVER_BIN/kvix" "$@"
read -r -a wl <<<"$(workload_args "$WORKLOAD")"
read -r -a ev <<<"$(worker_args "$WORKLOAD")"
OUT=$(mktemp -d)
snap() { for t in /proc/$PID/task/*; do echo "$(basename "$t") $(awk '{print $14 + $15}' "$t/stat") $(cat "$t/comm")"; done; }
snap >"$OUT/before"
"$BIN/kvix-load" events --url "http://127.0.0.1:$PORT" --quiet --json "${wl[@]}" "${ev[@]}" \
    --pid "$PID" --keep >"$OUT/events.json"
snap >"$OUT/after"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
e = json.load(open(os.path.join(out, "events.json")))["events"]
blocks = e["sim"]["blocks_stored"]
tick_ns = 1e9 / os.sysconf("SC_CLK_TCK")
def read(name):
    return {t: (int(c), n) for t, c, n in (l.split(None, 2) for l in open(os.path.join(out, name)))}
a, z = read("before"), read("after")
rows = sorted(((c - a.get(t, (0, ""))[0]) * tick_ns / blocks, n.strip().removeprefix("kvix-"))
              for t, (c, n) in z.items())
print("%.2fM blocks/s" % (e["blocks_applied_per_sec"] / 1e6),
      " ".join("%s:%.0f" % (n, ns) for ns, n in reversed(rows) if ns >= 2), "ns/block")
PY
rm -rf "$OUT"
