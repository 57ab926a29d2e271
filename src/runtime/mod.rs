//! Runtime glue: glommio executors, the shard mesh, the accept loop.
//!
//! Owns everything glommio: one pinned `LocalExecutor` per shard, each running
//! (a) the drain loop that applies ring ops to its shard, (b) the mesh endpoints
//! that answer other cores' requests, (c) the accept loop on the shared port
//! (`SO_REUSEPORT`) handing each connection to hyper with [`crate::http::handle`] as
//! the service, (d) the keeper that keeps it polling while queries come
//! (`awake`), and on core 0 (e) the lifecycle task (snapshots, signals, watchdog).
//! Shard state is only ever touched by its own executor; other cores reach it by
//! message. No executor ever waits on a thread: blocking work goes through
//! [`ShardMesh::offload`].

pub mod awake;
pub mod io;
mod listen;
pub mod slice;

pub use listen::{PortGuard, claim_port};

use crate::app::App;
use crate::http;
use crate::lifecycle::Phase;
use crate::mesh::{ShardMesh, ShardUnavailable};
use crate::metrics::{HttpStats, ShardStats};
use crate::query::{self, PromptBlocks, ShardReply};
use crate::shard::tree::SlotGroups;
use crate::shard::{
    ChainAt, DumpedBlock, ExportAt, PredictRefused, PredictStep, PruneBound, Shard, ShardExport,
};
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

/// One step of an export, as a shard answers it.
struct ExportStep {
    blocks: Vec<DumpedBlock>,
    names: Vec<(WorkerSlot, u32, EngineHash)>,
    /// With the last step: the slots' other KV-cache groups.
    groups: Vec<(WorkerSlot, SlotGroups)>,
    at: ExportAt,
    done: bool,
}

/// A request from one core to another core's shard.
enum Req {
    Lookup {
        index: IndexId,
        prompt: Arc<PromptBlocks>,
    },
    /// Bound the index first if asked, then apply the prediction's step if there
    /// is one (it goes to its slot's shard only).
    Predict {
        index: IndexId,
        step: Option<Box<PredictStep>>,
        prune: Option<PruneBound>,
    },
    /// The next step of an export from `at` (the default begins one). An export
    /// reads a shard in steps, one request each, so the shard's executor serves
    /// queries between them instead of walking its whole index at once. Ops applied
    /// between steps are covered by replay from the sequence numbers taken before
    /// the export, as ops applied after it are.
    Export {
        index: IndexId,
        at: Box<ExportAt>,
    },
    Stats,
    Slots(Box<SlotReq>),
}

enum Rep {
    Lookup(ShardReply),
    /// Where the step ended (`None`: the shard was only bounded).
    Predicted(Option<Result<ChainAt, PredictRefused>>),
    /// The step's blocks and engine names, where the export got to, and whether
    /// it is done.
    Export(Box<ExportStep>),
    Stats(Box<ShardStats>),
    Slots(Box<SlotRep>),
}

enum Msg {
    Req(u64, Req),
    Rep(u64, Rep),
}

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

