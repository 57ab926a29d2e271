//! The ring mesh between ingest threads and shards.
//!
//! Owns one bounded SPSC ring (`crossbeam_queue::ArrayQueue`, used with one
//! producer and one consumer) per (ingest thread, shard) pair. Ops travel in
//! chunks of up to [`CHUNK`]: a ring operation costs a cross-core cache miss on
//! each side, too much to pay per op on the event path.
//! Emptied chunks go back to their producer on a second ring, so the steady
//! state allocates nothing. Producers never drop an op: a full ring is waited
//! out and counted as a stall. A producer must [`RingSink::flush`] before it
//! waits for anything, or its staged ops stay invisible.
//!
//! A shard that has been idle a while parks on its bell ([`Rings::try_park`])
//! instead of polling: the first producer to hand it a chunk afterwards rings it
//! (one byte on a socket the shard's executor reads), so an idle executor costs no
//! CPU and an event after a quiet spell is applied at once.

use crate::partition::Partition;
use crate::shard::ShardOp;
use crate::types::ShardId;
use crossbeam_queue::ArrayQueue;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};

/// Ops per chunk: ~6 KiB, big enough to amortize a ring operation, small enough
/// that a busy producer hands work over every few microseconds.
pub const CHUNK: usize = 128;

struct Ring {
    full: ArrayQueue<Vec<ShardOp>>,
    /// Emptied chunks on their way back to the producer.
    empty: ArrayQueue<Vec<ShardOp>>,
    /// Ops in `full`, for stats.
    queued: AtomicUsize,
    /// Times the producer found `full` full (written by its one producer).
    stalls: AtomicU64,
}

/// How a parked shard is woken. The shard raises `parked`, then looks at its rings
/// once more; a producer that has just pushed a chunk lowers it and writes a byte.
/// Both sides put a full fence between their write and their read, so either the
/// shard sees the chunk or the producer sees the flag (no lost wake-up).
struct Bell {
    parked: AtomicBool,
    /// Non-blocking: a producer never waits on it (a full socket already wakes).
    tx: UnixStream,
    /// The read end, until the shard's executor takes it.
    rx: Mutex<Option<UnixStream>>,
}

pub struct Rings {
    producers: usize,
    partition: Partition,
    rings: Vec<Ring>,
    bells: Vec<Bell>,
}

impl Rings {
    /// `capacity` is in ops; each ring holds `capacity / CHUNK` chunks (at least 4).
    /// Every index spread over all the shards.
    pub fn new(producers: usize, shards: usize, capacity: usize) -> Arc<Self> {
        Self::partitioned(producers, Partition::spread_over(shards), capacity)
    }

    /// Rings to `partition`'s shards, each slot's ops to the shard that owns it.
    pub fn partitioned(producers: usize, partition: Partition, capacity: usize) -> Arc<Self> {
        let chunks = (capacity / CHUNK).max(4);
        let shards = partition.shards();
        Arc::new(Rings {
            producers,
            partition,
            rings: (0..producers * shards)
                .map(|_| Ring {
                    full: ArrayQueue::new(chunks),
                    empty: ArrayQueue::new(chunks),
                    queued: AtomicUsize::new(0),
                    stalls: AtomicU64::new(0),
                })
                .collect(),
            bells: (0..shards).map(|_| Bell::new()).collect(),
        })
    }

    pub fn shards(&self) -> usize {
        self.partition.shards()
    }

    pub fn partition(&self) -> Partition {
        self.partition
    }

    pub fn producers(&self) -> usize {
        self.producers
    }

    fn ring(&self, producer: usize, shard: ShardId) -> &Ring {
        &self.rings[producer * self.shards() + shard.0]
    }

    /// Hand whole chunks for `shard` to `f` until at least `max` ops (or all that are
    /// queued) went, in per-producer order. Returns the number of ops.
    pub fn drain(&self, shard: ShardId, max: usize, mut f: impl FnMut(&[ShardOp])) -> usize {
        let mut n = 0;
        for p in 0..self.producers {
            let r = self.ring(p, shard);
            while n < max {
                let Some(mut chunk) = r.full.pop() else { break };
                let len = chunk.len();
                f(&chunk);
                chunk.clear();
                r.queued.fetch_sub(len, Ordering::Relaxed);
                n += len;
                // A full return ring only means the producer has spares: drop this one.
                let _ = r.empty.push(chunk);
            }
        }
        n
    }

    /// Ops queued for `shard` (not counting ops still staged by producers).
    pub fn pending(&self, shard: ShardId) -> usize {
        (0..self.producers)
            .map(|p| self.ring(p, shard).queued.load(Ordering::Relaxed))
            .sum()
    }

    pub fn stalls(&self, shard: ShardId) -> u64 {
        (0..self.producers)
            .map(|p| self.ring(p, shard).stalls.load(Ordering::Relaxed))
            .sum()
    }

