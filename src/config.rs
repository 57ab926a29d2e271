//! The command line turned into the service's configuration: every numeric flag
//! clamped to what works (saying so), every flag that cannot mean anything refused
//! with a message, and the options each part of the service starts with.
//!
//! Owns no state and starts nothing: `startup.rs` calls these, then starts
//! the service.

use crate::app::{Config, SnapshotConfig};
use crate::cli::Args;
use crate::descriptors::{Descriptors, raise_open_file_limit};
use crate::runtime::ServeOptions;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Clamp a numeric flag into `[lo, hi]`, saying so when it moves.
pub fn clamp<T: PartialOrd + Copy + std::fmt::Display>(flag: &str, v: T, lo: T, hi: T) -> T {
    let c = if v < lo {
        lo
    } else if v > hi {
        hi
    } else {
        v
    };
    if c != v {
        tracing::warn!("--{flag} {v} is outside [{lo}, {hi}]; using {c}");
    }
    c
}

/// Tokens and the endpoint allow list, read once at start.
pub fn load_access(args: &Args) -> Result<crate::access::Access, String> {
    use crate::access::{Access, AllowList, Token};
    let load = |flag: &str, path: &Option<std::path::PathBuf>| {
        path.as_deref()
            .map(Token::load)
            .transpose()
            .map_err(|e| format!("--{flag}: {e}"))
    };
    let access = Access {
        admin: load("admin-token-file", &args.admin_token_file)?,
        query: load("query-token-file", &args.query_token_file)?,
        allow: args
            .allow_endpoints
            .as_deref()
            .map(AllowList::parse)
            .transpose()
            .map_err(|e| format!("--allow-endpoints: {e}"))?,
    };
    if access.query.is_some() && access.admin.is_none() {
        tracing::warn!(
            "--query-token-file without --admin-token-file: reads need a token, but \
             /register and the other admin routes are open"
        );
    }
    for (flag, path) in [
        ("admin-token-file", &args.admin_token_file),
        ("query-token-file", &args.query_token_file),
    ] {
        use std::os::unix::fs::PermissionsExt;
        if let Some(p) = path
            && let Ok(m) = std::fs::metadata(p)
            && m.permissions().mode() & 0o004 != 0
        {
            tracing::warn!(
                "--{flag} {}: the token file is readable by everyone",
                p.display()
            );
        }
    }
    tracing::info!(
        admin_token = access.admin.is_some(),
        query_token = access.query.is_some(),
        allow_endpoints = access.allow.is_some(),
        "access rules"
    );
    Ok(access)
}

/// The access log of `--access-log`, opened and its writer started.
fn access_log(args: &Args) -> Result<Option<Arc<crate::access_log::AccessLog>>, String> {
    let Some(path) = args.access_log.clone() else {
        return Ok(None);
    };
    let trace_header = args
        .trace_id_header
        .parse()
        .map_err(|e| format!("--trace-id-header {:?}: {e}", args.trace_id_header))?;
    crate::access_log::AccessLog::start(crate::access_log::Settings {
        path,
        trace_header,
        local_time: args.access_log_local_time,
    })
    .map(Some)
}

/// `(shards, cores)`: `--threads`, at most one shard per CPU this process may run on.
pub fn shard_count(args: &Args) -> Result<(usize, usize), String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if args.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    let shards = args.threads.min(cores);
    if shards < args.threads {
        tracing::warn!(
            "--threads {} is above the {cores} CPUs this process may run on; using {shards}",
            args.threads
        );
    }
    Ok((shards, cores))
}

/// The flags that are wrong whatever they are combined with.
pub fn check_flags(args: &Args, workers: &[crate::cli::WorkerSpec]) -> Result<(), String> {
    if args.block_size == Some(0) {
        return Err("--block-size must be positive".into());
    }
    if !workers.is_empty() && args.block_size.is_none() {
        return Err("--block-size is required when --workers is specified".into());
    }
    if !args.zmq_bind.is_empty() && args.block_size.is_none() {
        return Err("--block-size is required when --zmq-bind is specified".into());
    }
    for ep in &args.zmq_bind {
        crate::ingest::endpoint::validate(ep).map_err(|e| format!("--zmq-bind: {e}"))?;
    }
    if !args.slot_request_ttl_secs.is_finite() || args.slot_request_ttl_secs <= 0.0 {
        return Err("--slot-request-ttl-secs must be a number of seconds > 0".into());
    }
    if args
        .slot_tracker_port
        .is_some_and(|p| p == args.port && p != 0)
    {
        return Err("--slot-tracker-port must differ from --port".into());
    }
    if !args.snapshot_interval.is_finite() || args.snapshot_interval < 0.0 {
        return Err("--snapshot-interval must be a number of seconds ≥ 0".into());
    }
    Ok(())
}