impl Core {
    fn answer(&self, req: Req) -> Rep {
        match req {
            Req::Stats => {
                let shard = self.shard.borrow();
                let (blocks, tier_blocks) = shard.tier_counts();
                Rep::Stats(Box::new(ShardStats {
                    shard: self.id.0,
                    applied: shard.applied,
                    pending: self.app.rings().pending(self.id) as u64,
                    waiting: shard.waiting_ops() as u64,
                    stalls: self.app.rings().stalls(self.id),
                    polling_yielded: self.awake.stops(),
                    blocks,
                    tier_blocks,
                    predictions: shard.predictions,
                    evicted: shard.evicted,
                    unknown_parent: shard.unknown_parent,
                    unknown_removed: shard.unknown_removed,
                    duplicate_stores: shard.duplicate_stores,
                    group_unheld: shard.group_unheld,
                    engine_map_bytes: shard.engine_map_bytes() as u64,
                    heap_bytes: shard.heap_bytes() as u64,
                    http: self.http_stats.borrow().clone(),
                    slots: self.slot_tracker.borrow_mut().stats(Instant::now()),
                }))
            }
            Req::Slots(req) => Rep::Slots(Box::new(
                self.slot_tracker.borrow_mut().answer(*req, Instant::now()),
            )),
            Req::Lookup { index, prompt } => Rep::Lookup(query::answer(
                &mut self.shard.borrow_mut(),
                index,
                prompt.as_prompt(),
            )),
            Req::Predict { index, step, prune } => {
                let mut shard = self.shard.borrow_mut();
                if prune.is_some() {
                    shard.set_prune_bound(index, prune);
                }
                Rep::Predicted(step.map(|step| {
                    let r = shard.predict_step(index, &step);
                    // The drain loop ends predictions: it parks only until the next is due.
                    self.app.rings().wake(self.id);
                    r
                }))
            }
            Req::Export { index, mut at } => {
                // Apply everything already on the rings first, so an export taken after
                // the ingest threads reported their sequence numbers covers them.
                let mut shard = self.shard.borrow_mut();
                self.app
                    .rings()
                    .drain(self.id, usize::MAX, |ops| shard.apply_staged(ops));
                shard.finish_deferred();
                let (mut blocks, mut names) = (Vec::new(), Vec::new());
                let done = shard.export_step(index, &mut at, &mut blocks, &mut names);
                let mut groups = Vec::new();
                if done {
                    shard.group_specs(index, &mut groups);
                }
                Rep::Export(Box::new(ExportStep {
                    blocks,
                    names,
                    groups,
                    at: *at,
                    done,
                }))
            }
        }
    }

    fn on_msg(self: &Rc<Self>, peer: usize, msg: Msg) {
        match msg {
            Msg::Req(qid, req) => {
                self.awake.note();
                let rep = Msg::Rep(qid, self.answer(req));
                // Never block the receive loop (that could deadlock two cores sending to each
                // other): if the channel is full, finish the send in a task of its own.
                if let Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(rep))) =
                    self.mesh.try_send_to(peer, rep)
                {
                    let me = self.clone();
                    glommio::spawn_local(async move {
                        let _ = me.mesh.send_to(peer, rep).await;
                    })
                    .detach();
                }
            }
            Msg::Rep(qid, rep) => {
                if let Some(tx) = self.pending.borrow_mut().remove(&qid) {
                    let _ = tx.try_send(rep);
                }
            }
        }
    }

    /// Send `req` to every shard that has one and collect the replies by shard. Peers
    /// are asked first and our own part is answered while they work. A shard that
    /// was asked and did not answer fails the whole request.
    async fn scatter(
        &self,
        mut reqs: Vec<Option<Req>>,
    ) -> Result<Vec<Option<Rep>>, ShardUnavailable> {
        let mut out: Vec<Option<Rep>> = (0..self.shards).map(|_| None).collect();
        let mut waits = Vec::new();
        for (i, req) in reqs.iter_mut().enumerate() {
            if i == self.id.0 {
                continue;
            }
            let Some(req) = req.take() else { continue };
            let qid = self.next_qid.get();
            self.next_qid.set(qid + 1);
            let (tx, rx) = local_channel::new_bounded(1);
            self.pending.borrow_mut().insert(qid, tx);
            if self.mesh.send_to(i, Msg::Req(qid, req)).await.is_err() {
                self.pending.borrow_mut().remove(&qid);
                return Err(ShardUnavailable(ShardId(i)));
            }
            waits.push((i, rx));
        }
        if let Some(req) = reqs.get_mut(self.id.0).and_then(Option::take) {
            out[self.id.0] = Some(self.answer(req));
        }
        for (i, rx) in waits {
            match rx.recv().await {
                Some(rep) => out[i] = Some(rep),
                None => return Err(ShardUnavailable(ShardId(i))),
            }
        }
        Ok(out)
    }
}

impl ShardMesh for Core {
    fn app(&self) -> &Arc<App> {
        &self.app
    }

    fn http_stats(&self) -> &RefCell<HttpStats> {
        &self.http_stats
    }

