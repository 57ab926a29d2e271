//! Clears of worker slots, walked in steps between which the executor serves
//! ([`Clearing`]): each slot's engine map in the tree, then the keyed table. Owns
//! the ops that wait for a walk and how the shard answers meanwhile (as if the
//! clears were done). Never walks a whole index in one step, and never lets an
//! op of a slot under a clear overtake the slot's ops before it.

use super::holders::Holder;
use super::table::Cursor;
use super::{IndexShard, Shard, ShardOp, index_mut, tree};
use crate::types::{IndexId, TierSet, WorkerSlot};

/// Engine-map buckets or table buckets a clear walks per step by default: a
/// fraction of a millisecond.
const CLEAR_STEP_BUCKETS: usize = 1 << 14;

/// Ops for slots under a clear that wait before the clear is finished at once: a
/// bound on the memory a flood for such a slot can hold.
const MAX_DEFERRED: usize = 1 << 20;

/// Slots of one index being cleared, of every tier (an unregister, a worker's
/// `AllBlocksCleared`) or of some (a clear scoped to a medium, Mooncake's
/// `RemoveAll`): walked in steps ([`Shard::step_clears`]) so that the executor
/// serves between them instead of stalling for millions of blocks. The tree is
/// walked one slot at a time through that slot's engine map, then the keyed table
/// (usually empty) bucket by bucket. Until the walk is done the index answers as
/// if it were: lookups and exports leave the cleared tiers of these slots out, and
/// `tree_sizes` counts a slot cleared of every tier as holding nothing. A store
/// or seed on a tier being cleared waits (in `deferred`) until the walks that
/// clear it are done, so it never lands on a block a walk has yet to pass, and so
/// does every later op of its slot, to keep the slot's order. Other ops commute
/// with the clears and apply at once: removals and further clears take bits off
/// either way, and stores to other tiers or slots are bits the walks do not take.
#[derive(Default)]
pub(super) struct Clearing {
    /// Per slot, the tiers the walk under way takes off it.
    walking: Vec<TierSet>,
    /// The slot whose engine map the walk is in, and where.
    tree_slot: usize,
    tree_at: tree::NamesAt,
    /// Where the walk of the keyed table is, once the tree's is done.
    keyed_at: Cursor,
    /// The walk has taken a step (later clears wait for the next walk).
    began: bool,
    /// Per slot, the tiers cleared after the walk began: the next walk's.
    pending: Vec<TierSet>,
    /// Ops waiting for the clears, in arrival order.
    deferred: Vec<ShardOp>,
    /// Per slot, how many of `deferred` are its.
    waiting: Vec<u32>,
}

impl Clearing {
    /// The tiers `slot` is losing (none if it is not being cleared).
    #[inline]
    pub(super) fn clears(&self, slot: WorkerSlot) -> TierSet {
        let i = slot.0 as usize;
        let of = |set: &[TierSet]| set.get(i).copied().unwrap_or(TierSet::NONE);
        of(&self.walking) | of(&self.pending)
    }

    /// Whether ops of `slot` are waiting.
    #[inline]
    pub(super) fn waits(&self, slot: WorkerSlot) -> bool {
        self.waiting.get(slot.0 as usize).is_some_and(|&n| n > 0)
    }

    /// Whether `op` must wait for the clears (see [`Clearing`]).
    #[inline]
    fn must_wait(&self, op: &ShardOp) -> bool {
        let Some(slot) = op.slot() else {
            // The end of an import waits for the import's seeds that wait.
            return !self.deferred.is_empty();
        };
        if self.waits(slot) {
            return true;
        }
        let clears = self.clears(slot);
        match *op {
            ShardOp::Store { tier, .. }
            | ShardOp::StoreKeyed { tier, .. }
            | ShardOp::Seed { tier, .. } => clears.contains(tier),
            // A group's hold follows the device store it names.
            ShardOp::GroupHold { held, .. } => held && clears.contains(crate::types::Tier::DEVICE),
            ShardOp::Remove { .. }
            | ShardOp::ClearSlot { .. }
            | ShardOp::SeedDone { .. }
            | ShardOp::GroupSpec { .. } => false,
        }
    }

    fn wait(&mut self, op: ShardOp) {
        if let Some(slot) = op.slot() {
            let i = slot.0 as usize;
            if self.waiting.len() <= i {
                self.waiting.resize(i + 1, 0);
            }
            self.waiting[i] += 1;
        }
        self.deferred.push(op);
    }

    /// `holder` as it will be once the clears are done; `None` if it will be gone.
    #[inline]
    pub(super) fn after(&self, holder: Holder) -> Option<Holder> {
        let slot = holder.slot();
        let tiers = holder.tiers().without(self.clears(slot));
        (!tiers.is_empty()).then(|| holder.with_tiers(tiers))
    }

    /// Clear `tiers` of `slot`, which has no op waiting: with the walk if it has
    /// not begun, else with the next.
    fn add(&mut self, slot: WorkerSlot, tiers: TierSet) {
        let set = if self.began {
            &mut self.pending
        } else {
            &mut self.walking
        };
        lose(set, slot, tiers);
    }
}

