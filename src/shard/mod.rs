//! One executor's shard of the block index.
//!
//! Owns, for every (model, tenant) index, what the worker slots the partition
//! gives this shard hold ([`crate::partition::Partition::shard_of`]): a radix
//! tree of their blocks with each slot's engine-hash map ([`tree::Tree`]), and beside it a
//! table keyed by sequence hash ([`keyed::KeyedBlocks`]) for blocks published by
//! rolling hash alone, without tokens (they name no parent a tree could hang them
//! from). Changes arrive as [`ShardOp`]s through [`Shard::apply`] (live events,
//! replay, dumps and snapshots alike) and as predictions through
//! [`Shard::predict`]; predictions end through [`Shard::expire`]. A clear of a
//! worker's slot (all its tiers or some) is walked in steps between which the
//! executor serves ([`Shard::step_clears`]), answering as if the clear were done.
//! With a block budget (`--max-blocks`), what is stored past it evicts the
//! blocks least recently stored or matched, a step at a time between the
//! executor's drain passes ([`Shard::step_budget`]). A shard never touches
//! another shard's memory and never blocks.
//!
//! The rooms: [`op`] the ops and [`apply`] how they reach the index shards;
//! [`lookup`] a prompt's holders, [`reply`] the reply encoding the gather reads
//! and [`answer`] one shard's whole answer to a query; [`predictions`] the
//! predictions' caps and expiry, [`predict`] their deadlines; [`clear`] clears walked in steps; [`budget`] the block budget the
//! shards share; [`export`] the read-out in steps; [`tree`] and [`keyed`] the
//! two stores of an index shard, [`holders`] their holder sets, [`table`] the
//! segmented hash table. Here: the shard and its index shards.

mod answer;
mod apply;
mod budget;
mod clear;
mod export;
pub mod holders;
pub mod hybrid;
pub mod keyed;
mod lookup;
mod op;
pub mod predict;
mod predictions;
mod reply;
pub mod table;
pub mod tree;

pub use answer::{PromptBlocks, ShardReply, answer};
pub use budget::BlockBudget;
pub use export::{ExportAt, ExportedBlock, NO_NODE, ShardExport};
pub use op::{SeedParent, ShardOp};
pub use predictions::{
    DEFAULT_MAX_PREDICTIONS, PREDICT_STEP, PredictRefused, PredictStep, PredictionCounts,
    PruneBound,
};
pub use reply::{HolderLists, Prompt, SAME_HOLDERS, union_holders};
pub use table::SeqHasherBuilder;
pub use tree::ChainAt;

use crate::types::{BlockHash, EngineHash, IndexId, SeqHash, Tier, TierSet, WorkerSlot};
use clear::Clearing;
use hashbrown::HashMap;
use keyed::KeyedBlocks;
use predict::Tick;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use tree::Tree;

/// The part of one (model, tenant) index that lives in this shard.
#[derive(Default)]
pub struct IndexShard {
    tree: Tree,
    /// Blocks stored by rolling hash alone, and their holders.
    keyed: KeyedBlocks,
    prune: Option<PruneBound>,
    /// Slots being cleared, if any.
    clearing: Option<Box<Clearing>>,
    /// Sequence hash → node of the blocks an import filed, until it ends.
    seeding: HashMap<SeqHash, tree::NodeId>,
    /// The index's live predictions over every shard, once it had one here, and
    /// how many of them this shard last said were its own.
    live_predictions: Option<Arc<AtomicUsize>>,
    told: usize,
}

