//! The block budget the shards share (`--max-blocks`): each shard adds what it
//! holds to one atomic count and, while the total is over the bound, evicts its
//! own least recently used blocks, in steps between which its executor serves.
//! Never touches another shard's blocks, and touches the atomic once per store
//! run, eviction step or drain pass, never per block.

use super::keyed::EVICT_TURNS;
use super::{IndexShard, Shard};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most blocks every shard together holds (`--max-blocks`), shared by the
/// shards: each adds what it files and takes off what goes (an atomic add per
/// store run or drain pass, not per block), and one that stores past the bound
/// evicts its own least recently used blocks. A bound split per shard would give
/// one worker's blocks, which live in one shard, a fraction of it.
#[derive(Clone, Debug)]
pub struct BlockBudget {
    pub max: usize,
    held: Arc<AtomicUsize>,
}

impl BlockBudget {
    pub fn new(max: usize) -> Self {
        BlockBudget {
            max,
            held: Arc::default(),
        }
    }
}

/// Eviction turns per index: its tree, then its keyed table.
const TURNS_PER_INDEX: usize = 2;

/// Blocks one step evicts at most: a fraction of a millisecond.
const EVICT_STEP: usize = 1024;

impl Shard {
    /// Hold, with the other shards sharing `budget`, at most its `max` blocks over
    /// all indexes, evicting those not stored or matched for longest; `None` lifts
    /// the bound.
    pub fn set_block_budget(&mut self, budget: Option<BlockBudget>) {
        self.budget = budget;
        self.counted = 0;
        if self.budget.is_some() {
            for ix in &mut self.indexes {
                ix.tree.track_use();
                ix.keyed.track_use();
            }
            self.keep_budget(EVICT_STEP);
        }
    }

    /// Tell the budget how many blocks this shard holds now (removals and clears
    /// free room between stores). Returns the count over every shard.
    pub fn sync_budget(&mut self) -> usize {
        let Some(b) = &self.budget else { return 0 };
        let local: usize = self.indexes.iter().map(IndexShard::len).sum();
        if local >= self.counted {
            let add = local - self.counted;
            self.counted = local;
            if add == 0 {
                return b.held.load(Ordering::Relaxed);
            }
            b.held.fetch_add(add, Ordering::Relaxed) + add
        } else {
            let sub = self.counted - local;
            self.counted = local;
            b.held.fetch_sub(sub, Ordering::Relaxed) - sub
        }
    }

    /// Evict until every shard together is within the budget (or this one has
    /// nothing left to evict), at most `step` blocks; sets whether more is left.
    /// Every index's tree and keyed table take turns; one that finds nothing
    /// passes the turn on.
    pub(super) fn keep_budget(&mut self, step: usize) {
        let Some(max) = self.budget.as_ref().map(|b| b.max) else {
            return;
        };
        let mut total = self.sync_budget();
        let turns = self.indexes.len() * TURNS_PER_INDEX;
        // Turns without an eviction: a full round of them means nothing here can go.
        let (mut misses, mut evicted) = (0, 0);
        while total > max && misses < 4 * (EVICT_TURNS + 1) * turns && evicted < step {
            let turn = self.evict_from % turns;
            self.evict_from = turn + 1;
            let ix = &mut self.indexes[turn / TURNS_PER_INDEX];
            let before = ix.len();
            let done = match turn % TURNS_PER_INDEX {
                0 => ix.tree.evict().is_some(),
                _ => ix.keyed.evict(),
            };
            if !done {
                misses += 1;
                continue;
            }
            misses = 0;
            evicted += 1;
            // What went here; the other shards' changes show at the next sync.
            total = total.saturating_sub(before - ix.len());
        }
        self.evicted += evicted as u64;
        let total = self.sync_budget();
        self.over_budget = total > max && evicted == step;
    }

    /// One step of keeping the budget: what stores filed past it since the last
    /// step is evicted, at most [`EVICT_STEP`] blocks (a fraction of a
    /// millisecond), the executor serving between steps. Returns whether more
    /// is left to evict.
    pub fn step_budget(&mut self) -> bool {
        self.keep_budget(EVICT_STEP);
        self.over_budget
    }

    /// The last step left blocks to evict: a drain loop takes no more ops until
    /// the steps after it caught up, so what stores file past the budget is at
    /// most one drain pass's.
    pub fn evicting(&self) -> bool {
        self.over_budget
    }
}
