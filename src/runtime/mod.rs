//! Runtime glue: glommio executors, the shard mesh, the accept loop.
//!
//! Owns everything glommio: one pinned `LocalExecutor` per shard, each running
//! (a) the drain loop that applies ring ops to its shard, (b) the mesh endpoints
//! that answer other cores' requests, (c) the accept loop on the shared port
//! (`SO_REUSEPORT`) handing each connection to hyper with [`crate::http::handle`] as
//! the service, (d) the keeper that keeps it polling while queries come
//! (`awake`), and on core 0 (e) the lifecycle task (snapshots, signals, watchdog).
//! Shard state is only ever touched by its own executor; other cores reach it by
//! message (`mesh.rs`, the protocol). No executor ever waits on a thread: blocking
//! work goes through [`ShardMesh::offload`]. `mod.rs` only starts the cores and
//! serves; `drain.rs`, `housekeeping.rs`, `listen.rs` are their loops.

pub mod awake;
mod drain;
mod housekeeping;
pub mod io;
mod listen;
mod mesh;
pub mod slice;

pub use listen::{PortGuard, claim_port};

use drain::{drain_loop, let_requests_in};
use housekeeping::{heartbeat_loop, lifecycle_loop};
use mesh::{Msg, Rep};

use crate::app::App;
use crate::http;
use crate::lifecycle::Phase;
use crate::mesh::{ShardMesh, ShardUnavailable};
use crate::metrics::{HttpStats, ShardStats};
use crate::shard::tree::SlotGroups;
use crate::shard::{
    ChainAt, ExportAt, ExportedBlock, PredictRefused, PredictStep, PruneBound, Shard, ShardExport,
};
use crate::shard::{PromptBlocks, ShardReply};
use crate::slot_tracker::{SlotRep, SlotReq, SlotShard};
use crate::types::{EngineHash, IndexId, ShardId, WorkerSlot};
use glommio::channels::channel_mesh::{MeshBuilder, Senders};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::{LocalExecutorPoolBuilder, PoolPlacement};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the HTTP side of every executor runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The resolved address every core listens on.
    pub addr: SocketAddr,
    /// How long an executor keeps polling after a query or a peer's request before
    /// it may park; zero: it parks whenever it is idle.
    pub spin: Duration,
    /// The time slice an executor's thread asks the kernel for while requests come
    /// ([`slice`]); none: the kernel's default.
    pub slice: Option<Duration>,
    /// Open connections per core; beyond it new ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// From the moment a connection waits for a request (accepted, or its previous
    /// response sent) until that request's headers are complete: bounds slow
    /// headers and idle keep-alive connections alike.
    pub header_timeout: Duration,
    pub http: http::Options,
    /// The slot-tracker listener's address (`--slot-tracker-port`); none: off.
    pub slots_addr: Option<SocketAddr>,
    /// How long a booked request that is never freed is tracked.
    pub slot_ttl: Duration,
    /// What the slot trackers may hold and how `/metrics` reports them.
    pub slot_limits: crate::slot_tracker::SlotLimits,
    /// The slot tracker's links to its replicas (`--slot-sync-*`), if any.
    pub slot_links: Option<Arc<crate::slot_tracker::sync::Links>>,
}

/// Per-executor context: this core's shard and its link to the others.
pub struct Core {
    id: ShardId,
    shards: usize,
    app: Arc<App>,
    shard: RefCell<Shard>,
    /// The slot trackers this core owns; only this core's executor touches them.
    slot_tracker: RefCell<SlotShard>,
    mesh: Senders<Msg>,
    pending: RefCell<HashMap<u64, LocalSender<Rep>>>,
    next_qid: Cell<u64>,
    /// This core's HTTP counters; core-local (no atomics), gathered on scrape.
    http_stats: RefCell<HttpStats>,
    /// Keeps this executor polling while queries come.
    awake: Rc<awake::KeepAwake>,
}

/// glommio's floor for an executor's registered storage I/O memory.
const IO_MEMORY: usize = 64 * 1024;

/// Start one executor per shard and serve HTTP on `opts.addr` from all of them.
/// Blocks. An executor keeps polling for `opts.spin` after each query or peer's
/// request (`awake`): a parked core needs a kernel wake-up (tens of µs,
/// milliseconds under load) before it sees the next one.
pub fn serve(app: Arc<App>, opts: ServeOptions) -> std::io::Result<()> {
    let shards = app.rings().shards();
    let mesh = MeshBuilder::<Msg, _>::full(shards, 1024);
    let window = opts.spin;
    let handles = LocalExecutorPoolBuilder::new(PoolPlacement::MaxSpread(shards, None))
        .name("kvix-core")
        // Storage I/O memory (glommio's DMA file buffers, 10 MiB a core by default):
        // executors read and write no files, so the minimum.
        .io_memory(IO_MEMORY)
        // Each executor's thread for control calls (`ShardMesh::offload`), left to the
        // scheduler: glommio's default pins every executor's to the first core.
        .blocking_thread_pool_placement(PoolPlacement::Unbound(1))
        .spin_before_park(awake::idle_spin(window))
        .on_all_shards(move || {
            let (app, mesh, opts) = (app.clone(), mesh.clone(), opts.clone());
            async move {
                let (senders, mut receivers) = mesh.join().await.expect("join shard mesh");
                let id = ShardId(senders.peer_id());
                let mut shard = Shard::default();
                shard.set_block_budget(app.block_budget().cloned());
                shard.set_max_predictions(Some(app.speculation().max_predictions));
                let core = Rc::new(Core {
                    id,
                    shards,
                    app,
                    shard: RefCell::new(shard),
                    slot_tracker: RefCell::new(SlotShard::new(
                        opts.slot_ttl,
                        opts.slot_limits,
                        opts.slot_links.clone(),
                    )),
                    mesh: senders,
                    pending: RefCell::default(),
                    next_qid: Cell::new(0),
                    http_stats: RefCell::default(),
                    awake: awake::KeepAwake::new(window, opts.slice),
                });
                glommio::spawn_local(core.awake.clone().run()).detach();
                for (peer, stream) in receivers.streams() {
                    let core = core.clone();
                    glommio::spawn_local(async move {
                        while let Some(msg) = stream.recv().await {
                            core.on_msg(peer, msg);
                        }
                    })
                    .detach();
                }
                glommio::spawn_local(drain_loop(core.clone())).detach();
                glommio::spawn_local(heartbeat_loop(core.clone())).detach();
                if id.0 == 0 {
                    glommio::spawn_local(lifecycle_loop(core.clone())).detach();
                }
                if let Some(addr) = opts.slots_addr {
                    let (core, opts) = (core.clone(), opts.clone());
                    glommio::spawn_local(async move {
                        if let Err(e) =
                            listen::accept_loop(core, &opts, listen::Serve::Slots(addr)).await
                        {
                            tracing::error!("slot tracker on {addr} failed: {e}");
                            std::process::exit(1);
                        }
                    })
                    .detach();
                }
                if let Err(e) = listen::accept_loop(core, &opts, listen::Serve::Main).await {
                    tracing::error!("HTTP server on {} failed: {e}", opts.addr);
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    handles.join_all();
    Ok(())
}
