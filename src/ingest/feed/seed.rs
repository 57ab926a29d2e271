//! Seeding a feed from a peer's dump or a local snapshot: the blocks and
//! groups one (instance, dp rank) held, as ops for the slot's shard.
//!
//! Owns how recovered blocks become ops, filed as their stores would have been.
//! Must never read a dump or snapshot itself: recovery hands it the blocks.

use super::{FeedStats, WorkerFeed};
use crate::registry::Registry;
use crate::ring::OpSink;
use crate::shard::hybrid::{GroupRule, GroupSpec};
use crate::shard::tree::MAX_GROUPS;
use crate::shard::{SeedParent, ShardOp};
use crate::types::{DpRank, EngineHash, IndexId, SeqHash, TierSet};

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
    /// The worker's KV-cache groups other than full attention that hold the
    /// block, as bits by `group_idx` (0: none, or not a hybrid model).
    pub groups: u32,
}

/// A worker's KV-cache groups other than full attention, as a dump or snapshot
/// records them (what its stores described: see [`WorkerFeed::apply`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeedGroups {
    /// (group_idx, spec), in group order.
    pub groups: Vec<(u8, GroupSpec)>,
    /// The alignment of a hit in tokens, when set.
    pub align: Option<u32>,
}

impl WorkerFeed {
    /// Seed rank `dp` with `blocks` (parents first) as ops for the slot's shard,
    /// which files them as BlockStored would: the slot's engine-hash map learns
    /// every block, so later live events resolve; a block whose parent its shard
    /// cannot find is skipped and counted there. `groups` describes the rank's
    /// other KV-cache groups (the shard and this feed learn them as from stores),
    /// and each block's group bits are held in them. With `replace`, the rank's
    /// current blocks are cleared first (a peer's dump supersedes an older local
    /// snapshot). Returns whether the rank has a slot (a full registry may refuse one).
    pub fn seed(
        &mut self,
        index: IndexId,
        dp: DpRank,
        (blocks, groups): (&[SeedBlock], &SeedGroups),
        replace: bool,
        registry: &Registry,
        sink: &mut impl OpSink,
    ) -> bool {
        let Some(i) = self.slot_feed(index, dp, registry) else {
            return false;
        };
        let slot = self.slots[i].slot;
        if replace {
            sink.push(ShardOp::ClearSlot {
                index,
                slot,
                tiers: TierSet::ALL,
            });
        }
        let known = self.seed_groups(i, groups, sink);
        for b in blocks {
            // A block stored by sequence hash alone (a standardized publisher without
            // tokens) has no local hash; exports carry its sequence hash as its block
            // hash.
            if b.local.0 == 0 {
                sink.push(ShardOp::StoreKeyed {
                    index,
                    slot,
                    tier: b.tier,
                    seq: SeqHash(b.engine.0),
                    parent: b.parent_seq,
                });
                continue;
            }
            sink.push(ShardOp::Seed {
                index,
                slot,
                tier: b.tier,
                block: b.engine,
                local: b.local,
                parent: SeedParent::new(b.parent_engine, b.parent_seq),
            });
            let mut bits = b.groups & known;
            while bits != 0 {
                let group = bits.trailing_zeros() as u8;
                bits &= bits - 1;
                sink.push(ShardOp::GroupHold {
                    index,
                    slot,
                    group,
                    block: b.engine,
                    held: true,
                });
            }
        }
        sink.broadcast(ShardOp::SeedDone { index });
        true
    }

    /// Learn a seeded rank's groups as [`Self::learn_group`] learns a store's,
    /// and tell the shard; returns the groups kept, as bits. A group kvix cannot
    /// place (past [`MAX_GROUPS`], a block size that is not a multiple of the
    /// registration's) is skipped and counted, as its store would have been.
    /// Settings the wire does not carry (chunk, alignment) that this listener was
    /// not given (a listener restored from a snapshot or adopted from a peer has
    /// only the command line's) are taken from the recovered groups, so the next
    /// store describes its group as the original did.
    fn seed_groups(&mut self, i: usize, groups: &SeedGroups, sink: &mut impl OpSink) -> u32 {
        let base = self.block_size as u32;
        if let Some(a) = groups.align {
            self.opts.hybrid_align_tokens.get_or_insert(a);
        }
        let mut known = 0u32;
        for &(group, spec) in &groups.groups {
            let bs = spec.block_size;
            if group as u32 >= MAX_GROUPS || bs == 0 || !bs.is_multiple_of(base) {
                FeedStats::bump(&self.stats.block_size_mismatch, 1);
                tracing::warn!(
                    instance = self.instance,
                    group,
                    block_size = bs,
                    base,
                    "a recovered KV-cache group cannot be kept; skipped"
                );
                continue;
            }
            known |= 1 << group;
            if let GroupRule::ChunkedLocal(c @ 1..) = spec.rule {
                self.opts.attention_chunk_size.get_or_insert(c);
            }
            let sf = &mut self.slots[i];
            match sf.groups.iter_mut().find(|(g, _)| *g == group as u32) {
                Some((_, s)) => *s = spec,
                None => sf.groups.push((group as u32, spec)),
            }
            sink.push(ShardOp::GroupSpec {
                index: sf.index,
                slot: sf.slot,
                group,
                spec,
                align: groups.align.unwrap_or(0),
                base,
            });
        }
        known
    }
}
