//! Command line: the flags of Dynamo's standalone indexer plus kvix's own.
//!
//! Owns parsing and validation of startup configuration only.

use crate::types::DpRank;
use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "kvix",
    version,
    about = "kvix: thread-per-core KV-cache indexer (drop-in for Dynamo's standalone indexer)"
)]
pub struct Args {
    /// HTTP server port
    #[arg(long, env = "KVIX_PORT", default_value_t = 8090)]
    pub port: u16,
    /// Address to bind the HTTP server to
    #[arg(long, env = "KVIX_HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// Number of executor threads (one shard each, pinned); clamped to the cores available
    #[arg(long, env = "KVIX_THREADS", default_value_t = 4)]
    pub threads: usize,
    /// The most shards one index's worker slots (a worker's dp rank in one model and
    /// tenant) spread over (above the shard count: all). A query walks the prompt once in
    /// each shard holding a slot of its index, min(slots, this) walks, and the
    /// index's events are filed by as many cores
    #[arg(long, env = "KVIX_SHARDS_PER_INDEX", default_value_t = 4)]
    pub shards_per_index: usize,
    /// KV cache block size for initial workers registered via --workers
    #[arg(long, env = "KVIX_BLOCK_SIZE")]
    pub block_size: Option<u32>,
    /// Initial workers as `worker_id[:dp_rank]=zmq_address,...` (e.g. `1=tcp://host:5557,1:1=tcp://host:5558`)
    #[arg(long, env = "KVIX_WORKERS")]
    pub workers: Option<String>,
    /// Model name for initial workers registered via --workers
    #[arg(long, env = "KVIX_MODEL_NAME", default_value = "default")]
    pub model_name: String,
    /// Tenant for initial workers registered via --workers
    #[arg(
        long,
        env = "KVIX_TENANT_ID",
        default_value = "default",
        alias = "routing-group"
    )]
    pub tenant_id: String,
    /// Comma-separated peer URLs for P2P recovery (e.g. "http://host1:8090,http://host2:8091")
    #[arg(long, env = "KVIX_PEERS")]
    pub peers: Option<String>,
    /// Number of ZMQ ingest threads (workers are spread over them); 0: one per
    /// executor thread
    #[arg(long, env = "KVIX_INGEST_THREADS", default_value_t = 0)]
    pub ingest_threads: usize,
    /// Microseconds an executor keeps polling after a query or a peer's request
    /// before it may park (0 = park whenever idle: less CPU, slower queries). An
    /// executor whose core another thread wants stops polling until the next query
    #[arg(long, env = "KVIX_SPIN_US", default_value_t = 200)]
    pub spin_us: u64,
    /// Microseconds of time slice an executor's thread asks the kernel for while
    /// requests come, and for at least a second after (Linux 6.12+; 100 to 100000):
    /// a thread sharing its core hands it back sooner when a request waits. 0 = the
    /// kernel's default always
    #[arg(long, env = "KVIX_SLICE_US", default_value_t = 100)]
    pub slice_us: u64,
    /// Capacity of each ingest→shard ring, in ops. ZMQ's queues absorb bursts
    /// upstream; a larger ring only keeps more chunks alive after one
    #[arg(long, env = "KVIX_RING_CAPACITY", default_value_t = 16384)]
    pub ring_capacity: usize,
    /// Local snapshot file: loaded at start (before peers and replay), written on
    /// SIGTERM and every --snapshot-interval
    #[arg(long, env = "KVIX_SNAPSHOT_PATH")]
    pub snapshot_path: Option<std::path::PathBuf>,
    /// Seconds between snapshots (0 = only on SIGTERM)
    #[arg(long, env = "KVIX_SNAPSHOT_INTERVAL", default_value_t = 60.0)]
    pub snapshot_interval: f64,
    /// Milliseconds to wait after connecting ZMQ sockets before fetching a peer's /dump
    #[arg(long, env = "KVIX_PEER_WAIT_MS", default_value_t = 1000)]
    pub peer_wait_ms: u64,
    /// At start, subscribe to the workers the first answering peer lists in /workers
    /// (so a replica given only --peers stays live); false: seed only workers given here
    #[arg(long, env = "KVIX_ADOPT_WORKERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub adopt_workers: bool,
    /// Open HTTP connections per core; beyond it new connections wait in the kernel's
    /// backlog. 0: an eighth of the open-file limit (RLIMIT_NOFILE), shared by the cores
    #[arg(long, env = "KVIX_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,
    /// Engines `/register` accepts in connect mode; past it, 503. 0: what the
    /// open-file limit leaves after HTTP, at two descriptors an engine
    #[arg(long, env = "KVIX_MAX_ENGINES", default_value_t = 0)]
    pub max_engines: usize,
    /// Milliseconds a connection may take, from when it waits for a request (accepted
    /// or its previous response sent), to send that request's headers: bounds slow
    /// headers and idle keep-alive connections
    #[arg(long, env = "KVIX_HEADER_TIMEOUT_MS", default_value_t = 60_000)]
    pub header_timeout_ms: u64,
    /// Milliseconds a client may take to send a request body after its headers
    #[arg(long, env = "KVIX_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    pub body_timeout_ms: u64,
    /// Indexes that events may create by naming a new tenant_id (process-wide);
    /// events beyond it are counted (kvix_event_refusals_total) and skipped
    #[arg(long, env = "KVIX_MAX_EVENT_INDEXES", default_value_t = 256)]
    pub max_event_indexes: usize,
    /// Worker slots per index that events may create by naming a new dp rank
    #[arg(long, env = "KVIX_MAX_EVENT_SLOTS", default_value_t = 1024)]
    pub max_event_slots: usize,
    /// Frames each ZMQ SUB socket buffers before libzmq drops new ones (bounded memory
    /// under overload; drops surface as sequence gaps, counted and replayed)
    #[arg(long, env = "KVIX_ZMQ_RCVHWM", default_value_t = 10_000)]
    pub zmq_rcvhwm: i32,
    /// Largest ZMQ message part accepted from an engine, in bytes: a registered
    /// engine's larger frame is skipped and counted as malformed; on a bound or
    /// replay socket libzmq drops that connection (`ZMQ_MAXMSGSIZE`)
    #[arg(long, env = "KVIX_ZMQ_MAX_MSG_BYTES", default_value_t = crate::ingest::DEFAULT_MAX_MSG_BYTES)]
    pub zmq_max_msg_bytes: u64,
    /// File holding the bearer token (trimmed) that `/register`, `/unregister`,
    /// `/register_peer`, `/deregister_peer`, `/reopen_logs` (and their /conductor forms) require as
    /// `Authorization: Bearer <token>`; unset: those routes are open
    #[arg(long, env = "KVIX_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// File holding the bearer token the read routes (`/query`, `/query_by_hash`,
    /// `/query_tiered_by_hash`, `/speculate`,
    /// `/dump`, `/workers`, `/peers`, `/metrics`) require; the admin token works there
    /// too; unset: reads are open. `/health` and `/ready` are always open
    #[arg(long, env = "KVIX_QUERY_TOKEN_FILE")]
    pub query_token_file: Option<std::path::PathBuf>,
    /// Endpoints `/register` may name, comma-separated: CIDRs or addresses
    /// (`10.0.0.0/8`), host name patterns (`engine-*.svc`; `*` within one label), whole
    /// endpoints (`ipc:///run/engine.sock`); unset: any endpoint
    #[arg(long, env = "KVIX_ALLOW_ENDPOINTS")]
    pub allow_endpoints: Option<String>,
    /// Tokenizer of a model for text queries, as MODEL=PATH (repeatable, or
    /// comma-separated): PATH is a Hugging Face tokenizer.json or a directory holding
    /// one; a tokenizer_config.json (or chat_template.jinja) beside it gives the chat
    /// template for `messages`. Read at start; nothing is downloaded
    #[arg(long, env = "KVIX_TOKENIZER", value_delimiter = ',')]
    pub tokenizer: Vec<String>,
    /// Chunk size, in tokens, of a hybrid model's chunked local attention groups, as
    /// MODEL=TOKENS (repeatable, or comma-separated): vLLM's events do not carry it;
    /// a registration's `attention_chunk_size` overrides it
    #[arg(long, env = "KVIX_ATTENTION_CHUNK_SIZE", value_delimiter = ',')]
    pub attention_chunk_size: Vec<String>,
    /// Alignment, in tokens, of a hybrid model's hits, as MODEL=TOKENS (repeatable, or
    /// comma-separated); unset: the least common multiple of its groups' block sizes;
    /// a registration's `hybrid_align_tokens` overrides it
    #[arg(long, env = "KVIX_HYBRID_ALIGN_TOKENS", value_delimiter = ',')]
    pub hybrid_align_tokens: Vec<String>,
    /// TTL of a `/speculate` prediction when the request names no `ttl_ms`: until
    /// then (or the worker's BlockStored of the block) it scores as held on the device
    #[arg(long, env = "KVIX_SPECULATIVE_TTL_MS", default_value_t = 2000)]
    pub speculative_ttl_ms: u64,
    /// Models whose workers publish no KV events (repeatable, or comma-separated):
    /// their index is fed by `/speculate` alone, with --router-ttl-secs and pruning
    #[arg(long, env = "KVIX_APPROXIMATE", value_delimiter = ',')]
    pub approximate: Vec<String>,
    /// TTL, in seconds, of the predictions of an --approximate model
    #[arg(long, env = "KVIX_ROUTER_TTL_SECS", default_value_t = 120.0)]
    pub router_ttl_secs: f64,
    /// Blocks an --approximate model's index may hold before it is pruned
    #[arg(long, env = "KVIX_ROUTER_MAX_TREE_SIZE", default_value_t = 1 << 20)]
    pub router_max_tree_size: usize,
    /// Fraction of --router-max-tree-size pruning brings the index down to, dropping
    /// the predictions due soonest first
    #[arg(long, env = "KVIX_ROUTER_PRUNE_TARGET_RATIO", default_value_t = 0.8)]
    pub router_prune_target_ratio: f64,
    /// Most live /speculate predictions a model+tenant fed by events holds over every
    /// shard, and most blocks one /speculate predicts: past either the request is
    /// refused (429, 413) and counted (kvix_prediction_refusals_total)
    #[arg(long, env = "KVIX_MAX_PREDICTIONS", default_value_t = crate::shard::DEFAULT_MAX_PREDICTIONS)]
    pub max_predictions: usize,
    /// Most blocks the index holds, over all models and tenants and every shard;
    /// past it the blocks not stored or matched for longest are evicted
    /// (kvix_evicted_blocks_total). Unset: unbounded
    #[arg(long, env = "KVIX_MAX_BLOCKS")]
    pub max_blocks: Option<u64>,
    /// Threads that tokenize text prompts (`prompt`, `messages`), apart from the
    /// executors and the control calls; 0: one per executor
    #[arg(long, env = "KVIX_TOKENIZE_THREADS", default_value_t = 0)]
    pub tokenize_threads: usize,
    /// Text prompts that may wait for a tokenizing thread; beyond them a text query
    /// gets 429
    #[arg(long, env = "KVIX_TOKENIZE_QUEUE", default_value_t = 32)]
    pub tokenize_queue: usize,
    /// Longest text prompt (or rendered chat) tokenized, in characters; longer: 413
    #[arg(long, env = "KVIX_MAX_PROMPT_CHARS", default_value_t = 1 << 20)]
    pub max_prompt_chars: usize,
    /// Most token ids a text prompt may encode to; more: 413
    #[arg(long, env = "KVIX_MAX_PROMPT_TOKENS", default_value_t = 1 << 18)]
    pub max_prompt_tokens: usize,
    /// Largest peer /dump read at start, in bytes; a larger one is abandoned (counted,
    /// logged) and the next peer tried
    #[arg(long, env = "KVIX_MAX_PEER_DUMP_BYTES", default_value_t = 8 << 30)]
    pub max_peer_dump_bytes: u64,
    /// Most blocks taken from one peer's /dump; more: the dump is abandoned
    #[arg(long, env = "KVIX_MAX_PEER_DUMP_BLOCKS", default_value_t = 50_000_000)]
    pub max_peer_dump_blocks: u64,
    /// Milliseconds an executor may go without running its heartbeat before /ready
    /// answers 503 (and systemd's watchdog is not fed): a stalled core shows
    #[arg(long, env = "KVIX_STALL_TIMEOUT_MS", default_value_t = 1000)]
    pub stall_timeout_ms: u64,
    /// Bind a SUB socket here for engines' publishers to connect to (llm-d's
    /// centralized delivery; repeatable or comma-separated, e.g. `tcp://*:5557`):
    /// topics `kv@<pod>@<model>` name the pod and model; pods appear on their first
    /// message. Needs --block-size (a model's existing index keeps its own)
    #[arg(long, env = "KVIX_ZMQ_BIND", value_delimiter = ',')]
    pub zmq_bind: Vec<String>,
    /// Access log file: one JSON line per HTTP request (ts, trace_id, method, path,
    /// model, status, duration_ms), written off the executors; `/metrics` is not
    /// logged. `POST /reopen_logs` reopens it (logrotate)
    #[arg(long, env = "KVIX_ACCESS_LOG")]
    pub access_log: Option<std::path::PathBuf>,
    /// Request header whose value is the access log's `trace_id` (`-` without one)
    #[arg(long, env = "KVIX_TRACE_ID_HEADER", default_value = "x-trace-id")]
    pub trace_id_header: String,
    /// Access log timestamps in local time with its UTC offset instead of UTC
    #[arg(long, env = "KVIX_ACCESS_LOG_LOCAL_TIME")]
    pub access_log_local_time: bool,
    /// Port of the slot tracker (Dynamo's standalone slot-tracker API: request
    /// loads per worker), served by the same executors on --host; unset: off
    #[arg(long, env = "KVIX_SLOT_TRACKER_PORT")]
    pub slot_tracker_port: Option<u16>,
    /// Seconds a request booked on the slot tracker (`/add`) and never freed is
    /// tracked; then it is freed and counted (kvix_slot_requests_expired_total)
    #[arg(long, env = "KVIX_SLOT_REQUEST_TTL_SECS", default_value_t = 300.0)]
    pub slot_request_ttl_secs: f64,
    /// Largest request body the slot tracker takes, in bytes (Dynamo's limit);
    /// larger ones are refused with 413
    #[arg(long, env = "KVIX_SLOT_MAX_BODY_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub slot_max_body_bytes: usize,
    /// Most sequence hashes one slot-tracker /add may book; more is refused with
    /// 413 (kvix_slot_refused_total)
    #[arg(long, env = "KVIX_SLOT_MAX_BOOKING_BLOCKS", default_value_t = 131_072)]
    pub slot_max_booking_blocks: usize,
    /// Most active decode blocks one worker rank may hold on the slot tracker; an
    /// /add beyond is refused with 429 (kvix_slot_refused_total)
    #[arg(long, env = "KVIX_SLOT_MAX_RANK_BLOCKS", default_value_t = 1_048_576)]
    pub slot_max_rank_blocks: usize,
    /// Most requests booked and not freed per slot tracker (model, routing
    /// group); an /add beyond is refused with 429 (kvix_slot_refused_total)
    #[arg(long, env = "KVIX_SLOT_MAX_BOOKINGS", default_value_t = 65_536)]
    pub slot_max_bookings: usize,
    /// Most blocks the booked requests' paths of one slot tracker may name
    /// together (what its bookings keep in memory); an /add beyond is refused with
    /// 429 (kvix_slot_refused_total)
    #[arg(
        long,
        env = "KVIX_SLOT_MAX_TRACKER_BLOCKS",
        default_value_t = 16_777_216
    )]
    pub slot_max_tracker_blocks: usize,
    /// Engine streams ((instance, dp rank) pairs heard) up to which /metrics has
    /// per-worker series (kvix_listener_last_sequence); above, none, so that a
    /// fleet's scrape does not grow with it (/workers lists every worker)
    #[arg(long, env = "KVIX_METRICS_MAX_WORKERS", default_value_t = 1024)]
    pub metrics_max_workers: usize,
    /// Registered worker ranks (over every slot tracker) up to which /metrics
    /// has per-rank kvix_slot_* series; above, per-tracker series only
    #[arg(long, env = "KVIX_SLOT_METRICS_MAX_RANKS", default_value_t = 1024)]
    pub slot_metrics_max_ranks: usize,
    /// Port of a ZMQ PUB socket (on --host) on which the slot tracker shares each
    /// /add, /prefill_complete and /free with its replicas, in Dynamo's
    /// replica-sync format (topic `dynamo.slot-tracker.v1`)
    #[arg(long, env = "KVIX_SLOT_SYNC_PORT")]
    pub slot_sync_port: Option<u16>,
    /// ZMQ endpoints of the other replicas' --slot-sync-port (kvix's or Dynamo's
    /// --replica-sync-port), comma-separated: what they share is applied here
    #[arg(long, env = "KVIX_SLOT_SYNC_PEERS", value_delimiter = ',')]
    pub slot_sync_peers: Vec<String>,
    /// Log format on stderr: `text` or `json` (one JSON object per line)
    #[arg(long, env = "KVIX_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// One `--workers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Dynamo's integer instance id.
    pub instance: u64,
    pub dp: DpRank,
    pub endpoint: String,
}

