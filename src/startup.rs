//! From a validated command line to a serving process: the ports claimed, bound
//! pod sockets, peers, signal handlers, `--workers`, startup recovery on a thread
//! of its own, the slot tracker's replica links, then the executors.
//!
//! Runs once, on the main thread, before any executor: it may block (binding,
//! connecting, registering). Every flag's value comes from [`crate::config`].

use crate::app::{App, registration};
use crate::cli::{Args, parse_peers, parse_workers};
use crate::config::{
    check_flags, config, load_access, recovery_options, serve_options, shard_count,
};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

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
pub fn run(args: Args) -> Result<(), String> {
    let (shards, cores) = shard_count(&args)?;
    check_memlock(shards);
    let workers = match &args.workers {
        Some(w) => parse_workers(w)?,
        None => Vec::new(),
    };
    check_flags(&args, &workers)?;
    let access = load_access(&args)?;
    let prompts =
        crate::prompt::Prompts::load(&args.tokenizer).map_err(|e| format!("--tokenizer {e}"))?;
    if !args.tokenizer.is_empty() {
        tracing::info!(models = ?prompts.names(), "tokenizers loaded");
    }
    let addr: SocketAddr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .map_err(|e| format!("bad --host/--port: {e}"))?
        .next()
        .ok_or("bad --host")?;
    let (addr, _port_guard) = crate::runtime::claim_port(addr)?;
    let slots = match args.slot_tracker_port {
        Some(port) => {
            let a = SocketAddr::new(addr.ip(), port);
            let (a, guard) =
                crate::runtime::claim_port(a).map_err(|e| format!("--slot-tracker-port: {e}"))?;
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
    let served = crate::runtime::serve(app, opts).map_err(|e| {
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
    workers: Vec<crate::cli::WorkerSpec>,
    access: &crate::access::Access,
) -> Result<(), String> {
    for (i, ep) in args.zmq_bind.iter().enumerate() {
        let opts = crate::ingest::bind::BindOpts {
            block_size: args.block_size.unwrap_or_default(),
            tenant: args.tenant_id.clone(),
        };
        app.ingest()
            .bind(i, ep, opts)
            .map_err(|e| format!("--zmq-bind: {e}"))?;
    }
    for p in parse_peers(args.peers.as_deref().unwrap_or("")) {
        match crate::access::check_peer_url(&p, Some(addr)) {
            Ok(()) => app.control().add_peer(p),
            // One --peers list for every replica is a fine setup: each skips itself.
            Err(e @ crate::access::PeerUrlError::Itself(_)) => {
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
            crate::registry::Endpoint::new(w.endpoint.clone(), None),
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
    access: &crate::access::Access,
) -> Result<(), String> {
    let (app, opts) = (app.clone(), recovery_options(args, access));
    std::thread::Builder::new()
        .name("kvix-recovery".into())
        .spawn(move || {
            crate::recovery::bootstrap(
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
) -> Result<Option<Arc<crate::slot_tracker::sync::Links>>, String> {
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
    let links = crate::slot_tracker::sync::Links::new(shards, router_id);
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
            crate::ingest::endpoint::validate(p).map_err(|e| format!("--slot-sync-peers: {e}"))?;
            sock.connect(p)
                .map_err(|e| format!("--slot-sync-peers: cannot connect {p}: {e}"))?;
        }
        sock.set_subscribe(crate::slot_tracker::sync::TOPIC)
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