    async fn lookup(
        &self,
        index: IndexId,
        slots: usize,
        prompt: Arc<PromptBlocks>,
    ) -> Result<Vec<ShardReply>, ShardUnavailable> {
        let partition = self.app.rings().partition();
        let asked = |i: usize| partition.holds_any(index, slots, ShardId(i));
        let reqs = (0..self.shards)
            .map(|i| {
                asked(i).then(|| Req::Lookup {
                    index,
                    prompt: prompt.clone(),
                })
            })
            .collect();
        let mut out = Vec::with_capacity(self.shards);
        for (i, r) in self.scatter(reqs).await?.into_iter().enumerate() {
            match r {
                Some(Rep::Lookup(r)) => out.push(r),
                None if !asked(i) => {}
                _ => return Err(ShardUnavailable(ShardId(i))),
            }
        }
        Ok(out)
    }

    async fn export(
        &self,
        shard: ShardId,
        index: IndexId,
    ) -> Result<ShardExport, ShardUnavailable> {
        let ask = |req: Req| {
            let mut reqs: Vec<Option<Req>> = (0..self.shards).map(|_| None).collect();
            if let Some(r) = reqs.get_mut(shard.0) {
                *r = Some(req);
            }
            self.scatter(reqs)
        };
        let mut out = ShardExport::default();
        let mut at = Box::default();
        loop {
            match ask(Req::Export { index, at })
                .await?
                .get_mut(shard.0)
                .and_then(Option::take)
            {
                Some(Rep::Export(step)) => {
                    let ExportStep {
                        blocks,
                        mut names,
                        mut groups,
                        at: next,
                        done,
                    } = *step;
                    if !blocks.is_empty() {
                        out.parts.push(blocks);
                    }
                    out.names.append(&mut names);
                    out.groups.append(&mut groups);
                    at = Box::new(next);
                    if done {
                        return Ok(out);
                    }
                }
                _ => return Err(ShardUnavailable(shard)),
            }
            // Our own shard answers in place: let queued queries run between steps.
            let_requests_in().await;
        }
    }

    async fn predict(
        &self,
        index: IndexId,
        step: PredictStep,
        prune: Option<PruneBound>,
    ) -> Result<Result<ChainAt, PredictRefused>, ShardUnavailable> {
        let owner = self.app.rings().partition().shard_of(index, step.slot);
        let mut step = Some(Box::new(step));
        let reqs = (0..self.shards)
            .map(|s| {
                let step = if s == owner.0 { step.take() } else { None };
                (step.is_some() || prune.is_some()).then_some(Req::Predict { index, step, prune })
            })
            .collect();
        match self
            .scatter(reqs)
            .await?
            .get_mut(owner.0)
            .and_then(Option::take)
        {
            Some(Rep::Predicted(Some(r))) => Ok(r),
            _ => Err(ShardUnavailable(owner)),
        }
    }

    async fn stats(&self) -> Result<Vec<ShardStats>, ShardUnavailable> {
        let reqs = (0..self.shards).map(|_| Some(Req::Stats)).collect();
        let mut out = Vec::with_capacity(self.shards);
        for (i, r) in self.scatter(reqs).await?.into_iter().enumerate() {
            match r {
                Some(Rep::Stats(s)) => out.push(*s),
                _ => return Err(ShardUnavailable(ShardId(i))),
            }
        }
        Ok(out)
    }

    async fn slot_tracker(&self, req: SlotReq) -> Result<Vec<SlotRep>, ShardUnavailable> {
        let owner = req.key().map(|k| k.owner(self.shards));
        let mut req = Some(req);
        let reqs = (0..self.shards)
            .map(|i| match owner {
                Some(o) if o.0 != i => None,
                Some(_) => req.take().map(|r| Req::Slots(Box::new(r))),
                None => req.clone().map(|r| Req::Slots(Box::new(r))),
            })
            .collect();
        let mut out = Vec::new();
        for (i, r) in self.scatter(reqs).await?.into_iter().enumerate() {
            match r {
                Some(Rep::Slots(r)) => out.push(*r),
                None if owner.is_some_and(|o| o.0 != i) => {}
                _ => return Err(ShardUnavailable(ShardId(i))),
            }
        }
        Ok(out)
    }