/// The service's configuration: every numeric flag clamped to what works.
pub fn config(
    args: &Args,
    shards: usize,
    cores: usize,
    prompts: crate::prompt::Prompts,
) -> Result<Config, String> {
    // Each snapshot walks the whole index: a near-zero interval would write back to
    // back. Zero keeps its meaning (only on SIGTERM).
    let interval = match args.snapshot_interval {
        0.0 => 0.0,
        s => clamp("snapshot-interval", s, 0.1, 1e9),
    };
    let snapshot = args.snapshot_path.clone().map(|path| SnapshotConfig {
        path,
        interval: Duration::from_secs_f64(interval),
    });
    // Decoding is the serial stage of the event path: one ingest thread per executor
    // applied 1.6-1.8x the blocks/s of a single one on 2 cores (BENCHMARKS.md).
    let ingest_threads = match args.ingest_threads {
        0 => shards,
        n => clamp("ingest-threads", n, 1, (4 * cores).min(64)),
    };
    let descriptors = Descriptors::plan(
        raise_open_file_limit(),
        shards,
        ingest_threads,
        // Each connection holds a descriptor: beyond a million per core the open-file
        // limit refuses them anyway.
        match args.max_connections {
            0 => 0,
            n => clamp("max-connections", n, 1, 1 << 20),
        },
        args.max_engines,
    );
    if !args.router_prune_target_ratio.is_finite() {
        return Err("--router-prune-target-ratio must be a number in [0, 1]".into());
    }
    Ok(Config {
        shards,
        // Above the shard count it means every shard (`Partition::new` caps it).
        shards_per_index: clamp("shards-per-index", args.shards_per_index, 1, usize::MAX),
        ingest_threads,
        ring_capacity: clamp("ring-capacity", args.ring_capacity, 256, 1 << 24),
        snapshot,
        hybrid: hybrid_defaults(args)?,
        event_limits: crate::registry::EventLimits {
            indexes: args.max_event_indexes,
            slots: clamp("max-event-slots", args.max_event_slots, 1, 1 << 20),
        },
        sockets: crate::ingest::SocketOptions {
            rcvhwm: clamp("zmq-rcvhwm", args.zmq_rcvhwm, 16, 10_000_000),
            // Below a few KiB no real batch fits; above 1 TiB is no limit at all.
            max_msg_bytes: clamp("zmq-max-msg-bytes", args.zmq_max_msg_bytes, 4096, 1 << 40) as i64,
            max_engines: descriptors.engines,
        },
        descriptors,
        metrics_max_workers: args.metrics_max_workers,
        prompts: Arc::new(prompts),
        speculation: speculation(args),
        // Each shard keeps at least one block, so fewer than one a shard cannot hold.
        max_blocks: args
            .max_blocks
            .map(|n| clamp("max-blocks", n, shards as u64, u64::MAX)),
        tokenize: tokenize_limits(args, shards, cores),
        stall_after: Duration::from_millis(clamp(
            "stall-timeout-ms",
            args.stall_timeout_ms,
            50,
            3_600_000,
        )),
        access_log: access_log(args)?,
    })
}

/// The tokenizing pool's size and caps from the flags.
fn tokenize_limits(args: &Args, shards: usize, cores: usize) -> crate::tokenize::Limits {
    crate::tokenize::Limits {
        threads: match args.tokenize_threads {
            0 => shards,
            n => clamp("tokenize-threads", n, 1, (4 * cores).min(256)),
        },
        queue: clamp("tokenize-queue", args.tokenize_queue, 1, 1 << 16),
        caps: crate::prompt::Caps {
            max_chars: clamp("max-prompt-chars", args.max_prompt_chars, 1, usize::MAX),
            max_tokens: clamp("max-prompt-tokens", args.max_prompt_tokens, 1, usize::MAX),
        },
    }
}

