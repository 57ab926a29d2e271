//! The ring mesh between ingest threads and shards.
//!
//! Owns one bounded SPSC ring (`crossbeam_queue::ArrayQueue`, used with one
//! producer and one consumer) per (ingest thread, shard) pair. Ops travel in
//! chunks of up to [`CHUNK`]: a ring operation costs a cross-core cache miss on
//! each side, which per op was ~9% of the event path (perf: `push_to` + `drain`).
//! Emptied chunks go back to their producer on a second ring, so the steady
//! state allocates nothing. Producers never drop an op: a full ring is waited
//! out and counted as a stall. A producer must [`RingSink::flush`] before it
//! waits for anything, or its staged ops stay invisible.

use crate::partition::shard_of;
use crate::shard::ShardOp;
use crate::types::ShardId;
use crossbeam_queue::ArrayQueue;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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

pub struct Rings {
    producers: usize,
    shards: usize,
    rings: Vec<Ring>,
}

impl Rings {
    /// `capacity` is in ops; each ring holds `capacity / CHUNK` chunks (at least 4).
    pub fn new(producers: usize, shards: usize, capacity: usize) -> Arc<Self> {
        let chunks = (capacity / CHUNK).max(4);
        Arc::new(Rings {
            producers,
            shards,
            rings: (0..producers * shards)
                .map(|_| Ring {
                    full: ArrayQueue::new(chunks),
                    empty: ArrayQueue::new(chunks),
                    queued: AtomicUsize::new(0),
                    stalls: AtomicU64::new(0),
                })
                .collect(),
        })
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    pub fn producers(&self) -> usize {
        self.producers
    }

    fn ring(&self, producer: usize, shard: ShardId) -> &Ring {
        &self.rings[producer * self.shards + shard.0]
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
}

/// Where decoded events go: one ring per shard, or (in tests) straight into shards.
pub trait OpSink {
    /// Route an op to the shard owning its block.
    fn push(&mut self, op: ShardOp);
    /// Send an op to every shard (clears).
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
        let staged = (0..rings.shards)
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
                Ok(()) => return,
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
        let Some(seq) = op.seq() else {
            return self.broadcast(op);
        };
        let shard = shard_of(seq, self.rings.shards);
        self.stage(shard, op);
    }

    fn broadcast(&mut self, op: ShardOp) {
        for s in 0..self.rings.shards {
            self.stage(ShardId(s), op);
        }
    }

    fn flush(&mut self) {
        for s in 0..self.rings.shards {
            self.flush_shard(ShardId(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{IndexId, SeqHash, WorkerSlot};

    fn remove(seq: u64) -> ShardOp {
        ShardOp::Remove {
            index: IndexId(0),
            seq: SeqHash(seq),
            slot: WorkerSlot(0),
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
                if let ShardOp::Remove { seq, .. } = op {
                    seen.push(seq.0)
                }
            }
        });
        assert_eq!(n, total);
        assert_eq!(seen, (0..total as u64).collect::<Vec<_>>());
        assert_eq!(rings.pending(ShardId(0)), 0);
        // The emptied chunks came back for reuse.
        assert_eq!(rings.ring(0, ShardId(0)).empty.len(), 4);
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
