//! Ingestion: ZMQ SUB sockets on dedicated threads, decode, hand off to rings.
//!
//! Owns the ingest threads and their listeners. Each thread polls its SUB
//! sockets, decodes frames ([`crate::wire`]), turns events into shard ops
//! ([`feed::WorkerFeed`]) and pushes them onto its rings. All listeners of one
//! instance live on one thread, so a clear and the stores after it stay in
//! order. Never runs on an executor, never blocks one: the [`Ingest`] handle's calls
//! wait for the thread's reply, so executors make them through
//! `ShardMesh::offload`.

pub mod bind;
pub mod feed;
pub mod replay;
pub mod sequence;
pub mod wake;

use crate::registry::{Endpoint, ListenerOpts, Registry};
use crate::ring::{OpSink, RingSink, Rings};
use crate::shard::ShardOp;
use crate::types::{DpRank, IndexId, InstanceId, WorkerSlot};
use crate::wire::{self, Batch};
use feed::{FeedStats, SeedBlock, SeedGroups, WorkerFeed};
use sequence::{Cursor, Step};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use wake::{CommandTx, Wake};

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
    /// Seed one worker's feed from a dump or snapshot (see [`WorkerFeed::seed`]).
    Seed {
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
        blocks: Vec<SeedBlock>,
        groups: SeedGroups,
        replace: bool,
        done: mpsc::Sender<SeedOutcome>,
    },
    /// Report the last batch sequence number of every endpoint this thread has heard.
    Seqs {
        done: mpsc::Sender<Vec<SeqRecord>>,
    },
    /// Set an endpoint's last sequence number (from a snapshot), as if heard.
    RestoreSeq {
        key: SeqKey,
        seq: u64,
    },
    /// Replay, for every listener with a replay endpoint and a known last sequence,
    /// everything after it (after a snapshot load).
    CatchUp {
        done: mpsc::Sender<()>,
    },
    /// Bind a SUB socket that pods' publishers connect to (`--zmq-bind`).
    Bind {
        endpoint: String,
        opts: bind::BindOpts,
        done: mpsc::Sender<Result<(), String>>,
    },
    Shutdown,
}

/// Identifies an engine stream across unregister/register: (instance, dp rank, endpoint).
pub type SeqKey = (InstanceId, DpRank, String);
pub type SeqRecord = (SeqKey, u64);

/// What a seed did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedOutcome {
    /// Seeded; this many blocks skipped (the rank has no slot). A block whose
    /// parent its shard cannot find is counted there, as an unknown parent.
    Seeded { skipped: u64 },
    /// No listener of that worker on this thread: nothing seeded.
    NoListener,
}

/// Replay counters, shared by all ingest threads; written only when a gap is handled
/// (rare), never per frame.
#[derive(Default, Debug)]
pub struct ReplayStats {
    pub requests: AtomicU64,
    pub failures: AtomicU64,
    pub batches: AtomicU64,
    pub duplicates: AtomicU64,
    /// Missing batches a replay could not return (gone from the engine's buffer).
    pub unrecovered: AtomicU64,
    /// Streams whose first frame was above 0, replayed from 0 (a cold start).
    pub cold_starts: AtomicU64,
}

/// How long an engine gets to answer a replay request before the gap is given up.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(3);
/// After an unanswered replay, how long a listener's gaps are only counted, not replayed.
pub const REPLAY_COOLDOWN: Duration = Duration::from_secs(10);
/// One listener's identity and counters, for metrics.
pub type ListenerStats = (IndexId, InstanceId, DpRank, Arc<FeedStats>);

/// How the ingest threads' SUB sockets are set up.
#[derive(Clone, Copy, Debug)]
pub struct SocketOptions {
    /// Frames a SUB socket buffers before libzmq drops new ones. Bounded so that an
    /// overload costs bounded memory: dropped batches show up as sequence gaps, which
    /// are counted and replayed where the engine has a replay endpoint.
    pub rcvhwm: i32,
    /// Largest message part an engine may send (`ZMQ_MAXMSGSIZE`), on every SUB and
    /// replay socket.
    pub max_msg_bytes: i64,
}