/// Parse `"id[:dp]=endpoint,..."`; empty entries are skipped.
pub fn parse_workers(s: &str) -> Result<Vec<WorkerSpec>, String> {
    let mut out = Vec::new();
    for entry in s.split(',').filter(|e| !e.trim().is_empty()) {
        let (left, endpoint) = entry.split_once('=').ok_or_else(|| {
            format!("invalid worker entry `{entry}`; expected worker_id[:dp_rank]=endpoint")
        })?;
        let left = left.trim();
        let (id, dp) = match left.split_once(':') {
            Some((id, dp)) => (
                id.parse()
                    .map_err(|e| format!("invalid worker id in `{entry}`: {e}"))?,
                dp.parse()
                    .map_err(|e| format!("invalid dp_rank in `{entry}`: {e}"))?,
            ),
            None => (
                left.parse()
                    .map_err(|e| format!("invalid worker id in `{entry}`: {e}"))?,
                0,
            ),
        };
        let endpoint = endpoint.trim().to_string();
        crate::ingest::endpoint::validate(&endpoint)?;
        out.push(WorkerSpec {
            instance: id,
            dp,
            endpoint,
        });
    }
    Ok(out)
}

/// Parse `--peers`: comma-separated URLs, empty pieces dropped.
pub fn parse_peers(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_parse_like_dynamo() {
        let w = parse_workers("1=tcp://host:5557, 2:1=tcp://host:5558,,").unwrap();
        assert_eq!(
            w,
            vec![
                WorkerSpec {
                    instance: 1,
                    dp: 0,
                    endpoint: "tcp://host:5557".into()
                },
                WorkerSpec {
                    instance: 2,
                    dp: 1,
                    endpoint: "tcp://host:5558".into()
                },
            ]
        );
        assert!(
            parse_workers("1tcp://x:1")
                .unwrap_err()
                .contains("expected worker_id")
        );
        assert!(
            parse_workers("x=tcp://x:1")
                .unwrap_err()
                .contains("invalid worker id")
        );
        assert!(
            parse_workers("1:y=tcp://x:1")
                .unwrap_err()
                .contains("invalid dp_rank")
        );
        assert!(
            parse_workers("1=tcp://x")
                .unwrap_err()
                .contains("missing TCP port")
        );
        assert!(
            parse_workers("1=udp://x:1")
                .unwrap_err()
                .contains("unsupported scheme")
        );
    }

    /// README's flag table is the operator's reference: every flag `--help` lists
    /// has a row, and a row's default is the flag's (in backticks at the start of the
    /// cell; `—` for a flag with none, `off` for a switch).
    #[test]
    fn every_flag_is_in_readmes_table_with_its_default() {
        use clap::CommandFactory;
        let readme = include_str!("../README.md");
        let rows: std::collections::HashMap<&str, &str> = readme
            .lines()
            .filter(|l| l.starts_with("| `--"))
            .filter_map(|l| {
                let mut cells = l.split('|').map(str::trim).skip(1);
                Some((cells.next()?.trim_matches('`'), cells.next()?))
            })
            .collect();
        let mut wrong = Vec::new();
        for a in Args::command().get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if a.is_hide_set() || long == "help" || long == "version" {
                continue;
            }
            let flag = format!("--{long}");
            let default = a
                .get_default_values()
                .first()
                .map(|v| v.to_string_lossy().into_owned());
            match (rows.get(flag.as_str()), default) {
                (None, _) => wrong.push(format!("{flag}: no row")),
                (Some(cell), Some(d)) if !cell.starts_with(&format!("`{d}`")) => {
                    wrong.push(format!("{flag}: default `{d}`, README says {cell}"))
                }
                // A switch (no value) is off unless given.
                (Some(cell), None)
                    if !a.get_action().takes_values() && !cell.starts_with("off") =>
                {
                    wrong.push(format!("{flag}: a switch, README says {cell}"))
                }
                (Some(cell), None) if a.get_action().takes_values() && !cell.starts_with('—') => {
                    wrong.push(format!("{flag}: no default, README says {cell}"))
                }
                _ => {}
            }
        }
        assert!(
            wrong.is_empty(),
            "README's flag table:\n{}",
            wrong.join("\n")
        );
    }
}
