#!/usr/bin/env bash
# Scale-down cost: a fresh kvix holding a workload's index, then every worker
# unregistered one call after another (as a router does when a pool shrinks). Prints
# the time the calls took, the time until the shards hold no block, the CPU the
# executors spent meanwhile (from /proc/PID/task/*/schedstat), and how a router's
# queries fared meanwhile: one keep-alive connection sending /query back to back
# from the first call until no block is left (the slowest answer, and how many).
#
#   perf/unregister.sh [--threads N] [trace|shared-prefix]
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
pick_trace
THREADS=1
WORKLOAD=trace
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) THREADS="$2"; shift 2 ;;
        trace|shared-prefix) WORKLOAD="$1"; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
# NO_BUILD=1: use the binaries in $BIN (default target/release) as they are.
if [ "${NO_BUILD:-0}" = 1 ]; then BIN=${BIN:-target/release}; else build_release; fi
start_server "$BIN/kvix" --threads "$THREADS"
read -r -a WL <<<"$(workload_args "$WORKLOAD")"
read -r -a EV <<<"$(worker_args "$WORKLOAD")"
"$BIN/kvix-load" events --url "http://127.0.0.1:$PORT" --quiet "${WL[@]}" "${EV[@]}" \
    --keep --pid "$PID" >/dev/null
python3 - "$PORT" "$PID" "$WORKLOAD" "$THREADS" <<'PY'
import glob, http.client, json, sys, threading, time, urllib.request

port, pid, workload, threads = sys.argv[1:]
url = f"http://127.0.0.1:{port}"

def executor_ms():
    ns = 0
    for task in glob.glob(f"/proc/{pid}/task/*"):
        if open(task + "/comm").read().startswith("kvix-core"):
            ns += int(open(task + "/schedstat").read().split()[0])
    return ns / 1e6

def blocks():
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("kvix_shard_blocks"))

def probe(start, stop, waits):
    conn = http.client.HTTPConnection("127.0.0.1", int(port))
    body = json.dumps({"token_ids": list(range(1024)), "model_name": "kvix-load"})
    while not stop.is_set():
        t = time.monotonic()
        conn.request("POST", "/query", body, {"Content-Type": "application/json"})
        conn.getresponse().read()
        if start.is_set():
            waits.append(time.monotonic() - t)

instances = sorted({w["instance_id"] for w in json.load(urllib.request.urlopen(url + "/workers"))})
start, stop, waits = threading.Event(), threading.Event(), []
prober = threading.Thread(target=probe, args=(start, stop, waits))
prober.start()
time.sleep(0.2)
start.set()
before, cpu0, t0 = blocks(), executor_ms(), time.monotonic()
for i in instances:
    body = json.dumps({"instance_id": i, "model_name": "kvix-load"}).encode()
    req = urllib.request.Request(url + "/unregister", body, {"Content-Type": "application/json"})
    urllib.request.urlopen(req).read()
calls = time.monotonic() - t0
while blocks() > 0 and time.monotonic() - t0 < 120:
    time.sleep(0.01)
gone = time.monotonic() - t0
cpu = executor_ms() - cpu0
stop.set()
prober.join()
print(f"{workload} --threads {threads}: {len(instances)} workers, {before:.0f} blocks: "
      f"calls {calls * 1e3:.0f} ms, no block left after {gone * 1e3:.0f} ms, "
      f"executor CPU {cpu:.0f} ms, /query meanwhile: {len(waits)}, "
      f"slowest {max(waits) * 1e3:.1f} ms")
PY