/// A SUB socket to every topic, set up as `opts` says, not yet connected.
fn subscriber(ctx: &zmq::Context, opts: SocketOptions) -> zmq::Result<zmq::Socket> {
    let s = ctx.socket(zmq::SUB)?;
    s.set_rcvhwm(opts.rcvhwm)?;
    // Nor without a size limit: libzmq drops a connection that announces a larger
    // part before buffering it; the frames lost meanwhile show up as a sequence gap
    // (replayed when the engine can).
    s.set_maxmsgsize(opts.max_msg_bytes)?;
    // An engine that is down is retried at growing intervals, up to a second, so
    // that many stopped engines do not keep an ingest thread busy connecting
    // (libzmq's default retries each one every 100 ms forever).
    s.set_reconnect_ivl_max(RECONNECT_MAX_MS)?;
    s.set_subscribe(b"")?;
    Ok(s)
}

/// Default `--zmq-max-msg-bytes`: far above the largest real batch (a few MiB of
/// token ids), far below what would hurt to buffer.
pub const DEFAULT_MAX_MSG_BYTES: u64 = 64 * 1024 * 1024;

/// Longest wait, in milliseconds, between two attempts to reach an engine that is
/// down (libzmq doubles the wait from 100 ms up to this).
const RECONNECT_MAX_MS: i32 = 1000;

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            rcvhwm: 10_000,
            max_msg_bytes: DEFAULT_MAX_MSG_BYTES as i64,
        }
    }
}

/// Handle to all ingest threads.
pub struct Ingest {
    /// Any thread may send without a lock (`mpsc::Sender` is `Sync`).
    senders: Vec<CommandTx<Command>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Stats of every listener and pod stream ever started, for metrics.
    pub listeners: Arc<Mutex<Vec<ListenerStats>>>,
    /// Which thread feeds each pod heard on a bound socket.
    pods: Arc<bind::PodThreads>,
    /// What the bound sockets skipped.
    pub bind_stats: Arc<bind::BindStats>,
    /// While set, ingest threads run commands but leave SUB sockets unread (ZMQ buffers
    /// the frames): startup recovery seeds state first, then live frames apply on top.
    pub paused: Arc<AtomicBool>,
    pub replay_stats: Arc<ReplayStats>,
}

