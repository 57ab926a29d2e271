//! One ingest thread: its listeners' SUB sockets polled, frames received and
//! decoded, each frame's sequence number judged ([`super::sequence`]), events turned
//! into shard ops, commands run between bursts. libzmq reconnects an engine that
//! went away by itself; a part too large for kvix is taken and skipped rather than
//! left to libzmq, which would close the connection for good.
//!
//! Never runs on an executor and never touches shard memory: it only pushes ops.

use super::feed::{FeedStats, WorkerFeed};
use super::sequence::{Cursor, Step};
use super::wake::Wake;
use super::{
    Command, ListenerStats, REPLAY_COOLDOWN, Removal, ReplayStats, SeedOutcome, SeqKey,
    SocketOptions, bind, subscriber,
};
use crate::registry::{Endpoint, Registry};
use crate::ring::{OpSink, RingSink};
use crate::shard::ShardOp;
use crate::types::{DpRank, IndexId, InstanceId, WorkerSlot};
use crate::wire::{self, Batch};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) struct Listener {
    pub(super) socket: zmq::Socket,
    pub(super) endpoint: Endpoint,
    pub(super) feed: WorkerFeed,
    /// After a replay, `(after, until)`: live frames numbered above `after` and up to
    /// `until` were queued while it ran and applied from it, so they are skipped as
    /// duplicates. A frame at or below `after` is none of those (the engine
    /// restarted) and follows the cursor's rule.
    pub(super) dedup: Option<(Option<u64>, u64)>,
    /// When a restart last made this listener replay: a restart replays at most once
    /// per [`REPLAY_COOLDOWN`], so an engine whose numbers keep going back cannot
    /// keep this thread replaying.
    pub(super) restart_replayed_at: Option<std::time::Instant>,
    /// When a replay of this listener last went unanswered: no new replay is tried for
    /// [`REPLAY_COOLDOWN`] after it, so an engine that cannot keep up with replays does
    /// not keep this thread from live frames (the gaps stay counted).
    pub(super) replay_failed_at: Option<std::time::Instant>,
    /// Last batch sequence applied; authoritative while the listener lives (no map
    /// lookup per frame), saved to the thread's map when it stops.
    pub(super) cursor: Cursor,
}

/// Bytes of decoding scratch a vector keeps once its thread goes quiet: what a
/// frame of a few thousand blocks needs, so a steady stream reuses it.
pub(super) const SCRATCH_KEEP: usize = 64 * 1024;

