//! Runtime glue: glommio executors, the shard mesh, scatter/gather transport.
//!
//! Owns everything glommio: one pinned `LocalExecutor` per shard, each running
//! (a) the drain loop that applies ring ops to its shard, (b) the mesh
//! endpoints that answer other cores' lookups, and (c) an HTTP server on the
//! shared port (`SO_REUSEPORT`). Shard state is only ever touched by its own
//! executor; other cores reach it by message.

pub mod io;

use crate::http;
use crate::metrics::{HttpStats, ShardStats};
use crate::query::{self, ShardReply};
use crate::service::App;
use crate::shard::{DumpedBlock, Shard};
use crate::types::{IndexId, SeqHash, ShardId};
use glommio::channels::channel_mesh::{MeshBuilder, Senders};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::{LocalExecutorPoolBuilder, PoolPlacement};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// A request from one core to another core's shard.
enum Req {
    Lookup { index: IndexId, seqs: Vec<SeqHash> },
    Dump { index: IndexId },
    Stats,
}

enum Rep {
    Lookup(ShardReply),
    Dump(Vec<DumpedBlock>),
    Stats(Box<ShardStats>),
}

enum Msg {
    Req(u64, Req),
    Rep(u64, Rep),
}

/// Per-executor context: this core's shard and its link to the others.
pub struct Core {
    pub id: ShardId,
    pub shards: usize,
    pub app: Arc<App>,
    shard: RefCell<Shard>,
    mesh: Senders<Msg>,
    pending: RefCell<HashMap<u64, LocalSender<Rep>>>,
    next_qid: Cell<u64>,
    /// This core's HTTP counters; core-local (no atomics), gathered on scrape.
    pub http_stats: RefCell<HttpStats>,
}

impl Core {
    fn answer(&self, req: Req) -> Rep {
        if matches!(req, Req::Dump { .. }) {
            // Apply everything already on the rings first, so a dump (or snapshot) taken
            // after the ingest threads reported their sequence numbers covers them.
            let mut shard = self.shard.borrow_mut();
            self.app
                .rings
                .drain(self.id, usize::MAX, |op| shard.apply(op));
        }
        let shard = self.shard.borrow();
        match req {
            Req::Stats => {
                let (blocks, tier_blocks) = shard.tier_counts();
                Rep::Stats(Box::new(ShardStats {
                    shard: self.id.0,
                    applied: shard.applied,
                    pending: self.app.rings.pending(self.id) as u64,
                    stalls: self.app.rings.stalls(self.id),
                    blocks,
                    tier_blocks,
                    heap_bytes: shard.heap_bytes() as u64,
                    http: self.http_stats.borrow().clone(),
                }))
            }
            Req::Lookup { index, seqs } => Rep::Lookup(query::answer(&shard, index, &seqs)),
            Req::Dump { index } => {
                let mut out = Vec::new();
                shard.dump(index, &mut out);
                Rep::Dump(out)
            }
        }
    }