impl Ingest {
    pub fn start(rings: Arc<Rings>, registry: Arc<Registry>, sockets: SocketOptions) -> Arc<Self> {
        let ctx = zmq::Context::new();
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        let paused = Arc::new(AtomicBool::new(false));
        let replay_stats = Arc::new(ReplayStats::default());
        let listener_stats: Arc<Mutex<Vec<ListenerStats>>> = Arc::default();
        let pods: Arc<bind::PodThreads> = Arc::default();
        let bind_stats: Arc<bind::BindStats> = Arc::default();
        for producer in 0..rings.producers() {
            let (tx, rx) = mpsc::channel();
            let wake = Arc::new(Wake::new().expect("eventfd for an ingest thread"));
            let sink = RingSink::new(rings.clone(), producer);
            let (ctx, registry) = (ctx.clone(), registry.clone());
            let (paused, replay_stats) = (paused.clone(), replay_stats.clone());
            let thread_wake = wake.clone();
            let (stats_list, thread_pods, thread_bind_stats) =
                (listener_stats.clone(), pods.clone(), bind_stats.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("kvix-ingest-{producer}"))
                    .spawn(move || {
                        IngestThread {
                            ctx,
                            rx,
                            wake: thread_wake,
                            sink,
                            registry,
                            listeners: Vec::new(),
                            scratch: Scratch::default(),
                            last_seq: HashMap::new(),
                            paused,
                            replay_stats,
                            release: crate::heap::Release::new(crate::heap::Heaps::OwnAndC),
                            sockets,
                            id: producer,
                            binds: Vec::new(),
                            bind_stats: thread_bind_stats,
                            pods: thread_pods,
                            listener_stats: stats_list,
                        }
                        .run()
                    })
                    .expect("spawn ingest thread"),
            );
            senders.push(CommandTx::new(tx, wake));
        }
        Arc::new(Ingest {
            senders,
            threads: Mutex::new(threads),
            listeners: listener_stats,
            pods,
            bind_stats,
            paused,
            replay_stats,
        })
    }

    /// The thread of `instance`'s listeners: the one that heard it on a bound socket,
    /// else one chosen by its id.
    fn thread_for(&self, instance: InstanceId) -> usize {
        self.pods
            .thread_of(instance)
            .unwrap_or((instance % self.senders.len() as InstanceId) as usize)
    }

    /// Bind a SUB socket at `endpoint` for pods to publish to, on thread
    /// `ordinal` modulo the threads; returns once it is bound.
    pub fn bind(&self, ordinal: usize, endpoint: &str, opts: bind::BindOpts) -> Result<(), String> {
        let (done, rx) = mpsc::channel();
        let _ = self.senders[ordinal % self.senders.len()].send(Command::Bind {
            endpoint: endpoint.to_string(),
            opts,
            done,
        });
        rx.recv().map_err(|_| "ingest thread stopped".to_string())?
    }

    fn send(&self, instance: InstanceId, cmd: Command) {
        // A send fails only after shutdown, when nothing is left to do.
        let _ = self.senders[self.thread_for(instance)].send(cmd);
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

    /// Seed one worker from a dump or snapshot; returns once its ops are on the rings.
    pub fn seed(
        &self,
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
        blocks: Vec<SeedBlock>,
        groups: SeedGroups,
        replace: bool,
    ) -> SeedOutcome {
        let (done, rx) = mpsc::channel();
        self.send(
            instance,
            Command::Seed {
                index,
                instance,
                dp,
                blocks,
                groups,
                replace,
                done,
            },
        );
        rx.recv().unwrap_or(SeedOutcome::NoListener)
    }

    /// Last sequence number per engine stream, from every ingest thread.
    pub fn seqs(&self) -> Vec<SeqRecord> {
        let mut out = Vec::new();
        for tx in &self.senders {
            let (done, rx) = mpsc::channel();
            let sent = tx.send(Command::Seqs { done });
            if sent.is_ok()
                && let Ok(mut v) = rx.recv()
            {
                out.append(&mut v);
            }
        }
        out
    }

    pub fn restore_seq(&self, key: SeqKey, seq: u64) {
        let instance = key.0;
        self.send(instance, Command::RestoreSeq { key, seq });
    }

    /// Replay what every replayable listener missed since its last known sequence.
    pub fn catch_up(&self) {
        for tx in &self.senders {
            let (done, rx) = mpsc::channel();
            let sent = tx.send(Command::CatchUp { done });
            if sent.is_ok() {
                let _ = rx.recv();
            }
        }
    }

    pub fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::Release);
    }

    pub fn shutdown(&self) {
        for tx in &self.senders {
            let _ = tx.send(Command::Shutdown);
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
    /// PAIR end of `socket`'s monitor: tells when its connection dropped.
    monitor: zmq::Socket,
    endpoint: Endpoint,
    feed: WorkerFeed,
    /// After a replay, `(after, until)`: live frames numbered above `after` and up to
    /// `until` were queued while it ran and applied from it, so they are skipped as
    /// duplicates. A frame at or below `after` is none of those (the engine
    /// restarted) and follows the cursor's rule.
    dedup: Option<(Option<u64>, u64)>,
    /// When a restart last made this listener replay: a restart replays at most once
    /// per [`REPLAY_COOLDOWN`], so an engine whose numbers keep going back cannot
    /// keep this thread replaying.
    restart_replayed_at: Option<std::time::Instant>,
    /// When a replay of this listener last went unanswered: no new replay is tried for
    /// [`REPLAY_COOLDOWN`] after it, so an engine that cannot keep up with replays does
    /// not keep this thread from live frames (the gaps stay counted).
    replay_failed_at: Option<std::time::Instant>,
    /// Last batch sequence applied; authoritative while the listener lives (no map
    /// lookup per frame), saved to the thread's map when it stops.
    cursor: Cursor,
}

/// Bytes of decoding scratch a vector keeps once its thread goes quiet: what a
/// frame of a few thousand blocks needs, so a steady stream reuses it.
const SCRATCH_KEEP: usize = 64 * 1024;

/// One frame's parts and its decoding.
struct Scratch {
    batch: Batch,
    parts: [zmq::Message; 3],
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            batch: Batch::default(),
            parts: [
                zmq::Message::new(),
                zmq::Message::new(),
                zmq::Message::new(),
            ],
        }
    }
}