/// One frame's parts and its decoding.
pub(super) struct Scratch {
    pub(super) batch: Batch,
    pub(super) parts: [zmq::Message; 3],
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

pub(super) struct IngestThread {
    pub(super) ctx: super::Context,
    pub(super) rx: mpsc::Receiver<Command>,
    /// Rung with every command: polled beside the SUB sockets.
    pub(super) wake: Arc<Wake>,
    pub(super) sink: RingSink,
    pub(super) registry: Arc<Registry>,
    pub(super) listeners: Vec<Listener>,
    /// The frame being handled and its decoding, shared by the listeners (a frame
    /// is decoded and applied before the next is received), so that this thread's
    /// scratch is the size of its largest recent frame, not that times its
    /// listeners; trimmed when the thread goes quiet ([`Scratch::trim`]).
    pub(super) scratch: Scratch,
    /// Last sequence per engine stream of stopped (or not yet started) listeners; it
    /// outlives them so that re-registering a worker after a gap still detects (and
    /// replays) it, as Dynamo does.
    pub(super) last_seq: HashMap<SeqKey, u64>,
    pub(super) paused: Arc<AtomicBool>,
    pub(super) replay_stats: Arc<ReplayStats>,
    /// When this thread last worked, to give back what work freed once quiet.
    pub(super) release: crate::heap::Release,
    pub(super) sockets: SocketOptions,
    /// This thread's number (its rings' producer id).
    pub(super) id: usize,
    /// Bound sockets pods publish to, with their pods' streams.
    pub(super) binds: Vec<bind::Bound>,
    pub(super) bind_stats: Arc<bind::BindStats>,
    pub(super) pods: Arc<bind::PodThreads>,
    /// The [`Ingest`]'s list of stats, for pod streams opened here.
    pub(super) listener_stats: Arc<Mutex<Vec<ListenerStats>>>,
}

/// Frames drained from one socket before the others get a turn.
pub(super) const BURST: usize = 256;

/// How long a poll waits for frames: briefly while frames flow, then longer and
/// longer while none come (commands wake the thread at once whatever the wait).
const POLL_BUSY: Duration = Duration::from_millis(5);
const POLL_IDLE_MAX: Duration = Duration::from_millis(200);

impl IngestThread {
    pub(super) fn run(mut self) {
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
            // The wake-up, then the listeners' SUB sockets, then the bound sockets.
            let ready: Vec<bool> = {
                let wake = zmq::PollItem::from_fd(self.wake.fd(), zmq::POLLIN);
                let mut items: Vec<zmq::PollItem<'_>> = std::iter::once(wake)
                    .chain(
                        self.listeners
                            .iter()
                            .map(|l| l.socket.as_poll_item(zmq::POLLIN)),
                    )
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
            let (listeners, binds) = ready.split_at(self.listeners.len());
            for (i, r) in listeners.iter().enumerate() {
                if *r {
                    self.drain(i);
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
                feed,
                endpoint,
                done,
            } => {
                let r = self.listen(*feed, endpoint);
                self.sink.flush();
                let _ = done.send(r);
            }
            Command::Remove { removal, done } => {
                let stopped = self.stop_listening(removal);
                self.sink.flush();
                let _ = done.send(stopped);
            }
            Command::Seed { seeding: s, done } => {
                let r = match self.seed_listener(s.index, s.instance, s.dp) {
                    Some(i) => {
                        let registry = self.registry.clone();
                        let feed = &mut self.listeners[i].feed;
                        let sink = &mut self.sink;
                        let what = (&s.blocks[..], &s.groups);
                        let seeded = feed.seed(s.index, s.dp, what, s.replace, &registry, sink);
                        SeedOutcome::Seeded {
                            skipped: if seeded { 0 } else { s.blocks.len() as u64 },
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
                    // Port 0 or `*` lets the system choose: say what it chose.
                    let bound = socket
                        .get_last_endpoint()
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or_else(|| endpoint.clone());
                    tracing::info!(endpoint, "bound for pods' publishers on {bound}");
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
        let socket = self.connect(&endpoint.endpoint)?;
        let stats = feed.stats.clone();
        tracing::info!(instance, dp, endpoint = endpoint.endpoint, "listening");
        self.listeners.push(Listener {
            socket,
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
    /// Returns how many listeners stopped.
    fn stop_listening(
        &mut self,
        Removal {
            index,
            instance,
            dp,
            also_clear,
        }: Removal,
    ) -> usize {
        let before = self.listeners.len();
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
        before - self.listeners.len()
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

    /// A SUB socket connected to `endpoint`: two descriptors while it lives (its
    /// mailbox and its connection), which libzmq reopens whenever the engine comes
    /// back.
    fn connect(&self, endpoint: &str) -> Result<zmq::Socket, String> {
        let s = subscriber(&self.ctx, self.sockets, false).map_err(|e| e.to_string())?;
        s.connect(endpoint)
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
        Ok(s)
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
                let limit = self.sockets.max_msg_bytes;
                // Sequence bookkeeping may need a replay (which borrows the whole
                // thread), so the caller does it outside this borrow.
                let parsed = seq.and_then(|seq| {
                    *pending = Some((seq, false));
                    match parts.iter().map(|p| p.len()).max() {
                        Some(bytes) if bytes as i64 > limit => Err(wire::WireError::Oversized {
                            bytes,
                            limit: limit as u64,
                        }),
                        _ => wire::decode(&parts[2], batch).map(|_| seq),
                    }
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

pub(super) fn seq_key(l: &Listener) -> SeqKey {
    (l.feed.instance, l.feed.dp, l.endpoint.endpoint.clone())
}

/// Receive one multipart message into `parts` without blocking. Returns the part
/// count (extra parts beyond three are drained and counted), or `None` if nothing waits.
pub(super) fn recv_parts(
    s: &zmq::Socket,
    parts: &mut [zmq::Message; 3],
) -> Result<Option<usize>, zmq::Error> {
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
