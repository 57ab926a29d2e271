//! Runtime glue: glommio executors, the shard mesh, scatter/gather transport.
//!
//! Owns everything glommio: one pinned `LocalExecutor` per shard, each running
//! (a) the drain loop that applies ring ops to its shard, (b) the mesh
//! endpoints that answer other cores' lookups, and (c) an HTTP server on the
//! shared port (`SO_REUSEPORT`). Shard state is only ever touched by its own
//! executor; other cores reach it by message.

pub mod io;

use crate::http;
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
}

enum Rep {
    Lookup(ShardReply),
    Dump(Vec<DumpedBlock>),
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
}

impl Core {
    fn answer(&self, req: Req) -> Rep {
        let shard = self.shard.borrow();
        match req {
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

    /// Send `req` to every shard (answering our own directly) and collect the replies by shard.
    async fn scatter(&self, mut reqs: Vec<Option<Req>>) -> Vec<Option<Rep>> {
        let mut out: Vec<Option<Rep>> = (0..self.shards).map(|_| None).collect();
        let mut waits = Vec::new();
        for (i, req) in reqs.iter_mut().enumerate() {
            let Some(req) = req.take() else { continue };
            if i == self.id.0 {
                out[i] = Some(self.answer(req));
                continue;
            }
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

/// Drain this core's rings into its shard forever, sleeping 250 µs to 1 ms when idle
/// (every park costs glommio a membarrier IPI, so idle naps are not made shorter).
async fn drain_loop(core: Rc<Core>) {
    let mut idle = Duration::from_micros(250);
    loop {
        let n = {
            let mut shard = core.shard.borrow_mut();
            core.app.rings.drain(core.id, 8192, |op| shard.apply(op))
        };
        if n == 0 {
            glommio::timer::sleep(idle).await;
            idle = (idle * 2).min(Duration::from_millis(1));
        } else {
            idle = Duration::from_micros(250);
            glommio::yield_if_needed().await;
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