impl Scratch {
    /// Gives back what a burst's largest frames grew: the decoded vectors, and the
    /// last frame libzmq allocated.
    fn trim(&mut self) {
        self.batch.trim(SCRATCH_KEEP);
        self.parts = [
            zmq::Message::new(),
            zmq::Message::new(),
            zmq::Message::new(),
        ];
    }
}

struct IngestThread {
    ctx: zmq::Context,
    rx: mpsc::Receiver<Command>,
    /// Rung with every command: polled beside the SUB sockets.
    wake: Arc<Wake>,
    sink: RingSink,
    registry: Arc<Registry>,
    listeners: Vec<Listener>,
    /// The frame being handled and its decoding, shared by the listeners (a frame
    /// is decoded and applied before the next is received), so that this thread's
    /// scratch is the size of its largest recent frame, not that times its
    /// listeners; trimmed when the thread goes quiet ([`Scratch::trim`]).
    scratch: Scratch,
    /// Last sequence per engine stream of stopped (or not yet started) listeners; it
    /// outlives them so that re-registering a worker after a gap still detects (and
    /// replays) it, as Dynamo does.
    last_seq: HashMap<SeqKey, u64>,
    paused: Arc<AtomicBool>,
    replay_stats: Arc<ReplayStats>,
    /// When this thread last worked, to give back what work freed once quiet.
    release: crate::heap::Release,
    sockets: SocketOptions,
    /// This thread's number (its rings' producer id).
    id: usize,
    /// Bound sockets pods publish to, with their pods' streams.
    binds: Vec<bind::Bound>,
    bind_stats: Arc<bind::BindStats>,
    pods: Arc<bind::PodThreads>,
    /// The [`Ingest`]'s list of stats, for pod streams opened here.
    listener_stats: Arc<Mutex<Vec<ListenerStats>>>,
}

/// Frames drained from one socket before the others get a turn.
const BURST: usize = 256;

/// How long a poll waits for frames: briefly while frames flow, then longer and
/// longer while none come (commands wake the thread at once whatever the wait).
const POLL_BUSY: Duration = Duration::from_millis(5);
const POLL_IDLE_MAX: Duration = Duration::from_millis(200);

