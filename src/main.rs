//! The `kvix` binary: parse flags, start ingest, register `--workers`, serve.

use clap::Parser;
use kvix::cli::{Args, parse_peers, parse_workers};
use kvix::recovery::{Options, bootstrap};
use kvix::service::{App, SnapshotConfig, registration};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`, v2 and v3 alike); the -sys
/// crate does not name it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Free memory goes back to the OS at once instead of after mimalloc's delay (1 s,
/// times 10 for arena memory, and only checked on the next allocator call, so an
/// idle indexer kept what a burst or an unregister had freed). Purges are whole
/// 2 MiB spans, so small-object churn does not pay for them. `MIMALLOC_PURGE_DELAY`
/// still wins when set.
fn return_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide integer option; mimalloc reads options with
        // relaxed atomics, so changing one while threads allocate is allowed.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
}

fn main() {
    return_freed_memory_promptly();
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
    let snapshot = args.snapshot_path.clone().map(|path| SnapshotConfig {
        path,
        interval: Duration::from_secs_f64(args.snapshot_interval.max(0.0)),
    });
    // Decoding is the serial stage of the event path: one ingest thread per executor
    // applied 1.6-1.8x the blocks/s of a single one on 2 cores (BENCHMARKS.md).
    let ingest_threads = match args.ingest_threads {
        0 => shards,
        n => n,
    };
    let app = App::start_with(shards, ingest_threads, args.ring_capacity, snapshot);
    for p in parse_peers(args.peers.as_deref().unwrap_or("")) {
        app.add_peer(p);
    }
    // SIGTERM/SIGINT: the snapshot task on core 0 writes a final snapshot and exits 0.
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, app.terminate.clone())
            .map_err(|e| format!("cannot install signal handler: {e}"))?;
    }
    // Startup recovery: SUB sockets connect now but stay unread until the snapshot and
    // a peer's dump are applied; then the buffered frames apply on top.
    let recover = args.snapshot_path.is_some() || !app.peers().is_empty();
    if recover {
        app.recovered.store(false, Ordering::Release);
        app.ingest.pause(true);
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
    if recover {
        let (app, opts) = (
            app.clone(),
            Options {
                snapshot_path: args.snapshot_path.clone(),
                peer_wait: Duration::from_millis(args.peer_wait_ms),
            },
        );
        // On a thread of its own: seeding needs the executors (started below) draining.
        std::thread::Builder::new()
            .name("kvix-recovery".into())
            .spawn(move || bootstrap(app, opts))
            .map_err(|e| e.to_string())?;
    }
    kvix::runtime::serve(app, addr, std::time::Duration::from_micros(args.spin_us))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the option's number against a renumbering upstream: mimalloc v3's
    /// default purge delay is 1000 ms, which no neighbouring option has.
    #[test]
    fn purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads and sets a process-wide integer option (see above).
        unsafe {
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 1000);
            return_freed_memory_promptly();
            assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 0);
        }
    }
}
