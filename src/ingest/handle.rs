//! The handle to the ingest threads: the commands they take, their shared
//! counters, and [`Ingest`], which starts the threads and talks to them.
//!
//! Owns no socket and never blocks an executor: each call that waits for a thread's
//! reply is made off the executors (`ShardMesh::offload`).

use super::feed::{FeedStats, SeedBlock, SeedGroups, WorkerFeed};
use super::thread::{IngestThread, Scratch};
use super::wake::{CommandTx, Wake};
use super::{SocketOptions, bind};
use crate::registry::{Endpoint, ListenerOpts, Registry};
use crate::ring::{RingSink, Rings};
use crate::types::{DpRank, IndexId, InstanceId, WorkerSlot};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Why a listener did not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Every engine the open-file budget allows is listened to.
    #[error(
        "kvix already listens to {limit} engines, the most its open-file limit allows \
         (two descriptors each, the rest kept for HTTP, or --max-engines); raise \
         LimitNOFILE= in the systemd unit (or `ulimit -n`) and restart kvix"
    )]
    Budget { limit: usize },
    #[error("{0}")]
    Socket(String),
}

/// Engines (registered listeners) the descriptor budget allows, and how many hold a
/// place.
struct EngineBudget {
    limit: usize,
    used: AtomicUsize,
}

impl EngineBudget {
    /// Take a place; false when none is left.
    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }
}

/// The listeners of one instance to stop in one index (one dp rank, or all), and
/// the slots to clear besides theirs.
#[derive(Debug)]
pub struct Removal {
    pub index: IndexId,
    pub instance: InstanceId,
    pub dp: Option<DpRank>,
    /// Slots the registry dropped with them: cleared too.
    pub also_clear: Vec<WorkerSlot>,
}

/// Control messages to an ingest thread.
pub enum Command {
    /// Listen to `endpoint` for the feed's worker.
    Add {
        feed: Box<WorkerFeed>,
        endpoint: Endpoint,
        done: mpsc::Sender<Result<Arc<FeedStats>, String>>,
    },
    /// Stop listeners of `instance` (one dp rank or all) and clear the slots they fed
    /// plus `also_clear` (slots the registry knows, e.g. dp ranks seen on the wire).
    Remove {
        removal: Removal,
        /// Answered with the number of listeners stopped.
        done: mpsc::Sender<usize>,
    },
    /// Seed one worker's feed from a dump or snapshot (see [`WorkerFeed::seed`]).
    Seed {
        seeding: Seeding,
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

/// One worker's blocks and groups to seed its feed with (see [`WorkerFeed::seed`]):
/// with `replace`, what the worker holds now is cleared first.
#[derive(Debug)]
pub struct Seeding {
    pub index: IndexId,
    pub instance: InstanceId,
    pub dp: DpRank,
    pub blocks: Vec<SeedBlock>,
    pub groups: SeedGroups,
    pub replace: bool,
}

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

/// Handle to all ingest threads.
pub struct Ingest {
    budget: EngineBudget,
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
    pub fn start(
        rings: Arc<Rings>,
        registry: Arc<Registry>,
        sockets: SocketOptions,
    ) -> Result<Arc<Self>, String> {
        let ctx = super::Context::shared(sockets.max_engines)?;
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
            let registry = registry.clone();
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
        Ok(Arc::new(Ingest {
            budget: EngineBudget {
                limit: sockets.max_engines,
                used: AtomicUsize::new(0),
            },
            senders,
            threads: Mutex::new(threads),
            listeners: listener_stats,
            pods,
            bind_stats,
            paused,
            replay_stats,
        }))
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

    /// Start a listener; returns once its socket is connected. Refused once the
    /// descriptor budget's engines all listen: every listener's place is kept while
    /// it lives, so libzmq can always reopen its connection.
    pub fn add(
        &self,
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
        block_size: u32,
        endpoint: Endpoint,
        opts: ListenerOpts,
    ) -> Result<(), ListenError> {
        if !self.budget.take() {
            return Err(ListenError::Budget {
                limit: self.budget.limit,
            });
        }
        let (done, rx) = mpsc::channel();
        let feed = Box::new(WorkerFeed::with_opts(index, instance, dp, block_size, opts));
        self.send(
            instance,
            Command::Add {
                feed,
                endpoint,
                done,
            },
        );
        let stats = rx
            .recv()
            .unwrap_or_else(|_| Err("ingest thread stopped".into()))
            .map_err(|e| {
                self.budget.give_back(1);
                ListenError::Socket(e)
            })?;
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((index, instance, dp, stats));
        Ok(())
    }

    /// Stop listeners and clear their blocks; returns once the clears are queued.
    pub fn remove(&self, removal: Removal) {
        let (done, rx) = mpsc::channel();
        self.send(removal.instance, Command::Remove { removal, done });
        if let Ok(stopped) = rx.recv() {
            self.budget.give_back(stopped);
        }
    }

    /// Engines listened to, and the most the descriptor budget allows.
    pub fn engines(&self) -> (usize, usize) {
        (self.budget.used.load(Ordering::Relaxed), self.budget.limit)
    }

    /// Seed one worker from a dump or snapshot; returns once its ops are on the rings.
    pub fn seed(&self, seeding: Seeding) -> SeedOutcome {
        let (done, rx) = mpsc::channel();
        self.send(seeding.instance, Command::Seed { seeding, done });
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
