//! Ingestion: ZMQ SUB sockets on dedicated threads, decode, hand off to rings.
//!
//! Owns the ingest threads and their listeners. Each thread polls its SUB
//! sockets, decodes frames ([`crate::wire`]), turns events into shard ops
//! ([`feed::WorkerFeed`]) and pushes them onto its rings. All listeners of one
//! instance live on one thread, so a clear and the stores after it stay in
//! order. Never runs on an executor, never blocks one.

pub mod feed;

use crate::registry::{Endpoint, ListenerOpts, Registry};
use crate::ring::{OpSink, RingSink, Rings};
use crate::shard::ShardOp;
use crate::types::{DpRank, EngineHash, IndexId, InstanceId, SeqHash, WorkerSlot};
use crate::wire::{self, Batch};
use feed::{FeedStats, WorkerFeed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Control messages to an ingest thread.
pub enum Command {
    Add {
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
        block_size: u32,
        endpoint: Endpoint,
        opts: ListenerOpts,
        done: mpsc::Sender<Result<Arc<FeedStats>, String>>,
    },
    /// Stop listeners of `instance` (one dp rank or all) and clear the slots they fed
    /// plus `also_clear` (slots the registry knows, e.g. dp ranks seen on the wire).
    Remove {
        index: IndexId,
        instance: InstanceId,
        dp: Option<DpRank>,
        also_clear: Vec<WorkerSlot>,
        done: mpsc::Sender<()>,
    },
    /// Report every (slot, sequence hash, engine hash) of `index`'s feeds.
    EngineHashes {
        index: IndexId,
        done: mpsc::Sender<Vec<(WorkerSlot, SeqHash, EngineHash)>>,
    },
    Shutdown,
}

/// One listener's identity and counters, for metrics.
pub type ListenerStats = (IndexId, InstanceId, DpRank, Arc<FeedStats>);

/// Handle to all ingest threads.
pub struct Ingest {
    senders: Vec<Mutex<mpsc::Sender<Command>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Stats of every listener ever started, for metrics.
    pub listeners: Mutex<Vec<ListenerStats>>,
}

impl Ingest {
    pub fn start(rings: Arc<Rings>, registry: Arc<Registry>) -> Arc<Self> {
        let ctx = zmq::Context::new();
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        for producer in 0..rings.producers() {
            let (tx, rx) = mpsc::channel();
            let sink = RingSink::new(rings.clone(), producer);
            let (ctx, registry) = (ctx.clone(), registry.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("kvix-ingest-{producer}"))
                    .spawn(move || {
                        IngestThread {
                            ctx,
                            rx,
                            sink,
                            registry,
                            listeners: Vec::new(),
                            since_trim: 0,
                        }
                        .run()
                    })
                    .expect("spawn ingest thread"),
            );
            senders.push(Mutex::new(tx));
        }
        Arc::new(Ingest {
            senders,
            threads: Mutex::new(threads),
            listeners: Mutex::default(),
        })
    }

    fn thread_for(&self, instance: InstanceId) -> usize {
        (instance % self.senders.len() as u64) as usize
    }

    fn send(&self, instance: InstanceId, cmd: Command) {
        let tx = self.senders[self.thread_for(instance)]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // A send fails only after shutdown, when nothing is left to do.
        let _ = tx.send(cmd);
    }

    /// Start a listener; returns once its socket is connected.
    pub fn add(
        &self,
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
        block_size: u32,
        endpoint: Endpoint,
        opts: ListenerOpts,
    ) -> Result<(), String> {
        let (done, rx) = mpsc::channel();
        self.send(
            instance,
            Command::Add {
                index,
                instance,
                dp,
                block_size,
                endpoint,
                opts,
                done,
            },
        );
        let stats = rx
            .recv()
            .map_err(|_| "ingest thread stopped".to_string())??;
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((index, instance, dp, stats));
        Ok(())
    }

    /// Stop listeners and clear their blocks; returns once the clears are queued.
    pub fn remove(
        &self,
        index: IndexId,
        instance: InstanceId,
        dp: Option<DpRank>,
        also_clear: Vec<WorkerSlot>,
    ) {
        let (done, rx) = mpsc::channel();
        self.send(
            instance,
            Command::Remove {
                index,
                instance,
                dp,
                also_clear,
                done,
            },
        );
        let _ = rx.recv();
    }

    /// Engine hashes of every block of `index`, per slot, from all ingest threads.
    pub fn engine_hashes(&self, index: IndexId) -> Vec<(WorkerSlot, SeqHash, EngineHash)> {
        let mut out = Vec::new();
        for tx in &self.senders {
            let (done, rx) = mpsc::channel();
            let sent = tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(Command::EngineHashes { index, done });
            if sent.is_ok()
                && let Ok(mut v) = rx.recv()
            {
                out.append(&mut v);
            }
        }
        out
    }

    pub fn shutdown(&self) {
        for tx in &self.senders {
            let _ = tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(Command::Shutdown);
        }
        for t in self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = t.join();
        }
    }
}