/// How `/speculate`'s predictions and `--approximate` indexes live.
/// `--attention-chunk-size` and `--hybrid-align-tokens`, per model.
fn hybrid_defaults(args: &Args) -> Result<Vec<(String, crate::registry::HybridDefaults)>, String> {
    let mut out: Vec<(String, crate::registry::HybridDefaults)> = Vec::new();
    let flags = [
        ("attention-chunk-size", &args.attention_chunk_size),
        ("hybrid-align-tokens", &args.hybrid_align_tokens),
    ];
    for (k, (flag, values)) in flags.into_iter().enumerate() {
        for v in values {
            let parsed = v
                .rsplit_once('=')
                .and_then(|(m, t)| Some((m, t.trim().parse::<u32>().ok()?)))
                .filter(|(m, t)| !m.is_empty() && *t > 0);
            let Some((model, tokens)) = parsed else {
                return Err(format!("--{flag} {v}: expected MODEL=TOKENS (TOKENS > 0)"));
            };
            let at = match out.iter().position(|(m, _)| m == model) {
                Some(i) => i,
                None => {
                    out.push((model.to_string(), Default::default()));
                    out.len() - 1
                }
            };
            let d = &mut out[at].1;
            if k == 0 {
                d.attention_chunk_size = Some(tokens);
            } else {
                d.hybrid_align_tokens = Some(tokens);
            }
        }
    }
    Ok(out)
}

fn speculation(args: &Args) -> crate::app::Speculation {
    crate::app::Speculation {
        ttl: Duration::from_millis(clamp(
            "speculative-ttl-ms",
            args.speculative_ttl_ms,
            1,
            3_600_000,
        )),
        approximate: args
            .approximate
            .iter()
            .filter(|m| !m.is_empty())
            .cloned()
            .collect(),
        router_ttl: Duration::from_secs_f64(clamp(
            "router-ttl-secs",
            args.router_ttl_secs,
            0.001,
            3600.0,
        )),
        max_tree_size: clamp(
            "router-max-tree-size",
            args.router_max_tree_size,
            1,
            1 << 32,
        ),
        prune_target_ratio: clamp(
            "router-prune-target-ratio",
            args.router_prune_target_ratio,
            0.0,
            1.0,
        ),
        max_predictions: clamp("max-predictions", args.max_predictions, 1, 1 << 32),
    }
}

/// How startup recovery seeds the index (`--snapshot-path`, `--peers`).
pub fn recovery_options(args: &Args, access: &crate::access::Access) -> crate::recovery::Options {
    crate::recovery::Options {
        snapshot_path: args.snapshot_path.clone(),
        peer_wait: Duration::from_millis(clamp("peer-wait-ms", args.peer_wait_ms, 0, 60_000)),
        adopt_workers: args.adopt_workers,
        // Only the read token: a peer has no business with our admin token.
        peer_token: access.query.clone(),
        dump_limits: crate::recovery::dump::DumpLimits {
            // "{}" is the smallest dump.
            max_bytes: clamp("max-peer-dump-bytes", args.max_peer_dump_bytes, 2, 1 << 50),
            max_blocks: args.max_peer_dump_blocks,
        },
    }
}