    fn on_msg(self: &Rc<Self>, peer: usize, msg: Msg) {
        match msg {
            Msg::Req(qid, req) => {
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

    /// Send `req` to every shard and collect the replies by shard. Peers are asked
    /// first and our own part is answered while they work.
    async fn scatter(&self, mut reqs: Vec<Option<Req>>) -> Vec<Option<Rep>> {
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
                continue;
            }
            waits.push((i, rx));
        }
        if let Some(req) = reqs.get_mut(self.id.0).and_then(Option::take) {
            out[self.id.0] = Some(self.answer(req));
        }
        for (i, rx) in waits {
            out[i] = rx.recv().await;
        }
        out
    }

    /// Holders of `seqs` (any order), one reply per shard, every shard asked (for tree sizes).
    pub async fn lookup(&self, index: IndexId, seqs: &[SeqHash]) -> Vec<ShardReply> {
        let reqs = query::split(seqs, self.shards)
            .into_iter()
            .map(|seqs| Some(Req::Lookup { index, seqs }))
            .collect();
        self.scatter(reqs)
            .await
            .into_iter()
            .map(|r| match r {
                Some(Rep::Lookup(r)) => r,
                _ => ShardReply::default(),
            })
            .collect()
    }

    /// Every shard's figures, for `/metrics`.
    pub async fn stats(&self) -> Vec<ShardStats> {
        let reqs = (0..self.shards).map(|_| Some(Req::Stats)).collect();
        self.scatter(reqs)
            .await
            .into_iter()
            .flatten()
            .filter_map(|r| match r {
                Rep::Stats(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    /// Every (block, holder) of one index, from all shards.
    pub async fn dump(&self, index: IndexId) -> Vec<DumpedBlock> {
        let reqs = (0..self.shards)
            .map(|_| Some(Req::Dump { index }))
            .collect();
        let mut out = Vec::new();
        for r in self.scatter(reqs).await.into_iter().flatten() {
            if let Rep::Dump(mut v) = r {
                out.append(&mut v);
            }
        }
        out
    }
}

/// Drain this core's rings into its shard forever, napping 1–2 ms when they are empty.
/// Every park costs glommio a membarrier IPI to all cores; under event load, 250 µs
/// naps spent ~20% of samples there, and 1 ms naps applied ~10–15% more blocks/s.
/// A ring holds 16k ops, 8 ms of one producer at 2M ops/s, so a nap does not make a
/// producer wait (`kvix_ring_full_stalls_total` counts when it does); events become
/// visible at most one nap after they arrive.
async fn drain_loop(core: Rc<Core>) {
    let mut idle = Duration::from_millis(1);
    loop {
        let n = {
            let mut shard = core.shard.borrow_mut();
            core.app.rings.drain(core.id, 8192, |op| shard.apply(op))
        };
        if n == 0 {
            glommio::timer::sleep(idle).await;
            idle = (idle * 2).min(Duration::from_millis(2));
        } else {
            idle = Duration::from_millis(1);
            glommio::yield_if_needed().await;
        }
    }
}

/// Export the state and write it as a snapshot; the file I/O runs on a thread of its
/// own so the executor keeps serving. Returns when the file is durable.
async fn write_snapshot(core: &Core, path: std::path::PathBuf) {
    let t0 = std::time::Instant::now();
    let raw = crate::recovery::export::gather(core).await;
    let export_ms = t0.elapsed().as_millis() as u64;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // Ordering, encoding and file I/O off the executor: it keeps serving meanwhile.
    std::thread::spawn(move || {
        let t = std::time::Instant::now();
        let state = raw.into_state();
        let blocks = state.blocks();
        let image = crate::recovery::snapshot::encode(&state);
        drop(state);
        let encode_ms = t.elapsed().as_millis() as u64;
        let r = crate::recovery::snapshot::write(&path, &image)
            .map(|_| (path, image.len(), encode_ms, blocks));
        let _ = done_tx.send(r);
    });
    let r = loop {
        match done_rx.try_recv() {
            Ok(r) => break r,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                glommio::timer::sleep(Duration::from_millis(2)).await
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
        }
    };
    let stats = &core.app.recovery;
    match r {
        Ok((path, bytes, encode_ms, blocks)) => {
            stats
                .snapshots_written
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                path = %path.display(),
                blocks,
                bytes,
                gather_ms = export_ms,
                order_encode_ms = encode_ms,
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

/// On core 0: write a snapshot every `--snapshot-interval`, and on SIGTERM/SIGINT write a
/// final one and exit 0. No snapshot is taken before startup recovery finished (it
/// would be emptier than the one it replaces).
async fn snapshot_loop(core: Rc<Core>) {
    use std::sync::atomic::Ordering;
    let cfg = core.app.snapshot.clone();
    let mut next = cfg
        .as_ref()
        .filter(|c| !c.interval.is_zero())
        .map(|c| std::time::Instant::now() + c.interval);
    loop {
        glommio::timer::sleep(Duration::from_millis(20)).await;
        let recovered = core.app.recovered.load(Ordering::Acquire);
        if core.app.terminate.load(Ordering::Acquire) {
            if let Some(c) = &cfg
                && recovered
            {
                write_snapshot(&core, c.path.clone()).await;
            }
            tracing::info!("terminating");
            std::process::exit(0);
        }
        if let (Some(c), Some(at)) = (&cfg, next)
            && recovered
            && std::time::Instant::now() >= at
        {
            write_snapshot(&core, c.path.clone()).await;
            next = Some(std::time::Instant::now() + c.interval);
        }
    }
}

/// Start one executor per shard and serve HTTP on `addr` from all of them. Blocks.
/// An idle executor spins for `spin` before parking: a parked core needs a kernel
/// wake-up (tens of µs, milliseconds under load) when a peer scatters a query to it.
pub fn serve(app: Arc<App>, addr: SocketAddr, spin: Duration) -> std::io::Result<()> {
    let shards = app.rings.shards();
    let mesh = MeshBuilder::<Msg, _>::full(shards, 1024);
    let handles = LocalExecutorPoolBuilder::new(PoolPlacement::MaxSpread(shards, None))
        .name("kvix-core")
        .spin_before_park(spin)
        .on_all_shards(move || {
            let (app, mesh) = (app.clone(), mesh.clone());
            async move {
                let (senders, mut receivers) = mesh.join().await.expect("join shard mesh");
                let id = ShardId(senders.peer_id());
                let core = Rc::new(Core {
                    id,
                    shards,
                    app,
                    shard: RefCell::new(Shard::default()),
                    mesh: senders,
                    pending: RefCell::default(),
                    next_qid: Cell::new(0),
                    http_stats: RefCell::default(),
                });
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
                if id.0 == 0 {
                    glommio::spawn_local(snapshot_loop(core.clone())).detach();
                }
                if let Err(e) = http::serve(core, addr).await {
                    tracing::error!("HTTP server on {addr} failed: {e}");
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    handles.join_all();
    Ok(())
}
