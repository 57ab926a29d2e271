//! The `kvix` binary: parse flags, start ingest, register `--workers`, serve.

use clap::Parser;
use kvix::cli::{Args, parse_peers, parse_workers};
use kvix::service::{App, registration};
use std::net::{SocketAddr, ToSocketAddrs};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if let Err(e) = run(args) {
        tracing::error!("{e}");
        eprintln!("kvix: {e}");
        std::process::exit(2);
    }
}

fn run(args: Args) -> Result<(), String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let shards = args.threads.clamp(1, cores);
    if shards < args.threads {
        tracing::info!(
            "--threads {} clamped to the {cores} cores available",
            args.threads
        );
    }
    let workers = match &args.workers {
        Some(w) => parse_workers(w)?,
        None => Vec::new(),
    };
    if !workers.is_empty() && args.block_size.is_none() {
        return Err("--block-size is required when --workers is specified".into());
    }
    let addr: SocketAddr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .map_err(|e| format!("bad --host/--port: {e}"))?
        .next()
        .ok_or("bad --host")?;
    let app = App::start(shards, args.ingest_threads, args.ring_capacity);
    for p in parse_peers(args.peers.as_deref().unwrap_or("")) {
        app.add_peer(p);
    }
    for w in workers {
        let reg = registration(
            args.model_name.clone(),
            args.tenant_id.clone(),
            args.block_size.unwrap_or_default(),
            w.instance,
            w.dp,
            kvix::registry::Endpoint::new(w.endpoint.clone(), None),
            Default::default(),
        );
        app.register(reg)
            .map_err(|e| format!("--workers {}: {e}", w.endpoint))?;
    }
    kvix::runtime::serve(app, addr, std::time::Duration::from_micros(args.spin_us))
        .map_err(|e| e.to_string())
}