    /// The read end of `shard`'s bell, for its consumer to wait on: one byte
    /// arrives (at least) after each [`Self::try_park`] that returned true, once a
    /// producer hands the shard a chunk. `None` after the first call.
    pub fn take_bell(&self, shard: ShardId) -> Option<UnixStream> {
        self.bells[shard.0]
            .rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Ask a producer to ring `shard`'s bell with its next chunk. False (and no
    /// request stands) if a chunk is already queued: drain it instead of waiting.
    pub fn try_park(&self, shard: ShardId) -> bool {
        let bell = &self.bells[shard.0];
        bell.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let queued = (0..self.producers).any(|p| !self.ring(p, shard).full.is_empty());
        if queued {
            bell.parked.store(false, Ordering::Relaxed);
        }
        !queued
    }

    /// Withdraw a [`Self::try_park`] request (the consumer woke for another reason).
    pub fn unpark(&self, shard: ShardId) {
        self.bells[shard.0].parked.store(false, Ordering::Relaxed);
    }

    /// Wake `shard`'s consumer if it is parked: after a chunk was pushed for it, or
    /// after it was given other work its drain loop must see (predictions to end).
    pub fn wake(&self, shard: ShardId) {
        let bell = &self.bells[shard.0];
        fence(Ordering::SeqCst);
        if bell.parked.load(Ordering::Relaxed) && bell.parked.swap(false, Ordering::SeqCst) {
            // WouldBlock means bytes the consumer has not read yet: it wakes anyway.
            let _ = (&bell.tx).write(&[1]);
        }
    }
}

impl Bell {
    fn new() -> Self {
        let (tx, rx) = UnixStream::pair().expect("a socket pair for a ring's bell");
        tx.set_nonblocking(true)
            .expect("a non-blocking socket for a ring's bell");
        Bell {
            parked: AtomicBool::new(false),
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

/// Where decoded events go: one ring per shard, or (in tests) straight into shards.
pub trait OpSink {
    /// Route an op to the shard owning its worker slot.
    fn push(&mut self, op: ShardOp);
    /// Send an op to every shard (the end of an import).
    fn broadcast(&mut self, op: ShardOp);
    /// Make every op pushed so far visible to the shards.
    fn flush(&mut self) {}
}

/// The producing side of the mesh for one ingest thread.
pub struct RingSink {
    rings: Arc<Rings>,
    producer: usize,
    /// Per shard, the chunk being filled.
    staged: Vec<Vec<ShardOp>>,
}

impl RingSink {
    pub fn new(rings: Arc<Rings>, producer: usize) -> Self {
        assert!(producer < rings.producers);
        let staged = (0..rings.shards())
            .map(|_| Vec::with_capacity(CHUNK))
            .collect();
        RingSink {
            rings,
            producer,
            staged,
        }
    }

    fn stage(&mut self, shard: ShardId, op: ShardOp) {
        self.staged[shard.0].push(op);
        if self.staged[shard.0].len() >= CHUNK {
            self.flush_shard(shard);
        }
    }

    fn flush_shard(&mut self, shard: ShardId) {
        if self.staged[shard.0].is_empty() {
            return;
        }
        let r = self.rings.ring(self.producer, shard);
        let spare = r.empty.pop().unwrap_or_else(|| Vec::with_capacity(CHUNK));
        let mut chunk = std::mem::replace(&mut self.staged[shard.0], spare);
        r.queued.fetch_add(chunk.len(), Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            match r.full.push(chunk) {
                Ok(()) => return self.rings.wake(shard),
                Err(back) => {
                    chunk = back;
                    if spins == 0 {
                        r.stalls.fetch_add(1, Ordering::Relaxed);
                    }
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                }
            }
        }
    }
}

impl OpSink for RingSink {
    fn push(&mut self, op: ShardOp) {
        let Some(slot) = op.slot() else {
            return self.broadcast(op);
        };
        let shard = self.rings.partition.shard_of(op.index(), slot);
        self.stage(shard, op);
    }

    fn broadcast(&mut self, op: ShardOp) {
        for s in 0..self.rings.shards() {
            self.stage(ShardId(s), op);
        }
    }

    fn flush(&mut self) {
        for s in 0..self.rings.shards() {
            self.flush_shard(ShardId(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EngineHash, IndexId, WorkerSlot};

    fn remove(block: u64) -> ShardOp {
        ShardOp::Remove {
            index: IndexId(0),
            slot: WorkerSlot(0),
            block: EngineHash(block),
            tiers: crate::types::TierSet(1),
        }
    }

    #[test]
    fn ops_arrive_in_order_only_after_flush_and_chunks_are_recycled() {
        let rings = Rings::new(1, 1, 4 * CHUNK);
        let mut sink = RingSink::new(rings.clone(), 0);
        let total = 3 * CHUNK + 5;
        for i in 0..total as u64 {
            sink.push(remove(i));
        }
        // Three full chunks went out; five ops wait for a flush.
        assert_eq!(rings.pending(ShardId(0)), 3 * CHUNK);
        sink.flush();
        assert_eq!(rings.pending(ShardId(0)), total);
        let mut seen = Vec::new();
        let n = rings.drain(ShardId(0), usize::MAX, |ops| {
            for op in ops {
                if let ShardOp::Remove { block, .. } = op {
                    seen.push(block.0)
                }
            }
        });
        assert_eq!(n, total);
        assert_eq!(seen, (0..total as u64).collect::<Vec<_>>());
        assert_eq!(rings.pending(ShardId(0)), 0);
        // The emptied chunks came back for reuse.
        assert_eq!(rings.ring(0, ShardId(0)).empty.len(), 4);
    }

    /// A parked consumer is rung by the first chunk pushed after it parked, and only
    /// then; one with a chunk already queued is told not to park.
    #[test]
    fn the_bell_rings_once_for_the_first_chunk_after_a_park() {
        use std::io::Read;
        let rings = Rings::new(1, 1, 4 * CHUNK);
        let mut sink = RingSink::new(rings.clone(), 0);
        let mut rx = rings.take_bell(ShardId(0)).unwrap();
        assert!(rings.take_bell(ShardId(0)).is_none());
        rx.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 8];
        let rung = |rx: &mut UnixStream, byte: &mut [u8; 8]| rx.read(byte).ok();

        assert!(rings.try_park(ShardId(0)));
        sink.push(remove(1));
        assert_eq!(
            rung(&mut rx, &mut byte),
            None,
            "staged ops are not handed over yet"
        );
        sink.flush();
        sink.push(remove(2));
        sink.flush();
        assert_eq!(rung(&mut rx, &mut byte), Some(1), "one byte for two chunks");

        // Chunks are queued: parking is refused and nothing rings later.
        assert!(!rings.try_park(ShardId(0)));
        sink.push(remove(3));
        sink.flush();
        assert_eq!(rung(&mut rx, &mut byte), None);

        // A withdrawn park is not rung either.
        assert_eq!(rings.drain(ShardId(0), usize::MAX, |_| {}), 3);
        assert!(rings.try_park(ShardId(0)));
        rings.unpark(ShardId(0));
        sink.push(remove(4));
        sink.flush();
        assert_eq!(rung(&mut rx, &mut byte), None);
    }

    /// A consumer that parks whenever its ring looks empty is woken for every
    /// chunk, each of them the last of its burst (a lost wake-up leaves it queued).
    #[test]
    fn a_parked_consumer_never_misses_a_chunk() {
        use std::io::Read;
        let chunks = 3_000;
        let rings = Rings::new(1, 1, 4 * CHUNK);
        let mut rx = rings.take_bell(ShardId(0)).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let consumer = {
            let (rings, seen) = (rings.clone(), seen.clone());
            std::thread::spawn(move || {
                let (mut parks, mut byte) = (0, [0u8; 64]);
                while seen.load(Ordering::Relaxed) < chunks * CHUNK {
                    let got = rings.drain(ShardId(0), usize::MAX, |_| {});
                    seen.fetch_add(got, Ordering::Relaxed);
                    if got == 0 && rings.try_park(ShardId(0)) {
                        parks += 1;
                        // A timeout only ends this wait; the producer judges.
                        let _ = rx.read(&mut byte);
                        rings.unpark(ShardId(0));
                    }
                }
                parks
            })
        };
        let mut sink = RingSink::new(rings.clone(), 0);
        let mut rng = crate::testing::Xorshift::new(5);
        for c in 0..chunks {
            for i in 0..CHUNK {
                sink.push(remove((c * CHUNK + i) as u64));
            }
            // Wait for this chunk before the next: it is the last the consumer gets
            // until then, so it must be woken for it.
            let t0 = std::time::Instant::now();
            while seen.load(Ordering::Relaxed) < (c + 1) * CHUNK {
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(2),
                    "chunk {c} waited for a parked consumer"
                );
                std::thread::yield_now();
            }
            if rng.below(2) == 0 {
                std::thread::sleep(std::time::Duration::from_micros(rng.below(100)));
            }
        }
        let parks = consumer.join().unwrap();
        assert!(parks > 100, "the consumer parked only {parks} times");
    }

    #[test]
    fn a_full_ring_makes_the_producer_wait_not_drop() {
        let rings = Rings::new(1, 1, 4 * CHUNK);
        let mut sink = RingSink::new(rings.clone(), 0);
        let total = 10 * CHUNK;
        let consumer = {
            let rings = rings.clone();
            std::thread::spawn(move || {
                // Drain only once the producer has found the ring full.
                let t0 = std::time::Instant::now();
                while rings.stalls(ShardId(0)) == 0 {
                    assert!(t0.elapsed().as_secs() < 10, "producer never waited");
                    std::thread::yield_now();
                }
                let mut n = 0;
                while n < total {
                    n += rings.drain(ShardId(0), usize::MAX, |_| {});
                    std::thread::yield_now();
                }
                n
            })
        };
        for i in 0..total as u64 {
            sink.push(remove(i));
        }
        sink.flush();
        assert_eq!(consumer.join().unwrap(), total);
    }
}