struct Listener {
    socket: zmq::Socket,
    endpoint: Endpoint,
    feed: WorkerFeed,
    batch: Batch,
    parts: [zmq::Message; 3],
    started: bool,
}

struct IngestThread {
    ctx: zmq::Context,
    rx: mpsc::Receiver<Command>,
    sink: RingSink,
    registry: Arc<Registry>,
    listeners: Vec<Listener>,
    /// Busy polls since the C heap was last trimmed.
    since_trim: u64,
}

/// Frames drained from one socket before the others get a turn.
const BURST: usize = 256;

impl IngestThread {
    fn run(mut self) {
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(Command::Shutdown) | Err(mpsc::TryRecvError::Disconnected) => return,
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                }
            }
            if self.listeners.is_empty() {
                match self.rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(Command::Shutdown) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
                continue;
            }
            let ready: Vec<bool> = {
                let mut items: Vec<zmq::PollItem<'_>> = self
                    .listeners
                    .iter()
                    .map(|l| l.socket.as_poll_item(zmq::POLLIN))
                    .collect();
                if let Err(e) = zmq::poll(&mut items, 5) {
                    tracing::warn!("zmq poll failed: {e}");
                    continue;
                }
                items.iter().map(|i| i.is_readable()).collect()
            };
            let busy = ready.iter().any(|r| *r);
            for (i, r) in ready.into_iter().enumerate() {
                if r {
                    self.drain(i);
                }
            }
            if busy {
                self.since_trim += 1;
            } else if self.since_trim > 0 {
                // libzmq buffers frames with the C allocator; after a burst, hand the
                // freed memory back to the OS instead of holding it for the next one.
                self.since_trim = 0;
                // SAFETY: malloc_trim only releases free heap pages; it touches no live allocation.
                unsafe {
                    libc::malloc_trim(0);
                }
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Add {
                index,
                instance,
                dp,
                block_size,
                endpoint,
                opts,
                done,
            } => {
                let r = self.connect(&endpoint.endpoint).map(|socket| {
                    let feed = WorkerFeed::with_opts(index, instance, dp, block_size, opts);
                    let stats = feed.stats.clone();
                    tracing::info!(instance, dp, endpoint = endpoint.endpoint, "listening");
                    self.listeners.push(Listener {
                        socket,
                        endpoint,
                        feed,
                        batch: Batch::default(),
                        parts: [
                            zmq::Message::new(),
                            zmq::Message::new(),
                            zmq::Message::new(),
                        ],
                        started: false,
                    });
                    stats
                });
                let _ = done.send(r);
            }
            Command::Remove {
                index,
                instance,
                dp,
                also_clear,
                done,
            } => {
                let mut cleared: Vec<(IndexId, WorkerSlot)> = Vec::new();
                self.listeners.retain_mut(|l| {
                    let f = &mut l.feed;
                    if f.instance != instance {
                        return true;
                    }
                    let stop = f.index == index && dp.is_none_or(|d| d == f.dp);
                    if !stop {
                        // Events may have fed this index under other dp ranks (batch dp
                        // override) or tenants (event tenant_id): forget just those.
                        cleared.extend(f.forget(index, dp));
                        return true;
                    }
                    cleared.extend(f.forget_all());
                    tracing::info!(
                        instance,
                        dp = f.dp,
                        endpoint = l.endpoint.endpoint,
                        "stopped listening"
                    );
                    false
                });
                cleared.extend(also_clear.into_iter().map(|s| (index, s)));
                cleared.sort();
                cleared.dedup();
                for (index, slot) in cleared {
                    self.sink.broadcast(ShardOp::ClearSlot {
                        index,
                        slot,
                        tiers: 0xff,
                    });
                }
                let _ = done.send(());
            }
            Command::EngineHashes { index, done } => {
                let mut out = Vec::new();
                for l in &self.listeners {
                    l.feed.engine_hashes(index, &mut out);
                }
                let _ = done.send(out);
            }
            Command::Shutdown => {}
        }
    }

    fn connect(&self, endpoint: &str) -> Result<zmq::Socket, String> {
        let s = self.ctx.socket(zmq::SUB).map_err(|e| e.to_string())?;
        // Losing frames is worse than memory: let libzmq buffer without a frame limit.
        s.set_rcvhwm(0).map_err(|e| e.to_string())?;
        s.set_subscribe(b"").map_err(|e| e.to_string())?;
        s.connect(endpoint)
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
        Ok(s)
    }

    fn drain(&mut self, i: usize) {
        let registry = self.registry.clone();
        let l = &mut self.listeners[i];
        for _ in 0..BURST {
            match recv_parts(&l.socket, &mut l.parts) {
                Ok(None) => return,
                Ok(Some(n)) => {
                    let stats = l.feed.stats.clone();
                    let parsed = if n != 3 {
                        Err(wire::WireError::FrameCount(n))
                    } else {
                        wire::split_seq(&l.parts[1])
                            .and_then(|seq| wire::decode(&l.parts[2], &mut l.batch).map(|_| seq))
                    };
                    match parsed {
                        Ok(seq) => {
                            let last = stats.last_seq.load(std::sync::atomic::Ordering::Relaxed);
                            if l.started && seq > last.wrapping_add(1) {
                                FeedStats::bump(&stats.gaps, 1);
                                tracing::warn!(
                                    instance = l.feed.instance,
                                    last,
                                    seq,
                                    "sequence gap"
                                );
                            }
                            l.started = true;
                            stats
                                .last_seq
                                .store(seq, std::sync::atomic::Ordering::Relaxed);
                            l.feed
                                .apply(&l.batch, &l.parts[2], &registry, &mut self.sink);
                        }
                        Err(e) => {
                            FeedStats::bump(&stats.malformed, 1);
                            tracing::warn!(
                                instance = l.feed.instance,
                                dp = l.feed.dp,
                                "malformed frame skipped: {e}"
                            );
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(instance = l.feed.instance, "zmq recv failed: {e}");
                    return;
                }
            }
        }
    }
}

/// Receive one multipart message into `parts` without blocking. Returns the part
/// count (extra parts beyond three are drained and counted), or `None` if nothing waits.
fn recv_parts(s: &zmq::Socket, parts: &mut [zmq::Message; 3]) -> Result<Option<usize>, zmq::Error> {
    match s.recv(&mut parts[0], zmq::DONTWAIT) {
        Err(zmq::Error::EAGAIN) => return Ok(None),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    let mut n = 1;
    let mut spare = zmq::Message::new();
    while s.get_rcvmore()? {
        // The rest of a multipart message is already queued; this does not block.
        let dst = if n < 3 { &mut parts[n] } else { &mut spare };
        s.recv(dst, 0)?;
        n += 1;
    }
    Ok(Some(n))
}
