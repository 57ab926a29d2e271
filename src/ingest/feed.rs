//! One worker's event feed: engine hashes → kvix hashes, events → shard ops.
//!
//! Owns, per (instance, dp rank) slot, the map from the engine's block hashes
//! to kvix sequence hashes, so `parent_block_hash` and `BlockRemoved` (which
//! carry engine hashes) resolve. A store whose parent is unknown is counted
//! and skipped, never guessed. Must never touch shard memory: it only emits ops.

use crate::hash;
use crate::registry::Registry;
use crate::ring::OpSink;
use crate::shard::ShardOp;
use crate::types::{DpRank, EngineHash, IndexId, InstanceId, SeqHash, WorkerSlot};
use crate::wire::{Batch, EventKind};
use hashbrown::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one listener; written only by its ingest thread, read by metrics.
#[derive(Default, Debug)]
pub struct FeedStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub blocks_stored: AtomicU64,
    pub blocks_removed: AtomicU64,
    pub malformed: AtomicU64,
    pub unknown_parent: AtomicU64,
    pub unknown_removed: AtomicU64,
    pub block_size_mismatch: AtomicU64,
    pub gaps: AtomicU64,
    pub last_seq: AtomicU64,
}

impl FeedStats {
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
struct Known {
    seq: SeqHash,
    tiers: u8,
}

struct SlotFeed {
    dp: DpRank,
    slot: WorkerSlot,
    blocks: HashMap<EngineHash, Known>,
}

/// The feed of one registered listener (instance, registered dp rank).
pub struct WorkerFeed {
    pub index: IndexId,
    pub instance: InstanceId,
    pub dp: DpRank,
    block_size: usize,
    slots: Vec<SlotFeed>,
    pub stats: Arc<FeedStats>,
}

impl WorkerFeed {
    pub fn new(index: IndexId, instance: InstanceId, dp: DpRank, block_size: u32) -> Self {
        WorkerFeed {
            index,
            instance,
            dp,
            block_size: block_size as usize,
            slots: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// Slots this feed has written to (for clearing them on unregister).
    pub fn slots(&self) -> impl Iterator<Item = (DpRank, WorkerSlot)> + '_ {
        self.slots.iter().map(|s| (s.dp, s.slot))
    }

    fn slot_feed(&mut self, dp: DpRank, registry: &Registry) -> Option<&mut SlotFeed> {
        if let Some(i) = self.slots.iter().position(|s| s.dp == dp) {
            return Some(&mut self.slots[i]);
        }
        let slot = match registry.slot_for(self.index, self.instance, dp) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    instance = self.instance,
                    dp,
                    "cannot intern worker slot: {e}"
                );
                return None;
            }
        };
        self.slots.push(SlotFeed {
            dp,
            slot,
            blocks: HashMap::new(),
        });
        self.slots.last_mut()
    }

    /// Every (slot, sequence hash, engine hash) this feed knows, for `/dump`.
    pub fn engine_hashes(&self, out: &mut Vec<(WorkerSlot, SeqHash, EngineHash)>) {
        for sf in &self.slots {
            out.extend(sf.blocks.iter().map(|(eh, k)| (sf.slot, k.seq, *eh)));
        }
    }

    /// Forget everything of `dp` (or of every rank) without emitting ops; the caller clears shards.
    pub fn forget(&mut self, dp: Option<DpRank>) -> Vec<WorkerSlot> {
        let mut gone = Vec::new();
        self.slots.retain(|s| {
            let hit = dp.is_none_or(|d| d == s.dp);
            if hit {
                gone.push(s.slot);
            }
            !hit
        });
        gone
    }

    /// Apply one decoded batch: every event becomes shard ops on `sink`.
    pub fn apply(
        &mut self,
        batch: &Batch,
        payload: &[u8],
        registry: &Registry,
        sink: &mut impl OpSink,
    ) {
        let dp = batch.dp_rank.unwrap_or(self.dp);
        let (index, instance, block_size) = (self.index, self.instance, self.block_size);
        let stats = self.stats.clone();
        FeedStats::bump(&stats.batches, 1);
        FeedStats::bump(&stats.events, batch.events.len() as u64);
        let Some(sf) = self.slot_feed(dp, registry) else {
            return;
        };
        let slot = sf.slot;
        for ev in batch.events(payload) {
            match ev.kind {
                EventKind::Stored => {
                    if ev.tokens.len() != ev.hashes.len() * block_size {
                        FeedStats::bump(&stats.block_size_mismatch, 1);
                        tracing::warn!(
                            instance,
                            dp,
                            tokens = ev.tokens.len(),
                            blocks = ev.hashes.len(),
                            block_size,
                            "BlockStored does not match the indexer's block size; skipped"
                        );
                        continue;
                    }
                    let mut parent = match ev.parent {
                        None => None,
                        Some(p) => match sf.blocks.get(&p) {
                            Some(k) => Some(k.seq),
                            None => {
                                FeedStats::bump(&stats.unknown_parent, 1);
                                tracing::warn!(
                                    instance,
                                    dp,
                                    parent = p.0,
                                    "BlockStored with unknown parent; skipped"
                                );
                                continue;
                            }
                        },
                    };
                    let tier = registry.tier_for(ev.medium);
                    let seed = hash::block_seed(ev.lora_name, ev.cache_salt);
                    for (eh, chunk) in ev.hashes.iter().zip(ev.tokens.chunks_exact(block_size)) {
                        let local = hash::local_hash(chunk, seed);
                        let seq = hash::chain(parent, local);
                        let k = sf.blocks.entry(*eh).or_insert(Known { seq, tiers: 0 });
                        if k.seq != seq {
                            // The engine reused a hash for other content: drop the old block first.
                            sink.push(ShardOp::Remove {
                                index,
                                seq: k.seq,
                                slot,
                                tiers: k.tiers,
                            });
                            *k = Known { seq, tiers: 0 };
                        }
                        k.tiers |= tier.bit();
                        sink.push(ShardOp::Store {
                            index,
                            seq,
                            parent,
                            local,
                            slot,
                            tier,
                        });
                        parent = Some(seq);
                    }
                    FeedStats::bump(&stats.blocks_stored, ev.hashes.len() as u64);
                }
                EventKind::Removed => {
                    let bit = registry.tier_for(ev.medium).bit();
                    for eh in ev.hashes {
                        let Some(k) = sf.blocks.get_mut(eh) else {
                            FeedStats::bump(&stats.unknown_removed, 1);
                            continue;
                        };
                        sink.push(ShardOp::Remove {
                            index,
                            seq: k.seq,
                            slot,
                            tiers: bit,
                        });
                        k.tiers &= !bit;
                        if k.tiers == 0 {
                            sf.blocks.remove(eh);
                        }
                    }
                    FeedStats::bump(&stats.blocks_removed, ev.hashes.len() as u64);
                }
                EventKind::Cleared => {
                    sink.broadcast(ShardOp::ClearSlot {
                        index,
                        slot,
                        tiers: 0xff,
                    });
                    sf.blocks.clear();
                }
            }
        }
    }
}