    fn shards(&self) -> usize {
        self.shards
    }

    async fn offload<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        glommio::executor().spawn_blocking(f).await
    }

    async fn sleep(&self, d: Duration) {
        glommio::timer::sleep(d).await
    }

    fn pauser(&self) -> impl Fn() -> Pin<Box<dyn Future<Output = ()>>> + 'static {
        || Box::pin(let_requests_in())
    }
}

/// The drain loop's first nap after applying ops.
const IDLE_AFTER_WORK: Duration = Duration::from_millis(1);

/// A shard that evicts says so at most this often.
const EVICTION_LOG_EVERY: Duration = Duration::from_secs(10);

/// How long [`let_requests_in`] pauses a task.
const SERVE_PAUSE: Duration = Duration::from_micros(10);

/// The longest the drain loop applies ops without letting requests in: a query
/// waits at most about this long behind an event flood, and the pauses cost the
/// flood a fraction of a percent.
const SERVE_EVERY: Duration = Duration::from_millis(2);

/// Pause the calling task so that requests that arrived meanwhile are served before
/// it goes on with a long job. A yield, conditional or not, does not get them there:
/// the connections' completions are only reaped when the executor polls its rings,
/// which it does not while a task is runnable. A timer that has not expired when
/// first polled makes the task wait, and the executor polls.
async fn let_requests_in() {
    glommio::timer::sleep(SERVE_PAUSE).await;
}

/// An executor whose rings stayed empty this long (longer than [`crate::heap::QUIET`],
/// so what the last burst freed is released first) parks on its ring bell.
const PARK_AFTER: Duration = Duration::from_millis(100);

/// A parked drain loop still wakes this often, to release memory and log.
const PARKED_TICK: Duration = Duration::from_millis(500);

/// The read end of this core's ring bell as a glommio stream, `None` if taken.
fn bell(core: &Core) -> Option<glommio::net::UnixStream> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let rx = core.app.rings().take_bell(core.id)?;
    // SAFETY: `into_raw_fd` gives up the std stream's ownership of the descriptor,
    // which the glommio stream takes over (and closes) alone.
    Some(unsafe { glommio::net::UnixStream::from_raw_fd(rx.into_raw_fd()) })
}

/// A drain loop parks only for this long or longer (a shorter wait is a nap).
const PARK_AT_LEAST: Duration = Duration::from_millis(20);

/// Wait on `bell` for a producer's byte, or `wake`. False if the bell broke
/// (the caller goes back to napping rather than spin on an error).
async fn wait_for_bell(bell: &mut glommio::net::UnixStream, wake: Duration) -> bool {
    use futures_lite::AsyncReadExt;
    let rung = async {
        let mut bytes = [0u8; 64];
        matches!(bell.read(&mut bytes).await, Ok(n) if n > 0)
    };
    let tick = async {
        glommio::timer::sleep(wake).await;
        true
    };
    futures_lite::future::or(rung, tick).await
}

/// Ops a drain pass applies at most, and how many it applies between looks at
/// the clock: a pass also ends once it has applied ops for [`SERVE_EVERY`].
const PASS_OPS: usize = 8192;
const PASS_STEP_OPS: usize = 1024;

/// One drain pass: ops from this core's rings into its shard, up to [`PASS_OPS`]
/// or [`SERVE_EVERY`] of applying them, whichever comes first. Returns how many.
fn drain_pass(core: &Core, shard: &mut Shard) -> usize {
    let (rings, start) = (core.app.rings(), Instant::now());
    let mut n = 0;
    while n < PASS_OPS {
        let k = rings.drain(core.id, PASS_STEP_OPS, |ops| shard.apply_staged(ops));
        n += k;
        if k == 0 || start.elapsed() >= SERVE_EVERY {
            break;
        }
    }
    n
}

