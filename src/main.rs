//! The `kvix` binary: validate flags, load tokenizers, claim the port, start ingest,
//! register `--workers`, start recovery, serve.

#![warn(clippy::undocumented_unsafe_blocks)]

use clap::Parser;
use kvix::app::{App, registration};
use kvix::cli::{Args, parse_peers, parse_workers};
use kvix::config::{check_flags, clamp, config, load_access, serve_options, shard_count};
use kvix::recovery::{Options, bootstrap};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`, v2 and v3 alike); the -sys
/// crate does not name it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the OS after [`PURGE_DELAY_MS`] (arena memory after ten
/// times that, mimalloc's `arena_purge_mult`) instead of mimalloc's 1 s, checked on
/// a later allocator call. Not at once: a table that grows reuses the pages its last
/// growth freed instead of faulting in and zeroing fresh ones. A thread that goes
/// quiet after work releases the rest ([`kvix::heap`]), so an idle indexer does not
/// keep what a burst or an unregister freed. Purges are whole 2 MiB spans, so
/// small-object churn does not pay for them. `MIMALLOC_PURGE_DELAY` still wins
/// when set.
fn return_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide integer option; mimalloc reads options with
        // relaxed atomics, so changing one while threads allocate is allowed.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// Milliseconds freed memory stays with mimalloc before it is purged.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set
/// (mimalloc's own switch, read before `main`; unset, mimalloc advises huge pages
/// for its arenas). The trees' arenas and engine-hash maps are written at random
/// positions, so a 2 MiB huge page is faulted in, zeroed and kept resident whole
/// wherever one entry lands; with 4 KiB pages only what is written is resident.
fn small_pages_only() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map,
        // checked at page-fault time; it reads no pointers.
        let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if r != 0 {
            eprintln!(
                "kvix: transparent huge pages stay on (prctl: {})",
                std::io::Error::last_os_error()
            );
        }
    }
}

fn main() {
    small_pages_only();
    return_freed_memory_promptly();
    let args = Args::parse();
    kvix::logs::init(&args.log_format);
    if let Err(e) = run(args) {
        tracing::error!("{e}");
        eprintln!("kvix: {e}");
        std::process::exit(2);
    }
}

/// glommio needs io_uring and locks memory for its buffers: say which limit is too low
/// and how to raise it, instead of failing later inside an executor.
fn check_memlock(cores: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return;
    }
    let need = (cores as u64) * 512 * 1024;
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < need {
        tracing::warn!(
            memlock_bytes = lim.rlim_cur,
            "RLIMIT_MEMLOCK is low for io_uring on older kernels; raise it with `ulimit -l unlimited` \
             or LimitMEMLOCK=infinity in the systemd unit if executors fail to start"
        );
    }
}

/// Check the flags, build the service, start it, and serve until it is told to stop.
fn run(args: Args) -> Result<(), String> {
    let (shards, cores) = shard_count(&args)?;
    check_memlock(shards);
    let workers = match &args.workers {
        Some(w) => parse_workers(w)?,
        None => Vec::new(),
    };
    check_flags(&args, &workers)?;
    let access = load_access(&args)?;
    let prompts =
        kvix::prompt::Prompts::load(&args.tokenizer).map_err(|e| format!("--tokenizer {e}"))?;
    if !args.tokenizer.is_empty() {
        tracing::info!(models = ?prompts.names(), "tokenizers loaded");
    }
    let addr: SocketAddr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .map_err(|e| format!("bad --host/--port: {e}"))?
        .next()
        .ok_or("bad --host")?;
    let (addr, _port_guard) = kvix::runtime::claim_port(addr)?;
    let slots = match args.slot_tracker_port {
        Some(port) => {
            let a = SocketAddr::new(addr.ip(), port);
            let (a, guard) =
                kvix::runtime::claim_port(a).map_err(|e| format!("--slot-tracker-port: {e}"))?;
            // Port 0 lets the system choose: say which.
            tracing::info!("slot tracker on http://{a}");
            Some((a, guard))
        }
        None => None,
    };
    let cfg = config(&args, shards, cores, prompts)?;
    let app = App::new(&cfg)?;
    start(&args, &app, addr, workers, &access)?;
    let mut opts = serve_options(&args, &cfg.descriptors, addr, access);
    opts.slots_addr = slots.as_ref().map(|(a, _)| *a);
    opts.slot_links = slot_sync(&args, &app, addr, shards)?;
    tracing::info!(
        %addr,
        shards,
        shards_per_index = app.rings().partition().span(),
        ingest_threads = cfg.ingest_threads,
        max_connections = opts.max_connections,
        slot_tracker = ?opts.slots_addr,
        "starting"
    );
    let access_log = cfg.access_log.clone();
    let served = kvix::runtime::serve(app, opts).map_err(|e| {
        format!("cannot start the executors ({e}); kvix needs io_uring (Linux 5.8+, not disabled by seccomp or sysctl kernel.io_uring_disabled) and enough RLIMIT_MEMLOCK")
    });
    // The requests answered last are written before the process ends.
    if let Some(log) = access_log {
        log.shutdown();
    }
    served
}

/// Everything before the executors: peers, signal handlers, `--workers`, and startup
/// recovery on a thread of its own.
fn start(
    args: &Args,
    app: &Arc<App>,
    addr: SocketAddr,
    workers: Vec<kvix::cli::WorkerSpec>,
    access: &kvix::access::Access,
) -> Result<(), String> {
    for (i, ep) in args.zmq_bind.iter().enumerate() {
        let opts = kvix::ingest::bind::BindOpts {
            block_size: args.block_size.unwrap_or_default(),
            tenant: args.tenant_id.clone(),
        };
        app.ingest()
            .bind(i, ep, opts)
            .map_err(|e| format!("--zmq-bind: {e}"))?;
    }
    for p in parse_peers(args.peers.as_deref().unwrap_or("")) {
        match kvix::access::check_peer_url(&p, Some(addr)) {
            Ok(()) => app.control().add_peer(p),
            // One --peers list for every replica is a fine setup: each skips itself.
            Err(e @ kvix::access::PeerUrlError::Itself(_)) => {
                tracing::info!("--peers: {e}; skipped")
            }
            Err(e) => return Err(format!("--peers: {e}")),
        }
    }
    let life = app.lifecycle();
    // SIGTERM/SIGINT: Draining, a final snapshot, exit 0 (the lifecycle task on core 0).
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, life.terminate_flag())
            .map_err(|e| format!("cannot install signal handler: {e}"))?;
    }
    // SIGHUP would kill the process by default; kvix has nothing to reload, so it is
    // logged and ignored.
    signal_hook::flag::register(signal_hook::consts::SIGHUP, life.hangup_flag())
        .map_err(|e| format!("cannot install signal handler: {e}"))?;
    // Startup recovery: SUB sockets connect now but stay unread until the snapshot and
    // a peer's dump are applied; then the buffered frames apply on top.
    let recover = args.snapshot_path.is_some() || !app.control().peers().is_empty();
    if recover {
        life.begin_recovery();
        app.ingest().pause(true);
    }
    for w in workers {
        let reg = registration(
            args.model_name.clone(),
            args.tenant_id.clone(),
            args.block_size.unwrap_or_default(),
            w.instance.into(),
            w.dp,
            kvix::registry::Endpoint::new(w.endpoint.clone(), None),
            Default::default(),
        );
        app.control()
            .register(reg)
            .map_err(|e| format!("--workers {}: {e}", w.endpoint))?;
    }
    if recover {
        start_recovery(args, app, access)?;
    }
    Ok(())
}

/// Seed the index from the snapshot and a peer, on a thread of its own: seeding
/// needs the executors (started after this) draining.
fn start_recovery(
    args: &Args,
    app: &Arc<App>,
    access: &kvix::access::Access,
) -> Result<(), String> {
    let (app, opts) = (
        app.clone(),
        Options {
            snapshot_path: args.snapshot_path.clone(),
            peer_wait: Duration::from_millis(clamp("peer-wait-ms", args.peer_wait_ms, 0, 60_000)),
            adopt_workers: args.adopt_workers,
            // Only the read token: a peer has no business with our admin token.
            peer_token: access.query.clone(),
            dump_limits: kvix::recovery::dump::DumpLimits {
                // "{}" is the smallest dump.
                max_bytes: clamp("max-peer-dump-bytes", args.max_peer_dump_bytes, 2, 1 << 50),
                max_blocks: args.max_peer_dump_blocks,
            },
        },
    );
    std::thread::Builder::new()
        .name("kvix-recovery".into())
        .spawn(move || {
            bootstrap(
                app.control(),
                app.rings(),
                app.lifecycle(),
                app.recovery_stats(),
                opts,
            )
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The slot tracker's replica links (`--slot-sync-port`, `--slot-sync-peers`):
/// their sockets, bound and connected here so a bad flag stops kvix at start, and
/// the two threads that hold them.
fn slot_sync(
    args: &Args,
    app: &Arc<App>,
    addr: SocketAddr,
    shards: usize,
) -> Result<Option<Arc<kvix::slot_tracker::sync::Links>>, String> {
    if args.slot_sync_port.is_none() && args.slot_sync_peers.is_empty() {
        return Ok(None);
    }
    if args.slot_tracker_port.is_none() {
        return Err("--slot-sync-port and --slot-sync-peers need --slot-tracker-port".into());
    }
    let ctx = zmq::Context::new();
    // Unique enough to tell this replica's own events from its peers'.
    let router_id = xxhash_rust::xxh3::xxh3_64(
        format!("{}-{:?}", std::process::id(), std::time::SystemTime::now()).as_bytes(),
    );
    let links = kvix::slot_tracker::sync::Links::new(shards, router_id);
    if let Some(port) = args.slot_sync_port {
        let ep = format!("tcp://{}", SocketAddr::new(addr.ip(), port));
        let sock = ctx.socket(zmq::PUB).map_err(|e| e.to_string())?;
        sock.bind(&ep)
            .map_err(|e| format!("--slot-sync-port: cannot bind {ep}: {e}"))?;
        let l = links.clone();
        std::thread::Builder::new()
            .name("kvix-slot-pub".into())
            .spawn(move || l.run_publisher(sock))
            .map_err(|e| e.to_string())?;
    }
    if !args.slot_sync_peers.is_empty() {
        let sock = ctx.socket(zmq::SUB).map_err(|e| e.to_string())?;
        for p in &args.slot_sync_peers {
            kvix::cli::validate_endpoint(p).map_err(|e| format!("--slot-sync-peers: {e}"))?;
            sock.connect(p)
                .map_err(|e| format!("--slot-sync-peers: cannot connect {p}: {e}"))?;
        }
        sock.set_subscribe(kvix::slot_tracker::sync::TOPIC)
            .map_err(|e| e.to_string())?;
        let (l, app) = (links.clone(), app.clone());
        std::thread::Builder::new()
            .name("kvix-slot-sub".into())
            .spawn(move || l.run_subscriber(sock, |s| app.rings().wake(s)))
            .map_err(|e| e.to_string())?;
    }
    tracing::info!(router_id, peers = ?args.slot_sync_peers, port = ?args.slot_sync_port, "slot tracker shares its requests with its replicas");
    Ok(Some(links))
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
        // SAFETY: reads a process-wide integer option (see above).
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(before, 1000);
        return_freed_memory_promptly();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(after, PURGE_DELAY_MS);
    }
}
