//! The ring mesh between ingest threads and shards.
//!
//! Owns one bounded SPSC ring (`crossbeam_queue::ArrayQueue`, used with one
//! producer and one consumer) per (ingest thread, shard) pair. Producers never
//! drop an op: a full ring is waited out and counted as a stall.

use crate::partition::shard_of;
use crate::shard::ShardOp;
use crate::types::ShardId;
use crossbeam_queue::ArrayQueue;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Rings {
    producers: usize,
    shards: usize,
    queues: Vec<ArrayQueue<ShardOp>>,
    /// Times a producer found a ring full, per ring (written by its one producer).
    stalls: Vec<AtomicU64>,
}

impl Rings {
    pub fn new(producers: usize, shards: usize, capacity: usize) -> Arc<Self> {
        let n = producers * shards;
        Arc::new(Rings {
            producers,
            shards,
            queues: (0..n).map(|_| ArrayQueue::new(capacity)).collect(),
            stalls: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    pub fn producers(&self) -> usize {
        self.producers
    }

    fn ring(&self, producer: usize, shard: ShardId) -> usize {
        producer * self.shards + shard.0
    }

    /// Pop up to `max` ops for `shard` from every producer, in per-producer order.
    pub fn drain(&self, shard: ShardId, max: usize, mut f: impl FnMut(ShardOp)) -> usize {
        let mut n = 0;
        for p in 0..self.producers {
            let q = &self.queues[self.ring(p, shard)];
            while n < max {
                match q.pop() {
                    Some(op) => {
                        f(op);
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        n
    }

    /// Ops waiting for `shard`.
    pub fn pending(&self, shard: ShardId) -> usize {
        (0..self.producers)
            .map(|p| self.queues[self.ring(p, shard)].len())
            .sum()
    }

    pub fn stalls(&self, shard: ShardId) -> u64 {
        (0..self.producers)
            .map(|p| self.stalls[self.ring(p, shard)].load(Ordering::Relaxed))
            .sum()
    }
}

/// Where decoded events go: one ring per shard, or (in tests) straight into shards.
pub trait OpSink {
    /// Route an op to the shard owning its block.
    fn push(&mut self, op: ShardOp);
    /// Send an op to every shard (clears).
    fn broadcast(&mut self, op: ShardOp);
}

/// The producing side of the mesh for one ingest thread.
pub struct RingSink {
    rings: Arc<Rings>,
    producer: usize,
}

impl RingSink {
    pub fn new(rings: Arc<Rings>, producer: usize) -> Self {
        assert!(producer < rings.producers);
        RingSink { rings, producer }
    }

    fn push_to(&mut self, shard: ShardId, mut op: ShardOp) {
        let i = self.rings.ring(self.producer, shard);
        let q = &self.rings.queues[i];
        let mut spins = 0u32;
        loop {
            match q.push(op) {
                Ok(()) => return,
                Err(back) => {
                    op = back;
                    if spins == 0 {
                        self.rings.stalls[i].fetch_add(1, Ordering::Relaxed);
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
        let shard = match op {
            ShardOp::Store { seq, .. } | ShardOp::Remove { seq, .. } => {
                shard_of(seq, self.rings.shards)
            }
            ShardOp::ClearSlot { .. } => return self.broadcast(op),
        };
        self.push_to(shard, op);
    }

    fn broadcast(&mut self, op: ShardOp) {
        for s in 0..self.rings.shards {
            self.push_to(ShardId(s), op);
        }
    }
}