/// Steps other slot-tracker replicas took on this core's trackers, at most
/// [`PASS_STEP_OPS`] a pass; how many.
fn take_replica_steps(core: &Core) -> usize {
    let Some(links) = core.slot_tracker.borrow().links() else {
        return 0;
    };
    let mut slots = core.slot_tracker.borrow_mut();
    let now = Instant::now();
    let mut n = 0;
    while n < PASS_STEP_OPS {
        let Some(e) = links.next_for(core.id) else {
            break;
        };
        slots.answer(crate::slot_tracker::sync::call(e), now);
        n += 1;
    }
    n
}

/// Drain this core's rings into its shard forever, walk one step of a slot's clear
/// and of an eviction per pass, and end the predictions that are due (the wheel
/// slots whose turn came, see [`crate::shard::predict`]). Requests get in between
/// the steps of a clear or an eviction and at least every [`SERVE_EVERY`] of
/// applying ops.
///
/// When the rings are empty it naps 1–2 ms: every park costs glommio a membarrier IPI
/// to all cores, so shorter naps cost an event flood more than they save. A ring
/// holds 16k ops, 8 ms of one producer at 2M ops/s, so a nap does not make a
/// producer wait (`kvix_ring_full_stalls_total` counts when it does); events become
/// visible at most one nap after they arrive. Empty for [`PARK_AFTER`], it parks
/// until a producer rings its bell (or the next prediction is due) instead, so an
/// idle indexer spends no CPU polling and the next event is applied as it arrives.
/// Clears, evictions past the block budget, mass expiries and the slot trackers'
/// expiries and large frees run a step a pass, requests getting in between the
/// steps; while a step left blocks to evict, the loop takes no ops, so stores
/// never outrun eviction.
async fn drain_loop(core: Rc<Core>) {
    let mut idle = IDLE_AFTER_WORK;
    // Gives back what applying ops freed once the shard is quiet (never the C heap:
    // trimming it takes locks).
    let mut release = crate::heap::Release::new(crate::heap::Heaps::Own);
    // Evictions as of the last warning, and when it was logged.
    let mut warned: (u64, Option<Instant>) = (0, None);
    // When the loop last let requests in, and last applied anything.
    let mut served = Instant::now();
    let mut worked = Instant::now();
    let mut bell = bell(&core);
    loop {
        // This loop wakes at least every PARKED_TICK: the slice follows the requests
        // within that.
        core.awake.relax();
        let (n, clearing, evicted) = {
            let mut shard = core.shard.borrow_mut();
            // While what it stored past the block budget is evicted, it takes no more.
            let n = if shard.evicting() {
                0
            } else {
                drain_pass(&core, &mut shard)
            };
            // The slot trackers are a cell of their own, apart from the shard.
            let n = n + take_replica_steps(&core);
            let clearing = shard.step_clears()
                | shard.step_budget()
                | shard.expire(crate::shard::predict::now_tick())
                | core.slot_tracker.borrow_mut().step(Instant::now());
            shard.sync_budget();
            (n, clearing, shard.evicted)
        };
        if evicted > warned.0 && warned.1.is_none_or(|t| t.elapsed() >= EVICTION_LOG_EVERY) {
            tracing::warn!(
                shard = core.id.0,
                evicted = evicted - warned.0,
                budget = core.app.block_budget().map(|b| b.max),
                "index at --max-blocks: evicting the blocks least recently stored or matched"
            );
            warned = (evicted, Some(Instant::now()));
        }
        if n == 0 && !clearing {
            release.idle();
            let rings = core.app.rings();
            // With predictions waiting, it parks only until the next is due.
            let wake = core
                .shard
                .borrow()
                .next_prediction_due()
                .map_or(PARKED_TICK, |t| {
                    crate::shard::predict::until(t).min(PARKED_TICK)
                });
            match bell.as_mut() {
                Some(b)
                    if worked.elapsed() >= PARK_AFTER
                        && wake >= PARK_AT_LEAST
                        && rings.try_park(core.id) =>
                {
                    if !wait_for_bell(b, wake).await {
                        tracing::warn!(shard = core.id.0, "ring bell broken: polling instead");
                        bell = None;
                    }
                    rings.unpark(core.id);
                }
                _ => {
                    glommio::timer::sleep(idle).await;
                    idle = (idle * 2).min(Duration::from_millis(2));
                }
            }
            served = Instant::now();
        } else {
            worked = Instant::now();
            idle = IDLE_AFTER_WORK;
            release.worked();
            // Requests that arrived meanwhile run before the next pass: at once
            // during a clear (its steps are what they would wait behind), else once
            // the passes since the last pause have run for SERVE_EVERY.
            if clearing || served.elapsed() >= SERVE_EVERY {
                let_requests_in().await;
                served = Instant::now();
            } else {
                glommio::yield_if_needed().await;
            }
        }
    }
}