impl IndexShard {
    /// Blocks (and paths to them) in this index shard.
    pub fn len(&self) -> usize {
        self.tree.len() + self.keyed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks held per slot as `tree_sizes` reports them: a slot being cleared of
    /// every tier holds nothing. One cleared of some tiers still counts, until the
    /// walk passes them, the blocks it held only on those.
    pub fn tree_sizes_into(&self, out: &mut Vec<u32>) {
        let at = out.len();
        let (tree, keyed) = (self.tree.per_slot(), self.keyed.per_slot());
        out.extend(
            (0..tree.len().max(keyed.len()))
                .map(|i| tree.get(i).copied().unwrap_or(0) + keyed.get(i).copied().unwrap_or(0)),
        );
        if let Some(d) = &self.clearing {
            for (i, n) in out[at..].iter_mut().enumerate() {
                if d.clears(WorkerSlot(i as u32)) == TierSet::ALL {
                    *n = 0;
                }
            }
        }
    }

    #[cfg(test)]
    fn tree_sizes(&self) -> Vec<u32> {
        let mut out = Vec::new();
        self.tree_sizes_into(&mut out);
        out
    }

    /// Give an emptied tree's memory back, unless a clear walk is under way (it
    /// holds a cursor into a slot's engine map).
    fn shrink_if_empty(&mut self) {
        if self.clearing.is_none() {
            self.tree.shrink_if_empty();
        }
    }

    /// Approximate heap bytes owned by this index shard.
    pub fn heap_bytes(&self) -> usize {
        self.tree.heap_bytes() + self.keyed.heap_bytes() + self.seeding.allocation_size()
    }
}

/// All index shards of one executor.
#[derive(Default)]
pub struct Shard {
    indexes: Vec<IndexShard>,
    /// Ops applied since start, for metrics.
    pub applied: u64,
    pub predictions: PredictionCounts,
    /// Stores skipped because their slot names no such parent, and removals of
    /// blocks the slot does not hold, since start.
    pub unknown_parent: u64,
    pub unknown_removed: u64,
    /// Stores that changed nothing: the slot held every block already.
    pub duplicate_stores: u64,
    /// Blocks a KV-cache group (not full attention) stored or removed that its
    /// worker does not hold in full attention, since start.
    pub group_unheld: u64,
    /// The bound on every shard's blocks together; `None`: unbounded.
    budget: Option<BlockBudget>,
    /// Blocks this shard has added to the budget's count.
    counted: usize,
    /// Blocks evicted to stay within the budget, since start.
    pub evicted: u64,
    /// The most live predictions an index may hold (`--max-predictions`).
    max_predictions: Option<usize>,
    /// The eviction turn (index × its tree, then its keyed table) next.
    evict_from: usize,
    /// The last eviction step stopped with the shards over the budget.
    over_budget: bool,
    /// Indexes with slots being cleared, oldest first (see [`Clearing`]).
    clearing: Vec<IndexId>,
    /// The latest tick [`Self::expire`] was given: predictions due by then ended.
    expired_to: Tick,
    /// Buckets a clear walks per step; 0 means [`clear::CLEAR_STEP_BUCKETS`].
    clear_step_buckets: usize,
    /// A run of stores being filed (scratch).
    run: Vec<(EngineHash, BlockHash)>,
    /// A run of one group event's blocks being applied (scratch).
    group_run: Vec<EngineHash>,
    /// Lookup scratch.
    merge: Vec<u32>,
    seqs: Vec<SeqHash>,
}

/// The index shard of `index`, created if new (tracking use if the shard is
/// bounded). A function of the vector alone, so the caller can still update the
/// shard's counters while holding it.
fn index_mut(indexes: &mut Vec<IndexShard>, index: IndexId, bounded: bool) -> &mut IndexShard {
    let i = index.0 as usize;
    if indexes.len() <= i {
        indexes.resize_with(i + 1, || {
            let mut ix = IndexShard::default();
            if bounded {
                ix.tree.track_use();
                ix.keyed.track_use();
            }
            ix
        });
    }
    &mut indexes[i]
}

impl Shard {
    pub fn index(&self, index: IndexId) -> Option<&IndexShard> {
        self.indexes.get(index.0 as usize)
    }

    pub fn heap_bytes(&self) -> usize {
        self.indexes.iter().map(IndexShard::heap_bytes).sum()
    }

    /// Heap bytes of the slots' engine-hash maps (part of [`Self::heap_bytes`]).
    pub fn engine_map_bytes(&self) -> usize {
        self.indexes
            .iter()
            .map(|ix| ix.tree.engine_heap_bytes())
            .sum()
    }

    /// Blocks in this shard (all indexes), and (block, holder) pairs per tier, for
    /// metrics: counters kept as ops apply, O(indexes).
    pub fn tier_counts(&self) -> (u64, [u64; Tier::COUNT]) {
        let blocks = self.indexes.iter().map(|ix| ix.len() as u64).sum();
        let mut pairs = [0; Tier::COUNT];
        for ix in &self.indexes {
            let (tree, keyed) = (ix.tree.tier_pairs(), ix.keyed.tier_pairs());
            for ((p, t), k) in pairs.iter_mut().zip(tree).zip(keyed) {
                *p += t + k;
            }
        }
        (blocks, pairs)
    }
}

#[cfg(test)]
mod tests;