/// How the executors serve HTTP.
pub fn serve_options(
    args: &Args,
    descriptors: &Descriptors,
    addr: SocketAddr,
    access: crate::access::Access,
) -> ServeOptions {
    let max_connections = descriptors.http_per_core;
    ServeOptions {
        addr,
        spin: Duration::from_micros(clamp("spin-us", args.spin_us, 0, 1_000_000)),
        slice: match args.slice_us {
            0 => None,
            n => Some(Duration::from_micros(clamp("slice-us", n, 100, 100_000))),
        },
        max_connections,
        header_timeout: Duration::from_millis(clamp(
            "header-timeout-ms",
            args.header_timeout_ms,
            100,
            3_600_000,
        )),
        http: crate::http::Options {
            body_timeout: Duration::from_millis(clamp(
                "body-timeout-ms",
                args.body_timeout_ms,
                100,
                3_600_000,
            )),
            access: Arc::new(access),
            slot_max_body: clamp(
                "slot-max-body-bytes",
                args.slot_max_body_bytes,
                1024,
                1 << 30,
            ),
        },
        slot_limits: crate::slot_tracker::SlotLimits {
            max_booking_blocks: args.slot_max_booking_blocks,
            max_rank_blocks: args.slot_max_rank_blocks,
            max_bookings: args.slot_max_bookings,
            max_tracker_blocks: args.slot_max_tracker_blocks,
            metrics_max_ranks: args.slot_metrics_max_ranks,
        },
        slots_addr: None,
        slot_links: None,
        slot_ttl: Duration::from_secs_f64(args.slot_request_ttl_secs.min(1e9)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("kvix").chain(flags.iter().copied())).unwrap()
    }

    /// What each numeric flag becomes at its edges (2 shards on 2 cores).
    #[test]
    fn numeric_flags_are_clamped_to_what_works() {
        let cfg = |flags: &[&str]| {
            config(
                &args(flags),
                2,
                2,
                crate::prompt::Prompts::load(&[]).unwrap(),
            )
            .unwrap()
        };
        type Field = fn(&Config) -> f64;
        let table: [(&[&str], Field, f64); 12] = [
            (&["--ring-capacity", "1"], |c| c.ring_capacity as f64, 256.0),
            (
                &["--ring-capacity", "99999999"],
                |c| c.ring_capacity as f64,
                (1 << 24) as f64,
            ),
            (&["--ingest-threads", "0"], |c| c.ingest_threads as f64, 2.0),
            (
                &["--ingest-threads", "1000"],
                |c| c.ingest_threads as f64,
                8.0,
            ),
            (
                &["--shards-per-index", "0"],
                |c| c.shards_per_index as f64,
                1.0,
            ),
            (
                &["--max-event-slots", "0"],
                |c| c.event_limits.slots as f64,
                1.0,
            ),
            (&["--zmq-rcvhwm", "1"], |c| c.sockets.rcvhwm as f64, 16.0),
            (
                &["--zmq-max-msg-bytes", "1"],
                |c| c.sockets.max_msg_bytes as f64,
                4096.0,
            ),
            (
                &["--max-blocks", "1"],
                |c| c.max_blocks.unwrap() as f64,
                2.0,
            ),
            (
                &["--stall-timeout-ms", "1"],
                |c| c.stall_after.as_millis() as f64,
                50.0,
            ),
            (
                &["--snapshot-path", "/x", "--snapshot-interval", "0.001"],
                |c| c.snapshot.as_ref().unwrap().interval.as_secs_f64(),
                0.1,
            ),
            (
                &["--snapshot-path", "/x", "--snapshot-interval", "0"],
                |c| c.snapshot.as_ref().unwrap().interval.as_secs_f64(),
                0.0,
            ),
        ];
        for (flags, field, want) in table {
            assert_eq!(field(&cfg(flags)), want, "{flags:?}");
        }
    }

    /// Flags that cannot mean anything, alone or together, are refused by name.
    #[test]
    fn impossible_flags_are_refused_naming_the_flag() {
        let table: [(&[&str], Option<&str>); 8] = [
            (&[], None),
            (
                &["--block-size", "0"],
                Some("--block-size must be positive"),
            ),
            (
                &["--workers", "1=tcp://h:1"],
                Some("--block-size is required when --workers"),
            ),
            (
                &["--zmq-bind", "tcp://*:1"],
                Some("--block-size is required when --zmq-bind"),
            ),
            (
                &["--block-size", "4", "--zmq-bind", "udp://x:1"],
                Some("--zmq-bind"),
            ),
            (
                &["--slot-request-ttl-secs", "0"],
                Some("--slot-request-ttl-secs"),
            ),
            (
                &["--slot-tracker-port", "8090"],
                Some("--slot-tracker-port must differ"),
            ),
            (&["--snapshot-interval", "NaN"], Some("--snapshot-interval")),
        ];
        for (flags, want) in table {
            let a = args(flags);
            let workers = a
                .workers
                .as_deref()
                .map_or_else(Vec::new, |w| crate::cli::parse_workers(w).unwrap());
            match (check_flags(&a, &workers), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{flags:?}: {e}"),
                (r, w) => panic!("{flags:?}: {r:?}, expected {w:?}"),
            }
        }
    }
}