/// Export the state and write it as a snapshot. Ordering, encoding and file I/O run
/// off the executor, which keeps serving. Returns when the file is durable.
async fn write_snapshot(core: &Core, path: std::path::PathBuf) {
    let t0 = Instant::now();
    let export = match crate::recovery::export::export(core).await {
        Ok(s) => s,
        Err(e) => {
            core.app
                .recovery_stats()
                .snapshot_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!("snapshot not written: {e}");
            return;
        }
    };
    let export_ms = t0.elapsed().as_millis() as u64;
    let r = core
        .offload(move || {
            let t = Instant::now();
            let state = export.into_state();
            let blocks = state.blocks();
            let image = crate::recovery::snapshot::encode(&state);
            drop(state);
            let encode_ms = t.elapsed().as_millis() as u64;
            crate::recovery::snapshot::write(&path, &image)
                .map(|_| (path, image.len(), encode_ms, blocks))
        })
        .await;
    let stats = core.app.recovery_stats();
    match r {
        Ok((path, bytes, encode_ms, blocks)) => {
            stats
                .snapshots_written
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                path = %path.display(),
                blocks,
                bytes,
                export_ms,
                encode_ms,
                took_ms = t0.elapsed().as_millis() as u64,
                "snapshot written"
            );
        }
        Err(e) => {
            stats
                .snapshot_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!("snapshot not written: {e}");
        }
    }
}

/// On core 0: periodic snapshots, SIGTERM/SIGINT (Draining, a final snapshot, exit
/// 0), SIGHUP (ignored, logged) and systemd's watchdog. No snapshot is taken before
/// startup recovery finished (it would be emptier than the one it replaces).
async fn lifecycle_loop(core: Rc<Core>) {
    let life = core.app.lifecycle();
    let cfg = core.app.snapshot_config().cloned();
    let mut next = cfg
        .as_ref()
        .filter(|c| !c.interval.is_zero())
        .map(|c| Instant::now() + c.interval);
    let watchdog = crate::lifecycle::watchdog_interval();
    let mut next_ping = Instant::now();
    loop {
        glommio::timer::sleep(Duration::from_millis(20)).await;
        let recovered = life.phase().serves_data();
        if life.terminate_requested() {
            life.drain();
            tracing::info!("draining: /ready answers 503");
            if let Some(c) = &cfg
                && recovered
            {
                write_snapshot(&core, c.path.clone()).await;
            }
            tracing::info!("terminating");
            std::process::exit(0);
        }
        if life.take_hangup() {
            tracing::info!(
                "SIGHUP ignored (kvix has no configuration to reload; logs go to stderr)"
            );
        }
        if let Some(every) = watchdog
            && Instant::now() >= next_ping
        {
            // Only when every core's executor ran its heartbeat recently: a wedged core
            // stops the keep-alives and systemd restarts the service.
            if life.all_cores_alive(life.stall_after().min(every / 2)) {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            }
            next_ping = Instant::now() + every / 4;
        }
        if let (Some(c), Some(at)) = (&cfg, next)
            && life.phase() == Phase::Ready
            && Instant::now() >= at
        {
            write_snapshot(&core, c.path.clone()).await;
            next = Some(Instant::now() + c.interval);
        }
    }
}

/// Every core: prove the executor runs (for `/ready` and the watchdog). A timer
/// task, so it beats only while the executor gets round to its tasks.
async fn heartbeat_loop(core: Rc<Core>) {
    let every = core.app.lifecycle().heartbeat_every();
    loop {
        core.app.lifecycle().heartbeat(core.id.0);
        glommio::timer::sleep(every).await;
    }
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