/// Add `tiers` to what `slot` loses in `losing` (per slot, the tiers a clear takes off).
fn lose(losing: &mut Vec<TierSet>, slot: WorkerSlot, tiers: TierSet) {
    let i = slot.0 as usize;
    if losing.len() <= i {
        losing.resize(i + 1, TierSet::NONE);
    }
    losing[i] |= tiers;
}

impl IndexShard {
    /// Whether `op` must wait for the clears under way (see [`Clearing`]).
    #[inline]
    fn must_wait(&self, op: &ShardOp) -> bool {
        self.clearing.as_ref().is_some_and(|d| d.must_wait(op))
    }
}

impl Shard {
    /// Whether `op` must wait for the clears under way in its index.
    pub(super) fn must_wait(&self, op: &ShardOp) -> bool {
        self.indexes
            .get(op.index().0 as usize)
            .is_some_and(|ix| ix.must_wait(op))
    }

    /// Finish every clear under way (and apply the ops that waited for them).
    pub fn finish(&mut self) {
        while let Some(&index) = self.clearing.first() {
            self.finish_clears(index);
        }
    }

    /// Finish the clears that ops wait for, so that every op applied so far shows.
    /// An export needs this: it must cover every op before it, and answers for the
    /// clears still walking as if they were done.
    pub fn finish_deferred(&mut self) {
        let waiting: Vec<IndexId> = self
            .clearing
            .iter()
            .copied()
            .filter(|&i| {
                self.indexes[i.0 as usize]
                    .clearing
                    .as_ref()
                    .is_some_and(|d| !d.deferred.is_empty())
            })
            .collect();
        for index in waiting {
            self.finish_clears(index);
        }
    }

    /// Ops held until a clear of their slot is walked: stores on a tier being
    /// cleared, and every later op of their slot.
    pub fn waiting_ops(&self) -> usize {
        self.clearing
            .iter()
            .filter_map(|i| self.indexes[i.0 as usize].clearing.as_ref())
            .map(|d| d.deferred.len())
            .sum()
    }

    /// How many buckets a clear walks per [`Self::step_clears`] (tests walk in tiny
    /// steps, to meet clears partway).
    pub fn set_clear_step_buckets(&mut self, buckets: usize) {
        self.clear_step_buckets = buckets.max(1);
    }

    /// Walk one step of the clears of the index whose clears began first. Returns
    /// whether a clear is still under way.
    pub fn step_clears(&mut self) -> bool {
        if let Some(&index) = self.clearing.first() {
            self.clear_walk_step(index);
        }
        !self.clearing.is_empty()
    }

    pub(super) fn finish_clears(&mut self, index: IndexId) {
        while self.indexes[index.0 as usize].clearing.is_some() {
            self.clear_walk_step(index);
        }
    }

    /// Start clearing `tiers` of `slot` of `index` (no op of the slot waits).
    pub(super) fn clear_slot(&mut self, index: IndexId, slot: WorkerSlot, tiers: TierSet) {
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        ix.clearing.get_or_insert_default().add(slot, tiers);
        if !self.clearing.contains(&index) {
            self.clearing.push(index);
        }
    }

    /// Hold `op` until the clears it must wait for are done; finish them at once if
    /// too many ops wait.
    #[cold]
    pub(super) fn defer(&mut self, op: ShardOp) {
        let index = op.index();
        let d = self.indexes[index.0 as usize]
            .clearing
            .as_mut()
            .expect("only an index with clears under way defers");
        d.wait(op);
        if d.deferred.len() >= MAX_DEFERRED {
            self.finish_clears(index);
        }
    }

    /// One step of the clear walk of `index`: a step of one slot's engine map, or
    /// of the keyed table once every slot's is done. A walk that is done starts
    /// the next with the clears that came meanwhile (or ends), and the ops that
    /// waited for it apply, in order (those for slots still being cleared wait
    /// again).
    fn clear_walk_step(&mut self, index: IndexId) {
        let budget = match self.clear_step_buckets {
            0 => CLEAR_STEP_BUCKETS,
            n => n,
        };
        let ix = &mut self.indexes[index.0 as usize];
        let Some(d) = ix.clearing.as_mut() else {
            self.clearing.retain(|&i| i != index);
            return;
        };
        d.began = true;
        while d.tree_slot < d.walking.len() && d.walking[d.tree_slot].is_empty() {
            d.tree_slot += 1;
        }
        if d.tree_slot < d.walking.len() {
            let slot = WorkerSlot(d.tree_slot as u32);
            if ix
                .tree
                .clear_step(slot, d.walking[d.tree_slot], &mut d.tree_at, budget)
            {
                d.tree_slot += 1;
                d.tree_at = tree::NamesAt::default();
            }
            return;
        }
        if ix.keyed.is_empty() {
            d.keyed_at = Cursor::done();
        } else {
            ix.keyed.clear_step(&d.walking, &mut d.keyed_at, budget);
        }
        if !d.keyed_at.is_done() {
            return;
        }
        let waited = std::mem::take(&mut d.deferred);
        // The next walk: the clears that came meanwhile, from the start.
        **d = Clearing {
            walking: std::mem::take(&mut d.pending),
            ..Clearing::default()
        };
        if d.walking.iter().all(|t| t.is_empty()) {
            ix.clearing = None;
            ix.shrink_if_empty();
            self.clearing.retain(|&i| i != index);
        }
        self.apply_staged(&waited);
    }
}