impl IngestThread {
    fn run(mut self) {
        let mut wait = POLL_BUSY;
        loop {
            loop {
                match self.rx.try_recv() {
                    Ok(Command::Shutdown) | Err(mpsc::TryRecvError::Disconnected) => return,
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                }
            }
            if (self.listeners.is_empty() && self.binds.is_empty())
                || self.paused.load(Ordering::Acquire)
            {
                match self.rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(Command::Shutdown) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        self.quiet();
                    }
                }
                continue;
            }
            // The wake-up, then per listener: its SUB socket, then its monitor; then
            // the bound sockets.
            let ready: Vec<bool> = {
                let wake = zmq::PollItem::from_fd(self.wake.fd(), zmq::POLLIN);
                let mut items: Vec<zmq::PollItem<'_>> = std::iter::once(wake)
                    .chain(self.listeners.iter().flat_map(|l| {
                        [
                            l.socket.as_poll_item(zmq::POLLIN),
                            l.monitor.as_poll_item(zmq::POLLIN),
                        ]
                    }))
                    .chain(
                        self.binds
                            .iter()
                            .map(|b| b.socket.as_poll_item(zmq::POLLIN)),
                    )
                    .collect();
                if let Err(e) = zmq::poll(&mut items, wait.as_millis() as i64) {
                    tracing::warn!("zmq poll failed: {e}");
                    continue;
                }
                if items[0].is_readable() {
                    // Commands are taken at the top of the loop.
                    self.wake.clear();
                }
                items[1..].iter().map(|i| i.is_readable()).collect()
            };
            let busy = ready.iter().any(|r| *r);
            wait = if busy {
                POLL_BUSY
            } else {
                (wait * 2).min(POLL_IDLE_MAX)
            };
            let (listeners, binds) = ready.split_at(2 * self.listeners.len());
            for (i, r) in listeners.chunks_exact(2).enumerate() {
                if r[0] {
                    self.drain(i);
                }
                if r[1] {
                    self.check_connection(i);
                }
            }
            for (b, r) in binds.iter().enumerate() {
                if *r {
                    self.drain_bound(b);
                }
            }
            self.sink.flush();
            if busy {
                self.release.worked();
            } else {
                self.quiet();
            }
        }
    }

    /// Nothing to do: after a burst, hand what it freed and what it grew for its
    /// largest frames (libzmq's frames, decoding scratch) back to the OS instead
    /// of holding it for the next one.
    fn quiet(&mut self) {
        let (scratch, listeners) = (&mut self.scratch, &mut self.listeners);
        self.release.idle_then(|| {
            scratch.trim();
            for l in listeners.iter_mut() {
                l.feed.trim_scratch(SCRATCH_KEEP);
            }
        });
    }

    fn command(&mut self, cmd: Command) {
        // A command may free (a removed listener) or grow (a seed) this thread's heap.
        self.release.worked();
        // A command may answer (sequence numbers, "done"): ops pushed before it must be
        // visible to the shards by then, and so must ops it pushes itself (flushed again
        // before those answers).
        self.sink.flush();
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
                let feed = WorkerFeed::with_opts(index, instance, dp, block_size, opts);
                let r = self.listen(feed, endpoint);
                self.sink.flush();
                let _ = done.send(r);
            }
            Command::Remove {
                index,
                instance,
                dp,
                also_clear,
                done,
            } => {
                self.stop_listening(index, instance, dp, also_clear);
                self.sink.flush();
                let _ = done.send(());
            }
            Command::Seed {
                index,
                instance,
                dp,
                blocks,
                groups,
                replace,
                done,
            } => {
                let r = match self.seed_listener(index, instance, dp) {
                    Some(i) => {
                        let registry = self.registry.clone();
                        let feed = &mut self.listeners[i].feed;
                        let sink = &mut self.sink;
                        let seeded =
                            feed.seed(index, dp, (&blocks, &groups), replace, &registry, sink);
                        SeedOutcome::Seeded {
                            skipped: if seeded { 0 } else { blocks.len() as u64 },
                        }
                    }
                    None => SeedOutcome::NoListener,
                };
                self.sink.flush();
                let _ = done.send(r);
            }
            Command::Seqs { done } => {
                let mut all = self.last_seq.clone();
                for l in &self.listeners {
                    if let Some(seq) = l.cursor.last() {
                        all.insert(seq_key(l), seq);
                    }
                }
                let _ = done.send(all.into_iter().collect());
            }
            Command::RestoreSeq { key, seq } => {
                for l in &mut self.listeners {
                    if seq_key(l) == key {
                        l.cursor = Cursor::new(Some(seq));
                    }
                }
                self.last_seq.insert(key, seq);
            }
            Command::CatchUp { done } => {
                for i in 0..self.listeners.len() {
                    let l = &self.listeners[i];
                    // After the last possible number nothing can be missing.
                    if l.endpoint.replay_endpoint.is_some()
                        && let Some(from) = l.cursor.last().and_then(|x| x.checked_add(1))
                    {
                        self.replay(i, from, None);
                    }
                }
                self.sink.flush();
                let _ = done.send(());
            }
            Command::Bind {
                endpoint,
                opts,
                done,
            } => {
                let r = bind::bind_socket(&self.ctx, self.sockets, &endpoint).map(|socket| {
                    tracing::info!(endpoint, "bound for pods' publishers");
                    self.binds.push(bind::Bound::new(socket, endpoint, opts));
                });
                let _ = done.send(r);
            }
            Command::Shutdown => {}
        }
    }

    /// Subscribe to `endpoint` for `feed`'s worker; its sequence numbers carry on
    /// from the last one heard there.
    fn listen(&mut self, feed: WorkerFeed, endpoint: Endpoint) -> Result<Arc<FeedStats>, String> {
        let (instance, dp) = (feed.instance, feed.dp);
        let prior = self
            .last_seq
            .get(&(instance, dp, endpoint.endpoint.clone()))
            .copied();
        let (socket, monitor) = self.connect(&endpoint.endpoint)?;
        let stats = feed.stats.clone();
        tracing::info!(instance, dp, endpoint = endpoint.endpoint, "listening");
        self.listeners.push(Listener {
            socket,
            monitor,
            endpoint,
            feed,
            dedup: None,
            restart_replayed_at: None,
            replay_failed_at: None,
            cursor: Cursor::new(prior),
        });
        Ok(stats)
    }

    /// Stop the listeners of `instance` in `index` (one dp rank or all), keep their
    /// last sequence numbers, and clear every slot they fed plus `also_clear`.
    fn stop_listening(
        &mut self,
        index: IndexId,
        instance: InstanceId,
        dp: Option<DpRank>,
        also_clear: Vec<WorkerSlot>,
    ) {
        let mut cleared: Vec<(IndexId, WorkerSlot)> = Vec::new();
        let mut saved = Vec::new();
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
            if let Some(seq) = l.cursor.last() {
                saved.push(((f.instance, f.dp, l.endpoint.endpoint.clone()), seq));
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
        self.last_seq.extend(saved);
        for b in &mut self.binds {
            cleared.extend(b.remove(index, instance, dp));
        }
        cleared.extend(also_clear.into_iter().map(|s| (index, s)));
        cleared.sort();
        cleared.dedup();
        for (index, slot) in cleared {
            self.sink.push(ShardOp::ClearSlot {
                index,
                slot,
                tiers: crate::types::TierSet::ALL,
            });
        }
    }

    /// The listener whose feed a seed of (`index`, `instance`, `dp`) goes to: the
    /// rank's own, else the one that saw the rank on the wire, else any of the
    /// instance's in that index.
    fn seed_listener(&self, index: IndexId, instance: InstanceId, dp: DpRank) -> Option<usize> {
        let of = |l: &Listener| l.feed.index == index && l.feed.instance == instance;
        self.listeners
            .iter()
            .position(|l| of(l) && l.feed.dp == dp)
            .or_else(|| {
                // A rank seen only on the wire (batch dp override) lives in the feed
                // of one of the instance's registered ranks.
                self.listeners
                    .iter()
                    .position(|l| of(l) && l.feed.slots().any(|(ix, d, _)| ix == index && d == dp))
            })
            .or_else(|| self.listeners.iter().position(of))
    }

    /// A SUB socket connected to `endpoint`, and the PAIR socket its monitor reports
    /// dropped connections on.
    fn connect(&self, endpoint: &str) -> Result<(zmq::Socket, zmq::Socket), String> {
        static MONITORS: AtomicU64 = AtomicU64::new(0);
        let s = subscriber(&self.ctx, self.sockets).map_err(|e| e.to_string())?;
        let at = format!(
            "inproc://kvix-monitor-{}",
            MONITORS.fetch_add(1, Ordering::Relaxed)
        );
        s.monitor(&at, zmq::SocketEvent::DISCONNECTED as i32)
            .map_err(|e| e.to_string())?;
        let monitor = self.ctx.socket(zmq::PAIR).map_err(|e| e.to_string())?;
        monitor.connect(&at).map_err(|e| e.to_string())?;
        s.connect(endpoint)
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
        Ok((s, monitor))
    }

    /// Read listener `i`'s monitor; if its connection dropped, take what the socket
    /// still holds and open a fresh one. libzmq reconnects by itself after a network
    /// error, but after a protocol error (a part over `ZMQ_MAXMSGSIZE`, a corrupt
    /// stream) it closes that connection for good: a fresh socket is the one way back.
    /// What the engine sent meanwhile is lost to it and shows up as a sequence gap.
    fn check_connection(&mut self, i: usize) {
        let mut dropped = false;
        while let Ok(frames) = self.listeners[i].monitor.recv_multipart(zmq::DONTWAIT) {
            let event = frames
                .first()
                .and_then(|f| f.get(..2))
                .map(|b| u16::from_le_bytes([b[0], b[1]]));
            dropped |= event == Some(zmq::SocketEvent::DISCONNECTED as u16);
        }
        if !dropped {
            return;
        }
        // Frames received before the drop are still queued: apply them first.
        let queued = |l: &Listener| l.socket.get_events().is_ok_and(|e| e.contains(zmq::POLLIN));
        for _ in 0..64 {
            if !queued(&self.listeners[i]) {
                break;
            }
            self.drain(i);
        }
        let endpoint = self.listeners[i].endpoint.endpoint.clone();
        let l = &self.listeners[i];
        tracing::warn!(
            instance = l.feed.instance,
            dp = l.feed.dp,
            endpoint,
            "engine connection dropped (oversized or corrupt message, or the engine went away); reconnecting"
        );
        match self.connect(&endpoint) {
            Ok((socket, monitor)) => {
                let l = &mut self.listeners[i];
                l.socket = socket;
                l.monitor = monitor;
            }
            Err(e) => tracing::error!(endpoint, "cannot reconnect: {e}"),
        }
    }

    fn drain(&mut self, i: usize) {
        for _ in 0..BURST {
            let mut pending = None;
            if !self.drain_one(i, &mut pending) {
                return;
            }
            if let Some((seq, well_formed)) = pending {
                self.sequenced(i, seq, well_formed);
            }
        }
    }

    /// Decide what a frame with sequence `seq` means: duplicate of a replay, or a
    /// [`Step`] of the listener's cursor. A gap is replayed from the engine's buffer
    /// when it has a replay endpoint; so is a stream's first frame above 0 (the engine
    /// published before kvix listened: a cold start) and a restart's first frame above
    /// 0. A `well_formed` frame was decoded into the listener's batch and is applied; a
    /// malformed one (its sequence readable, its payload not) was still received, so it
    /// advances the sequence and the next frame is no gap.
    fn sequenced(&mut self, i: usize, seq: u64, well_formed: bool) {
        let l = &mut self.listeners[i];
        if let Some((after, until)) = l.dedup {
            if seq <= until && after.is_none_or(|a| seq > a) {
                FeedStats::bump(&self.replay_stats.duplicates, 1);
                return;
            }
            l.dedup = None;
        }
        let step = l.cursor.step(seq);
        l.feed.stats.count(step);
        let (instance, dp) = (l.feed.instance, l.feed.dp);
        // The first missing sequence number, if any batch before this one is missing.
        let missing_from = match step {
            Step::Next => None,
            Step::Gap { after, missing } => {
                crate::warn_throttled!(instance, dp, last = after, seq, missing, "sequence gap");
                Some(after + 1)
            }
            Step::Restart { last } => {
                crate::warn_throttled!(
                    instance,
                    dp,
                    last,
                    seq,
                    "sequence went back: engine restarted; its blocks are kept and its stream starts over"
                );
                l.cursor.reset();
                (seq > 0).then_some(0)
            }
            Step::First => {
                if seq > 0 && l.endpoint.replay_endpoint.is_some() {
                    FeedStats::bump(&self.replay_stats.cold_starts, 1);
                    tracing::info!(
                        instance,
                        dp,
                        seq,
                        "first batch above 0: replaying the engine's buffer from 0"
                    );
                }
                (seq > 0).then_some(0)
            }
        };
        let recent =
            |t: Option<std::time::Instant>| t.is_some_and(|t| t.elapsed() < REPLAY_COOLDOWN);
        let restart = matches!(step, Step::Restart { .. });
        let cooling = recent(l.replay_failed_at) || (restart && recent(l.restart_replayed_at));
        if let Some(from) = missing_from
            && l.endpoint.replay_endpoint.is_some()
            && !cooling
        {
            // Up to this frame, what the replay cannot return is counted as missing
            // by the gap already, or is no gap (a cold start's or a restart's earlier
            // batches were never part of a stream kvix followed).
            let counted = Some(seq - 1);
            // The held frame is in the scratch, which the replay decodes into, so
            // keep a copy of the frame and decode it again afterwards.
            let held = self.scratch.parts[2].to_vec();
            if restart {
                self.listeners[i].restart_replayed_at = Some(std::time::Instant::now());
            }
            self.replay(i, from, counted);
            let l = &mut self.listeners[i];
            // Frames queued behind this one are numbered above it.
            l.dedup = l.dedup.map(|(_, until)| (Some(seq), until));
            if l.cursor.last().is_some_and(|x| seq <= x) {
                FeedStats::bump(&self.replay_stats.duplicates, 1);
                return;
            }
            let batch = &mut self.scratch.batch;
            if well_formed && wire::decode(&held, batch).is_ok() {
                l.feed.apply(batch, &held, &self.registry, &mut self.sink);
            }
            l.feed.stats.received(&mut l.cursor, seq);
            return;
        }
        let l = &mut self.listeners[i];
        l.feed.stats.received(&mut l.cursor, seq);
        if !well_formed {
            return;
        }
        l.feed.apply(
            &self.scratch.batch,
            &self.scratch.parts[2],
            &self.registry,
            &mut self.sink,
        );
    }

    /// Receive and decode one frame. Returns false when the socket has nothing more.
    /// `pending` gets the frame's sequence number, when it has a readable one, and
    /// whether its payload decoded.
    fn drain_one(&mut self, i: usize, pending: &mut Option<(u64, bool)>) -> bool {
        let l = &mut self.listeners[i];
        let Scratch { batch, parts } = &mut self.scratch;
        match recv_parts(&l.socket, parts) {
            Ok(None) => false,
            Ok(Some(n)) => {
                let seq = if n != 3 {
                    Err(wire::WireError::FrameCount(n))
                } else {
                    wire::split_seq(&parts[1])
                };
                // Sequence bookkeeping may need a replay (which borrows the whole
                // thread), so the caller does it outside this borrow.
                let parsed = seq.and_then(|seq| {
                    *pending = Some((seq, false));
                    wire::decode(&parts[2], batch).map(|_| seq)
                });
                match parsed {
                    Ok(seq) => *pending = Some((seq, true)),
                    Err(e) => {
                        FeedStats::bump(&l.feed.stats.malformed, 1);
                        crate::warn_throttled!(
                            instance = l.feed.instance,
                            dp = l.feed.dp,
                            "malformed frame skipped: {e}"
                        );
                    }
                }
                true
            }
            Err(e) => {
                crate::warn_throttled!(instance = l.feed.instance, "zmq recv failed: {e}");
                false
            }
        }
    }
}

fn seq_key(l: &Listener) -> SeqKey {
    (l.feed.instance, l.feed.dp, l.endpoint.endpoint.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers_bound_their_queue_and_back_off_from_a_stopped_engine() {
        let ctx = zmq::Context::new();
        let opts = SocketOptions {
            rcvhwm: 123,
            max_msg_bytes: 4567,
        };
        let s = subscriber(&ctx, opts).unwrap();
        assert_eq!(s.get_rcvhwm().unwrap(), 123);
        assert_eq!(s.get_maxmsgsize().unwrap(), 4567);
        assert_eq!(s.get_reconnect_ivl_max().unwrap(), RECONNECT_MAX_MS);
        assert!(s.get_reconnect_ivl().unwrap() < RECONNECT_MAX_MS);
    }
}
