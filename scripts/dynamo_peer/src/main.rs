//! dynamo-peer: Dynamo's standalone KV indexer as published in `dynamo-kv-router`
//! 1.6.1, started through the crate's own `services::indexer::run_server`.
//!
//! Owns only the command line and the tokio runtime. The flags are those of
//! Dynamo's `dynamo-kv-indexer` (`python -m dynamo.indexer`), so the same
//! kvix-load invocations drive it and kvix; `--runtime-threads` is the one
//! addition, because Dynamo sizes its runtime to every core and a comparison at
//! a given thread count must bound it.

use clap::Parser;
use dynamo_kv_router::services::indexer::{IndexerConfig, logging, run_server};
use std::io::IsTerminal;

#[derive(Parser)]
#[command(
    name = "dynamo-peer",
    about = "Dynamo's standalone KV cache indexer (dynamo-kv-router 1.6.1), for comparisons"
)]
struct Cli {
    /// KV cache block size (must match the engine's block size); required with --workers
    #[arg(long)]
    block_size: Option<u32>,

    /// HTTP server port (Dynamo binds 0.0.0.0)
    #[arg(long, default_value_t = 8090)]
    port: u16,

    /// Indexer threads (Dynamo's meaning: 1 = single-threaded KvIndexer,
    /// >1 = ThreadPoolIndexer over a concurrent radix tree)
    #[arg(long, default_value_t = 4)]
    threads: usize,

    /// tokio worker threads serving HTTP and the ZMQ listeners; 0 = one per core,
    /// as Dynamo's own binary does
    #[arg(long, default_value_t = 0)]
    runtime_threads: usize,

    /// Initial workers as "worker_id[:dp_rank]=zmq_address,..."
    #[arg(long)]
    workers: Option<String>,

    /// Model name for initial workers registered via --workers
    #[arg(long, default_value = "default")]
    model_name: String,

    /// Routing group for initial workers registered via --workers
    #[arg(long, default_value = "default")]
    routing_group: String,

    /// Accepted and ignored, as by Dynamo
    #[arg(long = "tenant-id", default_value = "default", hide = true)]
    _tenant_id: String,

    /// Comma-separated peer URLs for P2P recovery
    #[arg(long)]
    peers: Option<String>,

    /// Write an access log (JSON lines) to this file
    #[arg(long)]
    access_log: Option<std::path::PathBuf>,

    /// HTTP header carrying the trace id in the access log
    #[arg(long, default_value = "x-trace-id")]
    trace_id_header: String,

    /// Local time instead of UTC in access log timestamps
    #[arg(long)]
    access_log_local_time: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let trace_id_header = logging::parse_header_name(&cli.trace_id_header)
        .map_err(|e| anyhow::anyhow!("invalid --trace-id-header {:?}: {e}", cli.trace_id_header))?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if cli.runtime_threads > 0 {
        rt.worker_threads(cli.runtime_threads);
    }
    rt.build()?.block_on(run_server(IndexerConfig {
        block_size: cli.block_size,
        port: cli.port,
        threads: cli.threads.max(1),
        workers: cli.workers,
        model_name: cli.model_name,
        routing_group: cli.routing_group,
        peers: cli.peers,
        access_log: cli.access_log,
        trace_id_header,
        access_log_local_time: cli.access_log_local_time,
    }))
}