// ---- Recovery (issue 5): seeding a feed from a peer's dump or a local snapshot. ----

/// One block to seed, as a dump or snapshot records it for one (instance, dp rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedBlock {
    /// The worker's own hash of the block (Dynamo's `block_hash`).
    pub engine: EngineHash,
    /// The worker's hash of the parent block; `None` for a first block (or when
    /// `parent_seq` says it exactly).
    pub parent_engine: Option<EngineHash>,
    /// The parent's kvix sequence hash, when the source knows it (kvix dumps and
    /// snapshots): exact even when the parent itself is gone (a child outliving an
    /// evicted parent), where the engine hash no longer resolves.
    pub parent_seq: Option<SeqHash>,
    /// Dynamo local block hash (`tokens_hash`).
    pub local: crate::types::BlockHash,
    pub tier: crate::types::Tier,
}

impl WorkerFeed {
    /// Seed rank `dp` with `blocks` (parents first), exactly as BlockStored would: the
    /// engine-hash map learns every block (so later live events resolve) and the same
    /// `ShardOp::Store`s go onto the rings. With `replace`, the rank's current blocks are
    /// cleared first (a peer's dump supersedes an older local snapshot). Returns the
    /// number of blocks skipped for an unknown parent.
    pub fn seed(
        &mut self,
        dp: DpRank,
        blocks: &[SeedBlock],
        replace: bool,
        registry: &Registry,
        sink: &mut impl OpSink,
    ) -> u64 {
        let index = self.index;
        let stats = self.stats.clone();
        let Some(sf) = self.slot_feed(dp, registry) else {
            return blocks.len() as u64;
        };
        let slot = sf.slot;
        if replace {
            sink.broadcast(ShardOp::ClearSlot {
                index,
                slot,
                tiers: 0xff,
            });
            sf.blocks.clear();
        }
        let mut skipped = 0;
        for b in blocks {
            let parent = match (b.parent_seq, b.parent_engine) {
                (Some(p), _) => Some(p),
                (None, None) => None,
                (None, Some(p)) => match sf.blocks.get(&p) {
                    Some(k) => Some(k.seq),
                    None => {
                        skipped += 1;
                        continue;
                    }
                },
            };
            let seq = hash::chain(parent, b.local);
            let k = sf.blocks.entry(b.engine).or_insert(Known { seq, tiers: 0 });
            if k.seq != seq {
                sink.push(ShardOp::Remove {
                    index,
                    seq: k.seq,
                    slot,
                    tiers: k.tiers,
                });
                *k = Known { seq, tiers: 0 };
            }
            k.tiers |= b.tier.bit();
            sink.push(ShardOp::Store {
                index,
                seq,
                parent,
                local: b.local,
                slot,
                tier: b.tier,
            });
        }
        FeedStats::bump(&stats.unknown_parent, skipped);
        skipped
    }
}
