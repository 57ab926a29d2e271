# Shared by the perf/ scripts (sourced, not run): their options, the trace fallback,
# the release build, the machine description and small server helpers.

# parse_options "NAME..." "$@": each `--some-name VALUE` whose SOME_NAME is one of
# the NAMEs sets that variable (NAME=VAR: sets VAR instead). `--no-build` (NAME
# NO_BUILD) sets BUILD=0, and `--quick` (NAME QUICK) calls the script's own quick().
# Anything else exits 2.
parse_options() {
    local names=$1 name entry var
    shift
    while [ $# -gt 0 ]; do
        name=${1#--}
        name=${name//-/_}
        name=${name^^}
        var=""
        for entry in $names; do
            [ "${entry%%=*}" = "$name" ] && var=${entry#*=}
        done
        if [[ $1 != --* || -z $var ]]; then
            echo "unknown argument $1" >&2
            exit 2
        fi
        case "$name" in
            NO_BUILD) BUILD=0; shift ;;
            QUICK) quick; shift ;;
            *)
                [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
                printf -v "$var" '%s' "$2"
                shift 2
                ;;
        esac
    done
}

# log_to NAME: from here on stderr goes to $OUT/NAME.log ($OUT made), the terminal
# stays on fd 3 for say, which writes to both.
log_to() {
    mkdir -p "$OUT"
    exec 3>&2 2>"$OUT/$1.log"
}
say() { echo "perf/$(basename "$0"): $*" >&3; echo "== $*" >&2; }

# $TRACE, by default the shared Mooncake trace; when that file is absent, the
# 500-request head kept in tests/data.
pick_trace() {
    TRACE="${TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}"
    [ -f "$TRACE" ] || TRACE=tests/data/mooncake_trace_head500.jsonl
}

build_release() {
    cargo build --release --workspace --bin kvix --bin kvix-load --bin kvix-hello
    BIN=target/release
}

# describe_machine FILE EXTRA: what the figures were measured on.
describe_machine() {
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
        echo "nproc: $(nproc)"
        echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p')"
        echo "kernel: $(uname -r)"
        echo "$2"
    } >"$1"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_indexer SYSTEM THREADS LOG: a fresh kvix ($BIN, with $KVIX_ARGS) or dynamo-peer
# ($PEER_BIN) on a free port, answering /health; sets PID and PORT.
start_indexer() {
    PORT=$(free_port)
    case "$1" in
        kvix) "$BIN/kvix" --host 127.0.0.1 --port "$PORT" --threads "$2" ${KVIX_ARGS:-} 2>"$3" & ;;
        dynamo) "$PEER_BIN/dynamo-peer" --port "$PORT" --threads "$2" --runtime-threads "$2" \
            2>"$3" & ;;
    esac
    PID=$!
    wait_health "$PORT" || { echo "$1 did not answer /health" >&2; exit 1; }
}

# start_server EXE ARGS...: EXE on a free loopback port with ARGS (its log dropped),
# answering /health and killed when the script exits; sets PID and PORT.
start_server() {
    PORT=$(free_port)
    "$1" --host 127.0.0.1 --port "$PORT" "${@:2}" 2>/dev/null &
    PID=$!
    trap 'kill $PID 2>/dev/null; wait 2>/dev/null || true' EXIT
    wait_health "$PORT"
}

wait_health() {
    for _ in $(seq 200); do curl -fs "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.05; done
    return 1
}

# The request list of a workload (events and queries alike; $REQUESTS, default 6000,
# is the trace's count and a sixth of shared-prefix's), and its event-phase workers:
# what perf/compare.sh and perf/unregister.sh load.
workload_args() { # workload_args WORKLOAD
    case "$1" in
        trace) echo --workload trace --trace "$TRACE" --requests "${REQUESTS:-6000}" ;;
        shared-prefix) echo --workload shared-prefix --requests $((6 * ${REQUESTS:-6000})) ;;
    esac
}
worker_args() { # worker_args WORKLOAD
    local wire=(--batch-dp-rank --shared-engine-hashes)
    case "$1" in
        trace) echo --workers-count 16 --policy prefix-affinity "${wire[@]}" ;;
        shared-prefix) echo --workers-count 64 --policy random "${wire[@]}" ;;
    esac
}
