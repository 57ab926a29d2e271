//! dynamo-slot-tracker: Dynamo's standalone slot tracker as published in
//! `dynamo-kv-router` 1.6.1, started through the crate's own
//! `services::slot_tracker::run_server` (`python -m dynamo.slot_tracker`).
//!
//! Owns only the command line and the tokio runtime; `--runtime-threads` bounds
//! the runtime for comparisons at a given thread count, as in dynamo-peer.

use clap::Parser;
use dynamo_kv_router::services::slot_tracker::{SlotTrackerConfig, run_server};

#[derive(Parser)]
#[command(
    name = "dynamo-slot-tracker",
    about = "Dynamo's standalone slot tracker (dynamo-kv-router 1.6.1), for comparisons"
)]
struct Cli {
    /// HTTP server port (Dynamo binds 0.0.0.0)
    #[arg(long, default_value_t = 8091)]
    port: u16,

    /// Port of the ZMQ PUB socket that shares this replica's lifecycle events
    #[arg(long)]
    replica_sync_port: Option<u16>,

    /// Comma-separated ZMQ endpoints of peer replicas to subscribe to
    #[arg(long, value_delimiter = ',')]
    replica_sync_peers: Vec<String>,

    /// tokio worker threads; 0 = one per core, as Dynamo's own binary does
    #[arg(long, default_value_t = 0)]
    runtime_threads: usize,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if cli.runtime_threads > 0 {
        rt.worker_threads(cli.runtime_threads);
    }
    rt.build()?.block_on(run_server(SlotTrackerConfig {
        port: cli.port,
        replica_sync_port: cli.replica_sync_port,
        replica_sync_peers: cli.replica_sync_peers,
    }))
}
