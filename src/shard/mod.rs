//! One executor's shard of the block index.
//!
//! Owns, for every (model, tenant) index, the blocks whose sequence hash the
//! partition function assigns to this shard: sequence hash → (parent, local
//! hash, holders), in [`blocks::Blocks`] (which derives most keys instead of
//! storing them). Changes arrive only as [`ShardOp`]s through [`Shard::apply`]
//! (live events, replay, dump and bootstrap alike; predictions from `/speculate`),
//! and predictions end through [`Shard::expire`]. A clear of a worker's slot (all
//! its tiers or some) is walked in steps between which the executor serves
//! ([`Shard::step_clears`]), answering as if the clear were done. With a block
//! budget (`--max-blocks`) a store past it evicts the block least recently stored
//! or matched. A shard never touches another shard's memory and never blocks.

pub mod blocks;
pub mod holders;
pub mod predict;
pub mod table;
pub mod tree;

use crate::types::{BlockHash, IndexId, SeqHash, Tier, TierSet, WorkerSlot};
use blocks::{Blocks, EVICT_TURNS, Hand, Walk};
use holders::{Holder, HolderSet, HolderSlab};
use predict::{Predicted, Predictions, Tick};
pub use table::SeqHasherBuilder;

/// In a lookup's output, a block held exactly as the block before it (see
/// [`Shard::lookup`]); never a holder count, since a block has fewer holders than
/// there are worker slots.
pub const SAME_HOLDERS: u32 = u32::MAX;

/// How many blocks ahead [`Shard::apply_all`] and [`Shard::lookup`] load the table
/// buckets: enough misses in flight to cover memory latency, few enough that
/// the lines are still cached when their op comes.
const PREFETCH_AHEAD: usize = 8;

/// The one way to change a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardOp {
    /// `slot` holds block `seq` on `tier`. `parent` is `None` for a first block.
    Store {
        index: IndexId,
        seq: SeqHash,
        parent: Option<SeqHash>,
        local: BlockHash,
        slot: WorkerSlot,
        tier: Tier,
    },
    /// `slot` no longer holds `seq` on the tiers in `tiers`.
    Remove {
        index: IndexId,
        seq: SeqHash,
        slot: WorkerSlot,
        tiers: TierSet,
    },
    /// `slot` holds nothing any more on the tiers in `tiers` (AllBlocksCleared, unregister).
    ClearSlot {
        index: IndexId,
        slot: WorkerSlot,
        tiers: TierSet,
    },
    /// A router expects `slot` to hold `seq` soon: it counts as held on the device
    /// until `expires`, or until a `Store` of the block by `slot` confirms it.
    Predict {
        index: IndexId,
        seq: SeqHash,
        parent: Option<SeqHash>,
        local: BlockHash,
        slot: WorkerSlot,
        expires: Tick,
    },
}

impl ShardOp {
    /// The block an op is about (its owning shard's key); `None` for a clear, which
    /// goes to every shard.
    pub fn seq(&self) -> Option<SeqHash> {
        match *self {
            ShardOp::Store { seq, .. }
            | ShardOp::Remove { seq, .. }
            | ShardOp::Predict { seq, .. } => Some(seq),
            ShardOp::ClearSlot { .. } => None,
        }
    }

    /// The index an op changes.
    pub fn index(&self) -> IndexId {
        match *self {
            ShardOp::Store { index, .. }
            | ShardOp::Remove { index, .. }
            | ShardOp::Predict { index, .. }
            | ShardOp::ClearSlot { index, .. } => index,
        }
    }

    /// The worker slot an op changes.
    pub fn slot(&self) -> WorkerSlot {
        match *self {
            ShardOp::Store { slot, .. }
            | ShardOp::Remove { slot, .. }
            | ShardOp::Predict { slot, .. }
            | ShardOp::ClearSlot { slot, .. } => slot,
        }
    }
}

/// An export splits an index into at most `1 << EXPORT_BITS_MAX` parts, one request
/// each.
const EXPORT_BITS_MAX: u32 = 12;

/// Table buckets a clear walks per step by default: a fraction of a millisecond.
const CLEAR_STEP_BUCKETS: usize = 1 << 14;

/// Ops for slots under a clear that wait before the clear is finished at once: a
/// bound on the memory a flood for such a slot can hold.
const MAX_DEFERRED: usize = 1 << 20;

/// Slots of one index being cleared, of every tier (an unregister, a worker's
/// `AllBlocksCleared`) or of some (a clear scoped to a medium, Mooncake's
/// `RemoveAll`): [`CLEAR_STEP_BUCKETS`] of the blocks' buckets per
/// [`Shard::step_clears`], so that the executor serves between steps instead of
/// stalling for a walk of millions of blocks. Until the walk is done the index
/// answers as if it were: lookups and dumps leave the cleared tiers of these slots
/// out, and `tree_sizes` counts a slot cleared of every tier as holding nothing.
/// A store or prediction on a tier being cleared waits (in `deferred`) until the
/// walks that clear it are done, so it never lands on a block a walk has yet to
/// pass, and so does every later op of its slot, to keep the slot's order. Other
/// ops commute with the clears and apply at once: removals and further clears
/// take bits off either way, and stores to other tiers or slots are bits the
/// walks do not take.
#[derive(Default)]
struct Clearing {
    /// Per slot, the tiers the walk under way takes off it.
    walking: Vec<TierSet>,
    at: Walk,
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
    fn clears(&self, slot: WorkerSlot) -> TierSet {
        let i = slot.0 as usize;
        let of = |set: &[TierSet]| set.get(i).copied().unwrap_or(TierSet::NONE);
        of(&self.walking) | of(&self.pending)
    }

    /// Whether ops of `slot` are waiting.
    #[inline]
    fn waits(&self, slot: WorkerSlot) -> bool {
        self.waiting.get(slot.0 as usize).is_some_and(|&n| n > 0)
    }

    /// Whether `op` must wait for the clears (see [`Clearing`]).
    #[inline]
    fn must_wait(&self, op: &ShardOp) -> bool {
        let slot = op.slot();
        if self.waits(slot) {
            return true;
        }
        let clears = self.clears(slot);
        match *op {
            ShardOp::Store { tier, .. } => clears.contains(tier),
            ShardOp::Predict { .. } => clears.contains(Tier::PREDICTED),
            ShardOp::Remove { .. } | ShardOp::ClearSlot { .. } => false,
        }
    }

    fn wait(&mut self, op: ShardOp) {
        let i = op.slot().0 as usize;
        if self.waiting.len() <= i {
            self.waiting.resize(i + 1, 0);
        }
        self.waiting[i] += 1;
        self.deferred.push(op);
    }

    /// `holder` as it will be once the clears are done; `None` if it will be gone.
    #[inline]
    fn after(&self, holder: Holder) -> Option<Holder> {
        let slot = holder.slot();
        let tiers = holder.tiers().without(self.clears(slot));
        (!tiers.is_empty()).then(|| Holder::new(slot, tiers))
    }

    /// Clear `tiers` of `slot`, which has no op waiting: with the walk if it has
    /// not begun, else with the next.
    fn add(&mut self, slot: WorkerSlot, tiers: TierSet) {
        let set = if self.at == Walk::default() {
            &mut self.walking
        } else {
            &mut self.pending
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

/// How an index fed only by predictions (approximate mode) stays bounded: once it
/// holds more than `max` blocks in this shard, the soonest-due predictions end
/// until it holds `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PruneBound {
    pub max: usize,
    pub target: usize,
}

/// What predictions did in this shard since start, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PredictionCounts {
    pub created: u64,
    pub refreshed: u64,
    pub confirmed: u64,
    pub expired: u64,
    pub pruned: u64,
}

/// A block as the dump sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpedBlock {
    pub seq: SeqHash,
    pub parent: Option<SeqHash>,
    pub local: BlockHash,
    pub holder: Holder,
}

/// The part of one (model, tenant) index that lives in this shard.
#[derive(Default)]
pub struct IndexShard {
    blocks: Blocks,
    slab: HolderSlab,
    /// Blocks held per slot (any tier), for `tree_sizes`.
    per_slot: Vec<u32>,
    /// Deadlines of the predicted holders (empty unless `/speculate` was used).
    predictions: Predictions,
    prune: Option<PruneBound>,
    /// Slots being cleared, if any.
    clearing: Option<Box<Clearing>>,
}

impl IndexShard {
    fn count(&mut self, slot: WorkerSlot, delta: i32) {
        let i = slot.0 as usize;
        if self.per_slot.len() <= i {
            self.per_slot.resize(i + 1, 0);
        }
        self.per_slot[i] = self.per_slot[i].wrapping_add_signed(delta);
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks held per slot as `tree_sizes` reports them: a slot being cleared of
    /// every tier holds nothing. One cleared of some tiers still counts, until the
    /// walk passes them, the blocks it held only on those.
    pub fn tree_sizes_into(&self, out: &mut Vec<u32>) {
        let at = out.len();
        out.extend_from_slice(&self.per_slot);
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

    /// Whether `op` must wait for the clears under way (see [`Clearing`]).
    #[inline]
    fn must_wait(&self, op: &ShardOp) -> bool {
        self.clearing.as_ref().is_some_and(|d| d.must_wait(op))
    }

    /// Approximate heap bytes owned by this index shard.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.allocation_size()
            + self.slab.capacity_bytes()
            + self.per_slot.capacity() * 4
            + self.predictions.heap_bytes()
    }

    /// Take the predicted bit off `slot`'s holder of `seq` (expiry, pruning); drops
    /// the block once nobody holds it. Returns whether the bit was there.
    fn unpredict(&mut self, seq: SeqHash, slot: WorkerSlot) -> bool {
        let Some(node) = self.blocks.get_mut(&seq) else {
            return false;
        };
        let (removed, gone) = node
            .holders
            .remove(slot, Tier::PREDICTED.bit(), &mut self.slab);
        if gone {
            if node.holders.is_empty() {
                self.blocks.remove(&seq);
            }
            self.count(slot, -1);
        }
        !removed.is_empty()
    }
}

/// All index shards of one executor.
#[derive(Default)]
pub struct Shard {
    indexes: Vec<IndexShard>,
    /// Ops applied since start, for metrics.
    pub applied: u64,
    /// (block, holder) pairs per tier over every index, kept as ops apply so that
    /// metrics never walk the blocks; `Tier::PREDICTED`'s are the live predictions.
    tier_pairs: [u64; Tier::COUNT],
    pub predictions: PredictionCounts,
    /// Most blocks this shard holds over all its indexes; `None`: unbounded.
    budget: Option<usize>,
    /// Blocks evicted to stay within the budget, since start.
    pub evicted: u64,
    /// The table hand (index × [`Hand`]) the next eviction turn goes to.
    evict_from: usize,
    /// Indexes with slots being cleared, oldest first (see [`Clearing`]).
    clearing: Vec<IndexId>,
    /// The latest tick [`Self::expire`] was given: predictions due by then ended.
    expired_to: Tick,
    /// Table buckets a clear walks per step; 0 means [`CLEAR_STEP_BUCKETS`].
    clear_step_buckets: usize,
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
                ix.blocks.track_use();
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

    /// [`Self::apply`] each op in order, loading the table buckets of the ops a few
    /// places ahead while one is applied: a table of millions of blocks misses the
    /// cache on nearly every op, and these misses then overlap instead of queueing.
    /// Every clear is done on return.
    pub fn apply_all(&mut self, ops: &[ShardOp]) {
        self.apply_staged(ops);
        self.finish();
    }

    /// [`Self::apply_all`], except that clears are walked later, in steps
    /// ([`Self::step_clears`]); the shard answers meanwhile as if they were done.
    /// Clears that come before their walk begins share it.
    pub fn apply_staged(&mut self, ops: &[ShardOp]) {
        for op in ops.iter().take(PREFETCH_AHEAD) {
            self.prefetch(op);
        }
        for (i, op) in ops.iter().enumerate() {
            if let Some(ahead) = ops.get(i + PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            self.apply(*op);
        }
    }

    /// Finish every clear under way (and apply the ops that waited for them).
    pub fn finish(&mut self) {
        while let Some(&index) = self.clearing.first() {
            self.finish_clears(index);
        }
    }

    /// Finish the clears that ops wait for, so that every op applied so far shows.
    /// A dump needs this: it must cover every op before it, and answers for the
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

    /// Ops held until a clear of their slot is walked: stores and predictions on a
    /// tier being cleared, and every later op of their slot.
    pub fn waiting_ops(&self) -> usize {
        self.clearing
            .iter()
            .filter_map(|i| self.indexes[i.0 as usize].clearing.as_ref())
            .map(|d| d.deferred.len())
            .sum()
    }

    /// How many table buckets a clear walks per [`Self::step_clears`] (tests walk in
    /// tiny steps, to meet clears partway).
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

    fn finish_clears(&mut self, index: IndexId) {
        while self.indexes[index.0 as usize].clearing.is_some() {
            self.clear_walk_step(index);
        }
    }

    /// Start clearing `tiers` of `slot` of `index` (no op of the slot waits).
    fn clear_slot(&mut self, index: IndexId, slot: WorkerSlot, tiers: TierSet) {
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        ix.clearing.get_or_insert_default().add(slot, tiers);
        if !self.clearing.contains(&index) {
            self.clearing.push(index);
        }
    }

    /// Hold `op` until the clears it must wait for are done; finish them at once if
    /// too many ops wait.
    #[cold]
    fn defer(&mut self, op: ShardOp) {
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

    /// One step of the clear walk of `index`. A walk that is done starts the next
    /// with the clears that came meanwhile (or ends), and the ops that waited for
    /// it apply, in order (those for slots still being cleared wait again).
    fn clear_walk_step(&mut self, index: IndexId) {
        let Some(d) = self.indexes[index.0 as usize].clearing.as_mut() else {
            self.clearing.retain(|&i| i != index);
            return;
        };
        let (walking, mut at) = (std::mem::take(&mut d.walking), d.at);
        let budget = match self.clear_step_buckets {
            0 => CLEAR_STEP_BUCKETS,
            n => n,
        };
        self.clear_step(index, &walking, &mut at, budget);
        let ix = &mut self.indexes[index.0 as usize];
        let d = ix
            .clearing
            .as_mut()
            .expect("only clear_walk_step ends a clear");
        d.walking = walking;
        d.at = at;
        if !at.is_done() {
            return;
        }
        d.walking = std::mem::take(&mut d.pending);
        d.at = Walk::default();
        let waited = std::mem::take(&mut d.deferred);
        d.waiting.clear();
        if d.walking.iter().all(|t| t.is_empty()) {
            ix.clearing = None;
            self.clearing.retain(|&i| i != index);
        }
        for op in waited {
            self.apply(op);
        }
    }

    /// Take `losing[slot]` off every holder of the blocks of `index` among `budget`
    /// buckets from `at` (see [`Blocks::retain_step`]; a block seen again has
    /// nothing more to lose).
    fn clear_step(&mut self, index: IndexId, losing: &[TierSet], at: &mut Walk, budget: usize) {
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        let IndexShard {
            blocks,
            slab,
            per_slot,
            ..
        } = ix;
        let mut removed = vec![0u32; losing.len()];
        let mut per_tier = [0u64; Tier::COUNT];
        let mut hit: Vec<(WorkerSlot, TierSet)> = Vec::new();
        blocks.retain_step(at, budget, |node| {
            hit.clear();
            hit.extend(node.holders.as_slice(slab).iter().filter_map(|&h| {
                let slot = Holder(h).slot();
                let tiers = losing.get(slot.0 as usize).copied()?;
                (!tiers.is_empty()).then_some((slot, tiers))
            }));
            for &(slot, tiers) in &hit {
                let (bits, gone) = node.holders.remove(slot, tiers, slab);
                for t in bits.iter() {
                    per_tier[t.0 as usize] += 1;
                }
                if gone {
                    removed[slot.0 as usize] += 1;
                }
            }
            if node.holders.is_empty() {
                node.holders.free(slab);
                false
            } else {
                true
            }
        });
        for (slot, n) in removed.into_iter().enumerate() {
            if let Some(c) = per_slot.get_mut(slot) {
                *c -= n;
            }
        }
        for (t, n) in per_tier.into_iter().enumerate() {
            self.tier_pairs[t] -= n;
        }
    }

    #[inline]
    fn prefetch(&self, op: &ShardOp) {
        if let Some(seq) = op.seq()
            && let Some(ix) = self.indexes.get(op.index().0 as usize)
        {
            ix.blocks.prefetch(seq);
        }
    }

    pub fn apply(&mut self, op: ShardOp) {
        // Every index with a clear under way is in `self.clearing`, which is
        // usually empty: checked first, it spares each op a look into its index.
        if !self.clearing.is_empty()
            && self
                .indexes
                .get(op.index().0 as usize)
                .is_some_and(|ix| ix.must_wait(&op))
        {
            return self.defer(op);
        }
        self.applied += 1;
        match op {
            ShardOp::Store {
                index,
                seq,
                parent,
                local,
                slot,
                tier,
            } => {
                let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
                let first = HolderSet::of(Holder::new(slot, tier.bit()));
                let (node, grew) = ix.blocks.get_or_insert(seq, parent, local, first);
                let before = if grew {
                    TierSet::NONE
                } else {
                    node.holders.add(slot, tier, &mut ix.slab)
                };
                if before.contains(Tier::PREDICTED) {
                    // The worker stored what it was predicted to: an ordinary holder now.
                    node.holders
                        .remove(slot, Tier::PREDICTED.bit(), &mut ix.slab);
                    ix.predictions.forget(seq, slot);
                    self.tier_pairs[Tier::PREDICTED.0 as usize] -= 1;
                    self.predictions.confirmed += 1;
                }
                if before.is_empty() {
                    ix.count(slot, 1);
                }
                if !before.contains(tier) {
                    self.tier_pairs[tier.0 as usize] += 1;
                }
                if grew {
                    self.keep_budget();
                }
            }
            ShardOp::Predict {
                index,
                seq,
                parent,
                local,
                slot,
                expires,
            } => self.predict(index, seq, parent, local, slot, expires),
            ShardOp::Remove {
                index,
                seq,
                slot,
                tiers,
            } => {
                let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
                let Some(node) = ix.blocks.get_mut(&seq) else {
                    return;
                };
                // An engine's removal names media; a prediction ends only by its TTL
                // or a confirming store.
                let tiers = tiers & TierSet::MEDIA;
                let (removed, gone) = node.holders.remove(slot, tiers, &mut ix.slab);
                if gone {
                    if node.holders.is_empty() {
                        ix.blocks.remove(&seq);
                    }
                    ix.count(slot, -1);
                }
                uncount(&mut self.tier_pairs, removed, 1);
            }
            ShardOp::ClearSlot { index, slot, tiers } => self.clear_slot(index, slot, tiers),
        }
    }

    fn predict(
        &mut self,
        index: IndexId,
        seq: SeqHash,
        parent: Option<SeqHash>,
        local: BlockHash,
        slot: WorkerSlot,
        expires: Tick,
    ) {
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        if expires <= self.expired_to {
            // Applied after its deadline had passed (it waited for a clear): ended.
            return;
        }
        let first = HolderSet::of(Holder::new(slot, Tier::PREDICTED.bit()));
        let (node, grew) = ix.blocks.get_or_insert(seq, parent, local, first);
        let before = if grew {
            TierSet::NONE
        } else {
            node.holders.tiers_of(slot, &ix.slab)
        };
        if !(before & TierSet::MEDIA).is_empty() {
            // Already held for real: nothing to predict.
            return;
        }
        if before.is_empty() {
            // A new node was filed already holding the prediction.
            if !grew {
                node.holders.add(slot, Tier::PREDICTED, &mut ix.slab);
            }
            ix.count(slot, 1);
            self.tier_pairs[Tier::PREDICTED.0 as usize] += 1;
        }
        match ix.predictions.predict(seq, slot, expires) {
            Predicted::Created => self.predictions.created += 1,
            Predicted::Refreshed => self.predictions.refreshed += 1,
        }
        if let Some(b) = ix.prune
            && ix.blocks.len() > b.max
        {
            self.prune(index, b);
        }
        if grew {
            self.keep_budget();
        }
    }

    /// Hold at most `max` blocks in this shard, over all indexes, evicting those not
    /// stored or matched for longest (see [`table::BlockTable::evict`]); `None` lifts the
    /// bound.
    pub fn set_block_budget(&mut self, max: Option<usize>) {
        self.budget = max;
        if max.is_some() {
            for ix in &mut self.indexes {
                ix.blocks.track_use();
            }
            self.keep_budget();
        }
    }

    /// Evict until the shard is within its budget. The hands of every index's tables
    /// take turns; one that finds every block in use within its turn passes the turn
    /// on, with the bits it passed cleared, so the loop ends within two laps of
    /// every table.
    fn keep_budget(&mut self) {
        let Some(max) = self.budget else { return };
        let mut total: usize = self.indexes.iter().map(|ix| ix.blocks.len()).sum();
        let hands = self.indexes.len() * Hand::BOTH.len();
        // Turns without an eviction. Two laps of every hand always find one, so the
        // bound is never reached; it only keeps a broken invariant from spinning the
        // executor forever.
        let mut misses = 0;
        while total > max && misses <= 4 * (EVICT_TURNS + 1) * hands {
            let turn = self.evict_from % hands;
            self.evict_from = turn + 1;
            let hand = Hand::BOTH[turn % Hand::BOTH.len()];
            let ix = &mut self.indexes[turn / Hand::BOTH.len()];
            let Some((seq, node)) = ix.blocks.evict(hand) else {
                misses += 1;
                continue;
            };
            misses = 0;
            for &h in node.holders.as_slice(&ix.slab) {
                let h = Holder(h);
                ix.per_slot[h.slot().0 as usize] -= 1;
                if h.has(Tier::PREDICTED) {
                    ix.predictions.forget(seq, h.slot());
                }
                uncount(&mut self.tier_pairs, h.tiers(), 1);
            }
            let mut holders = node.holders;
            holders.free(&mut ix.slab);
            total -= 1;
            self.evicted += 1;
        }
    }

    /// Bound an index fed by predictions alone (approximate mode); applies from its
    /// next prediction on.
    pub fn set_prune_bound(&mut self, index: IndexId, bound: Option<PruneBound>) {
        index_mut(&mut self.indexes, index, self.budget.is_some()).prune = bound;
    }

    /// End the soonest-due predictions of `index` until it holds `b.target` blocks.
    fn prune(&mut self, index: IndexId, b: PruneBound) {
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        let (mut ended, mut passes) = (0u64, 0);
        // A block may have several predicted holders, so one pass can fall short.
        while ix.blocks.len() > b.target && !ix.predictions.is_empty() && passes < 4 {
            let excess = ix.blocks.len() - b.target;
            let mut due = Vec::with_capacity(excess);
            ix.predictions
                .prune(excess, |seq, slot| due.push((seq, slot)));
            for (seq, slot) in due {
                if ix.unpredict(seq, slot) {
                    ended += 1;
                }
            }
            passes += 1;
        }
        self.tier_pairs[Tier::PREDICTED.0 as usize] -= ended;
        self.predictions.pruned += ended;
    }

    /// Does some prediction wait for [`Self::expire`] to end it?
    pub fn has_predictions(&self) -> bool {
        self.indexes.iter().any(|ix| !ix.predictions.is_empty())
    }

    /// End every prediction due at `now`. Visits only the wheel buckets of the ticks
    /// since the last call, in the indexes that hold predictions.
    pub fn expire(&mut self, now: Tick) {
        self.expired_to = self.expired_to.max(now);
        let mut ended = 0u64;
        for ix in &mut self.indexes {
            if ix.predictions.is_empty() {
                continue;
            }
            let IndexShard {
                predictions,
                blocks,
                slab,
                per_slot,
                ..
            } = ix;
            predictions.expire(now, |seq, slot| {
                let Some(node) = blocks.get_mut(&seq) else {
                    return;
                };
                let (removed, gone) = node.holders.remove(slot, Tier::PREDICTED.bit(), slab);
                if gone {
                    if node.holders.is_empty() {
                        blocks.remove(&seq);
                    }
                    per_slot[slot.0 as usize] -= 1;
                }
                if !removed.is_empty() {
                    ended += 1;
                }
            });
        }
        self.tier_pairs[Tier::PREDICTED.0 as usize] -= ended;
        self.predictions.expired += ended;
    }

    /// Holders of `seqs` (one part of a query, in prefix order) as `[n, holder..]`
    /// per block, or [`SAME_HOLDERS`] for a block held exactly as the block before
    /// it in `seqs` (a shared prefix: the gatherer skips it in one step), up to and
    /// including the first block nobody holds: no worker's prefix reaches past it,
    /// so the blocks after it are not looked up. A match counts as a use of the
    /// block for a bounded shard's eviction.
    pub fn lookup(&mut self, index: IndexId, seqs: &[SeqHash], out: &mut Vec<u32>) {
        let Some(ix) = self.indexes.get_mut(index.0 as usize) else {
            out.extend(seqs.first().map(|_| 0));
            return;
        };
        // Where the last written block's holders are in `out`.
        let mut last = 0..0;
        for s in seqs.iter().take(PREFETCH_AHEAD) {
            ix.blocks.prefetch(*s);
        }
        for (i, s) in seqs.iter().enumerate() {
            if let Some(ahead) = seqs.get(i + PREFETCH_AHEAD) {
                ix.blocks.prefetch(*ahead);
            }
            match ix.blocks.get_matched(s) {
                Some(node) => {
                    let hs = node.holders.as_slice(&ix.slab);
                    let at = out.len() + 1;
                    if let Some(d) = ix.clearing.as_deref() {
                        // Answer as if the clears were done: without the cleared
                        // tiers, and a block only they hold is gone.
                        out.push(0);
                        out.extend(hs.iter().filter_map(|&h| d.after(Holder(h)).map(|h| h.0)));
                        if out.len() == at {
                            return;
                        }
                        out[at - 1] = (out.len() - at) as u32;
                    } else {
                        // Predicted holders are rewritten below, so only plain ones
                        // repeat.
                        if hs.len() > 1 && ix.predictions.is_empty() && out[last.clone()] == *hs {
                            out.push(SAME_HOLDERS);
                            continue;
                        }
                        out.push(hs.len() as u32);
                        out.extend_from_slice(hs);
                        last = at..out.len();
                    }
                    if !ix.predictions.is_empty() {
                        // Scorers see a prediction as the device tier it stands for.
                        for h in &mut out[at..] {
                            *h = Holder(*h).as_scored().0;
                        }
                    }
                }
                None => {
                    out.push(0);
                    return;
                }
            }
        }
    }

    /// How many bits an export of `index` splits its key space by (`1 << bits`
    /// parts, see [`Self::dump`]): enough that a part is one table segment, so no
    /// part holds the executor longer than a segment's walk, however large the
    /// index.
    pub fn export_bits(&self, index: IndexId) -> u32 {
        self.index(index)
            .and_then(|ix| ix.blocks.part_bits(EXPORT_BITS_MAX))
            .unwrap_or(0)
    }

    /// Every (block, holder) of part `part` of one index (of `1 << bits` that
    /// together cover it once, even if its tables grow between them), for `/dump`
    /// and snapshots.
    pub fn dump(&self, index: IndexId, part: usize, bits: u32, out: &mut Vec<DumpedBlock>) {
        let Some(ix) = self.index(index) else { return };
        // One allocation up front: growing a vector of millions of pairs by doubling
        // would copy it repeatedly on the executor. Blocks bound pairs from below.
        out.reserve(ix.blocks.len_part(part, bits));
        for (seq, parent, node) in ix.blocks.iter_part(part, bits) {
            for &h in node.holders.as_slice(&ix.slab) {
                let h = match ix.clearing.as_deref() {
                    None => Holder(h),
                    Some(d) => match d.after(Holder(h)) {
                        Some(h) => h,
                        None => continue,
                    },
                };
                // Predictions are the router's guesses, not the engines' state.
                let tiers = h.tiers() & TierSet::MEDIA;
                if tiers.is_empty() {
                    continue;
                }
                out.push(DumpedBlock {
                    seq,
                    parent,
                    local: node.local(),
                    holder: Holder::new(h.slot(), tiers),
                });
            }
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.indexes.iter().map(IndexShard::heap_bytes).sum()
    }

    /// Blocks in this shard (all indexes), and (block, holder) pairs per tier, for
    /// metrics: counters kept as ops apply, O(indexes).
    pub fn tier_counts(&self) -> (u64, [u64; Tier::COUNT]) {
        let blocks = self.indexes.iter().map(|ix| ix.blocks.len() as u64).sum();
        (blocks, self.tier_pairs)
    }

    /// The same figures by walking every block (what the counters must equal).
    #[cfg(test)]
    fn tier_counts_walked(&self) -> [u64; Tier::COUNT] {
        let mut tiers = [0u64; Tier::COUNT];
        for ix in &self.indexes {
            for node in ix.blocks.values() {
                for &h in node.holders.as_slice(&ix.slab) {
                    for (t, n) in tiers.iter_mut().enumerate() {
                        if Holder(h).has(Tier(t as u8)) {
                            *n += 1;
                        }
                    }
                }
            }
        }
        tiers
    }
}

/// Take `mult` off the tier counters of every tier in `tiers`.
fn uncount(pairs: &mut [u64; Tier::COUNT], tiers: TierSet, mult: u64) {
    for t in tiers.iter() {
        pairs[t.0 as usize] -= mult;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(seq: u64, slot: u32, tier: Tier) -> ShardOp {
        ShardOp::Store {
            index: IndexId(0),
            seq: SeqHash(seq),
            parent: None,
            local: BlockHash(seq),
            slot: WorkerSlot(slot),
            tier,
        }
    }

    /// The longest part of an export of a large index (`KVIX_STALL_ENTRIES` blocks,
    /// default 4M), in sixteen parts and in as many as the shard picks
    /// ([`Shard::export_bits`]): what a query waits behind one part. A figure, not a
    /// check: `cargo test --release --lib export_part_stall -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn export_part_stall() {
        use std::time::{Duration, Instant};
        let n = crate::testing::env_u64("KVIX_STALL_ENTRIES", 4 << 20);
        let mut s = Shard::default();
        for i in 0..n {
            let seq = xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes());
            s.apply(store(seq, 1, Tier::DEVICE));
        }
        for bits in [4, s.export_bits(IndexId(0))] {
            let (mut worst, mut pairs) = (Duration::ZERO, 0);
            for part in 0..1 << bits {
                let t = Instant::now();
                let mut out = Vec::new();
                s.dump(IndexId(0), part, bits, &mut out);
                worst = worst.max(t.elapsed());
                pairs += out.len();
            }
            println!(
                "{n} blocks, {} parts: worst part {worst:?}, {pairs} pairs",
                1 << bits
            );
        }
    }

    /// What a query waits behind while one worker is cleared from a large index
    /// (`KVIX_STALL_ENTRIES` blocks, default 4M, held by 16 workers on the device, a
    /// third also on the host): the longest call among the clear's own, its walk's
    /// steps and the worker's next store, against the whole walk; for a clear of
    /// its host tier, and for a clear of every tier followed at once by a store (an
    /// engine that resets its cache and goes on). A figure, not a check:
    /// `cargo test --release --lib clear_stall -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn clear_stall() {
        use std::time::{Duration, Instant};
        let n = crate::testing::env_u64("KVIX_STALL_ENTRIES", 4 << 20);
        for (what, tiers) in [
            ("host tier", Tier::HOST.bit()),
            ("every tier", TierSet::ALL),
        ] {
            let mut s = Shard::default();
            for i in 0..n {
                let seq = xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes());
                let slot = (i % 16) as u32;
                s.apply(store(seq, slot, Tier::DEVICE));
                if i % 3 == 0 {
                    s.apply(store(seq, slot, Tier::HOST));
                }
            }
            let clear = ShardOp::ClearSlot {
                index: IndexId(0),
                slot: WorkerSlot(3),
                tiers,
            };
            let (start, mut worst, mut steps) = (Instant::now(), Duration::ZERO, 0);
            let mut timed = |f: &mut dyn FnMut() -> bool| {
                let t = Instant::now();
                let more = f();
                worst = worst.max(t.elapsed());
                more
            };
            timed(&mut || {
                s.apply_staged(&[clear, store(u64::MAX, 3, Tier::HOST)]);
                true
            });
            while timed(&mut || s.step_clears()) {
                steps += 1;
            }
            println!(
                "{n} blocks, {what} cleared: {steps} steps, {:?} in all, longest call {worst:?}",
                start.elapsed()
            );
        }
    }

    /// A drop of `slot`'s every tier in index 0 (an unregister).
    fn drop_op(slot: u32) -> ShardOp {
        ShardOp::ClearSlot {
            index: IndexId(0),
            slot: WorkerSlot(slot),
            tiers: TierSet::ALL,
        }
    }

    impl Shard {
        /// Whether an op of `slot` waits for a clear of `index`.
        fn waits(&self, index: IndexId, slot: WorkerSlot) -> bool {
            self.index(index)
                .and_then(|ix| ix.clearing.as_deref())
                .is_some_and(|d| d.waits(slot))
        }

        /// Whether `slot` of `index` is being cleared of some tiers, not all.
        fn clears_some_tiers(&self, index: IndexId, slot: WorkerSlot) -> bool {
            self.index(index)
                .and_then(|ix| ix.clearing.as_deref())
                .is_some_and(|d| !matches!(d.clears(slot), TierSet::NONE | TierSet::ALL))
        }
    }

    fn holders(s: &mut Shard, seq: u64) -> Vec<u32> {
        let mut out = Vec::new();
        s.lookup(IndexId(0), &[SeqHash(seq)], &mut out);
        out[1..].to_vec()
    }

    #[test]
    fn lookup_stops_after_the_first_block_nobody_holds() {
        let mut s = Shard::default();
        for seq in [1, 2, 4] {
            s.apply(store(seq, 3, Tier::DEVICE));
        }
        let h = Holder::new(WorkerSlot(3), Tier::DEVICE.bit()).0;
        let mut out = Vec::new();
        s.lookup(IndexId(0), &[1, 2, 3, 4].map(SeqHash), &mut out);
        assert_eq!(out, vec![1, h, 1, h, 0]);
        out.clear();
        s.lookup(IndexId(9), &[1, 2].map(SeqHash), &mut out);
        assert_eq!(out, vec![0]);
    }

    #[test]
    fn spill_and_shrink_keep_every_holder() {
        let mut s = Shard::default();
        for slot in 0..40 {
            s.apply(store(7, slot, Tier::DEVICE));
        }
        assert_eq!(holders(&mut s, 7).len(), 40);
        for slot in (0..40).step_by(2) {
            s.apply(ShardOp::Remove {
                index: IndexId(0),
                seq: SeqHash(7),
                slot: WorkerSlot(slot),
                tiers: TierSet::ALL,
            });
        }
        let left: Vec<u32> = holders(&mut s, 7)
            .iter()
            .map(|h| Holder(*h).slot().0)
            .collect();
        assert_eq!(left, (1..40).step_by(2).collect::<Vec<_>>());
        for slot in (1..40).step_by(2) {
            s.apply(ShardOp::Remove {
                index: IndexId(0),
                seq: SeqHash(7),
                slot: WorkerSlot(slot),
                tiers: TierSet::ALL,
            });
        }
        assert!(s.index(IndexId(0)).unwrap().is_empty());
        assert!(
            s.index(IndexId(0))
                .unwrap()
                .tree_sizes()
                .iter()
                .all(|&c| c == 0)
        );
    }

    #[test]
    fn tiers_are_removed_independently() {
        let mut s = Shard::default();
        s.apply(store(1, 3, Tier::DEVICE));
        s.apply(store(1, 3, Tier::HOST));
        s.apply(ShardOp::Remove {
            index: IndexId(0),
            seq: SeqHash(1),
            slot: WorkerSlot(3),
            tiers: Tier::DEVICE.bit(),
        });
        let h = holders(&mut s, 1);
        assert_eq!(h.len(), 1);
        assert!(Holder(h[0]).has(Tier::HOST) && !Holder(h[0]).has(Tier::DEVICE));
    }

    #[test]
    fn slab_memory_is_returned_once_no_set_spills() {
        // 20k spilled sets of 5 words each: past the size at which an empty slab is freed.
        let n = 20_000;
        let mut s = Shard::default();
        for seq in 0..n {
            for slot in 1..=3 {
                s.apply(store(seq, slot, Tier::DEVICE));
            }
        }
        assert!(s.index(IndexId(0)).unwrap().slab.capacity_bytes() >= 4 << 16);
        s.apply(drop_op(2));
        s.finish();
        assert_eq!(s.index(IndexId(0)).unwrap().slab.capacity_bytes(), 0);
        for seq in 0..n {
            s.apply(store(seq, 4, Tier::DEVICE));
            s.apply(store(seq, 5, Tier::DEVICE));
        }
        for seq in 0..n {
            let slots: Vec<u32> = holders(&mut s, seq)
                .iter()
                .map(|h| Holder(*h).slot().0)
                .collect();
            assert_eq!(slots, vec![1, 3, 4, 5]);
        }
    }

    #[test]
    fn clear_slot_leaves_other_slots() {
        let mut s = Shard::default();
        for seq in 0..100 {
            s.apply(store(seq, 1, Tier::DEVICE));
            s.apply(store(seq, 2, Tier::DEVICE));
            s.apply(store(seq, 3, Tier::DEVICE));
        }
        s.apply(drop_op(2));
        for seq in 0..100 {
            let slots: Vec<u32> = holders(&mut s, seq)
                .iter()
                .map(|h| Holder(*h).slot().0)
                .collect();
            assert_eq!(slots, vec![1, 3]);
        }
        assert_eq!(s.index(IndexId(0)).unwrap().tree_sizes()[2], 0);
    }

    /// A shard that walks clears 8 buckets a step, holding blocks 0..500 by each of
    /// `holders` (slot, tier), so that a clear takes many steps.
    fn stepping(holders: &[(u32, Tier)]) -> Shard {
        let mut s = Shard::default();
        s.set_clear_step_buckets(8);
        for seq in 0..500 {
            for &(slot, tier) in holders {
                s.apply(store(seq, slot, tier));
            }
        }
        s
    }

    /// A dump taken partway through a drop already leaves the slot out, as one taken
    /// after it does.
    #[test]
    fn a_dump_during_a_drop_leaves_the_slot_out() {
        let mut s = stepping(&[(1, Tier::DEVICE), (2, Tier::HOST)]);
        s.apply(drop_op(1));
        let dump = |s: &Shard| {
            let mut out = Vec::new();
            for part in 0..4 {
                s.dump(IndexId(0), part, 2, &mut out);
            }
            out.sort_unstable_by_key(|b| b.seq.0);
            out
        };
        assert!(
            s.step_clears(),
            "500 blocks take more than one step of 8 buckets"
        );
        let partway = dump(&s);
        assert_eq!(partway.len(), 500);
        assert!(partway.iter().all(|b| b.holder.slot() == WorkerSlot(2)));
        s.finish();
        assert_eq!(dump(&s), partway);
    }

    /// A clear of some tiers is walked in steps, as a drop is, and answered as if done;
    /// a store to a cleared tier waits for the walk, and so does every later op of
    /// its slot, while other slots' ops and the slot's other tiers go on.
    #[test]
    fn a_partial_clear_is_walked_in_steps_and_a_store_to_its_tier_waits() {
        let mut s = stepping(&[(1, Tier::DEVICE), (1, Tier::HOST), (2, Tier::HOST)]);
        let h = |slot: u32, tiers: TierSet| Holder::new(WorkerSlot(slot), tiers).0;
        let both = Tier::DEVICE.bit() | Tier::HOST.bit();
        s.apply(ShardOp::ClearSlot {
            index: IndexId(0),
            slot: WorkerSlot(1),
            tiers: Tier::HOST.bit(),
        });
        assert!(s.step_clears(), "500 blocks take more than one step");
        let sorted = |mut v: Vec<u32>| {
            v.sort_unstable();
            v
        };
        for seq in [0, 250, 499] {
            assert_eq!(
                sorted(holders(&mut s, seq)),
                sorted(vec![h(1, Tier::DEVICE.bit()), h(2, Tier::HOST.bit())]),
                "block {seq} answers as if the clear were done"
            );
        }
        let mut dump = Vec::new();
        s.dump(IndexId(0), 0, 0, &mut dump);
        assert!(dump.iter().all(|b| b.holder.slot() != WorkerSlot(1)
            || b.holder.tiers() == Tier::DEVICE.bit()));

        // Slot 1's host store waits, and its later ops wait behind it; slot 1's disk
        // store before any wait, and slot 2's ops, apply at once.
        s.apply(store(7, 1, Tier::DISK));
        s.apply(store(0, 1, Tier::HOST));
        s.apply(ShardOp::Remove {
            index: IndexId(0),
            seq: SeqHash(1),
            slot: WorkerSlot(1),
            tiers: Tier::DEVICE.bit(),
        });
        s.apply(store(1, 2, Tier::DISK));
        assert!(s.waits(IndexId(0), WorkerSlot(1)));
        assert!(!s.waits(IndexId(0), WorkerSlot(2)));
        assert_eq!(s.waiting_ops(), 2);
        assert!(holders(&mut s, 7).contains(&h(1, Tier::DEVICE.bit() | Tier::DISK.bit())));
        assert!(holders(&mut s, 0).contains(&h(1, Tier::DEVICE.bit())));
        assert!(holders(&mut s, 1).contains(&h(1, Tier::DEVICE.bit())));
        assert!(holders(&mut s, 1).contains(&h(2, Tier::HOST.bit() | Tier::DISK.bit())));

        let applied = s.applied;
        while s.step_clears() {}
        assert_eq!(s.applied, applied + 2, "the two ops that waited apply");
        assert_eq!(s.waiting_ops(), 0);
        assert!(!s.waits(IndexId(0), WorkerSlot(1)));
        assert!(holders(&mut s, 0).contains(&h(1, both)));
        assert!(
            !holders(&mut s, 1)
                .iter()
                .any(|&x| Holder(x).slot() == WorkerSlot(1))
        );
        assert!(holders(&mut s, 250).contains(&h(1, Tier::DEVICE.bit())));
        assert_eq!(s.tier_counts().1, s.tier_counts_walked());
    }

    /// Clears of all tiers or some, walked in steps between other ops (some of which
    /// wait for them), leave every block, holder and counter as applying each op in
    /// turn does, and answer as it does partway too for every slot with no op waiting.
    #[test]
    fn staged_clears_equal_clears_one_by_one() {
        let mut rng = crate::testing::Xorshift::new(0x2545_F491_4F6C_DD1Du64);
        let mut next = |n: u64| rng.below(n);
        let tiers = [Tier::DEVICE, Tier::HOST, Tier::DISK];
        let ops: Vec<ShardOp> = (0..6_000)
            .map(|_| {
                let (slot, tier) = (next(8) as u32, tiers[next(3) as usize]);
                match next(20) {
                    0..=2 => ShardOp::ClearSlot {
                        index: IndexId(next(2) as u32),
                        slot: WorkerSlot(slot),
                        tiers: [tier.bit(), TierSet::ALL][next(2) as usize],
                    },
                    3..=5 => ShardOp::Remove {
                        index: IndexId(0),
                        seq: SeqHash(next(400)),
                        slot: WorkerSlot(slot),
                        tiers: tier.bit(),
                    },
                    _ => store(next(400), slot, tier),
                }
            })
            .collect();
        let (mut one, mut staged) = (Shard::default(), Shard::default());
        staged.set_clear_step_buckets(7);
        let mut at = 0;
        while at < ops.len() {
            let end = (at + 1 + next(12) as usize).min(ops.len());
            for op in &ops[at..end] {
                one.apply(*op);
                one.finish();
            }
            staged.apply_staged(&ops[at..end]);
            // Clears partway: answers must already be those of the finished clears.
            for _ in 0..next(3) {
                staged.step_clears();
            }
            if next(4) == 0 {
                // Slots with ops waiting for a clear lag behind; the others answer
                // as if every clear were done.
                let waits = |s: &Shard, slot: WorkerSlot| s.waits(IndexId(0), slot);
                for seq in 0..400 {
                    let mut a = holders(&mut one, seq);
                    let mut b = holders(&mut staged, seq);
                    for h in [&mut a, &mut b] {
                        h.retain(|&h| !waits(&staged, Holder(h).slot()));
                        h.sort_unstable();
                    }
                    assert_eq!(a, b, "block {seq} after op {end}");
                }
                for ix in [IndexId(0), IndexId(1)] {
                    // A slot cleared of some tiers counts its blocks until the walk.
                    let sizes = |s: &Shard| {
                        s.index(ix).map(|i| {
                            let mut t = i.tree_sizes();
                            for (slot, n) in t.iter_mut().enumerate() {
                                let slot = WorkerSlot(slot as u32);
                                if staged.waits(ix, slot) || staged.clears_some_tiers(ix, slot) {
                                    *n = u32::MAX;
                                }
                            }
                            t
                        })
                    };
                    assert_eq!(sizes(&one), sizes(&staged));
                }
                if next(2) == 0 {
                    staged.finish();
                    assert_eq!(one.tier_counts(), staged.tier_counts());
                }
            }
            at = end;
        }
        staged.finish();
        assert_eq!(one.tier_counts(), staged.tier_counts());
        assert_eq!(one.applied, staged.applied);
    }

    #[test]
    fn tier_counters_equal_a_walk_of_the_blocks() {
        let mut s = Shard::default();
        s.set_clear_step_buckets(5);
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15u64);
        let mut next = |n: u64| rng.below(n);
        let mut now: Tick = 0;
        for _ in 0..20_000 {
            let (seq, slot, tier) = (next(300), next(6) as u32, Tier(next(4) as u8));
            if next(50) == 0 {
                now += next(4) as Tick;
                s.expire(now);
            }
            let op = match next(12) {
                10 | 11 => ShardOp::Predict {
                    index: IndexId(0),
                    seq: SeqHash(seq),
                    parent: None,
                    local: BlockHash(seq),
                    slot: WorkerSlot(slot),
                    expires: now + next(6) as Tick,
                },
                0..=5 => store(seq, slot, tier),
                6..=8 => ShardOp::Remove {
                    index: IndexId(0),
                    seq: SeqHash(seq),
                    slot: WorkerSlot(slot),
                    tiers: [tier.bit(), TierSet::ALL][next(2) as usize],
                },
                _ => ShardOp::ClearSlot {
                    index: IndexId(0),
                    slot: WorkerSlot(slot),
                    tiers: [tier.bit(), TierSet::ALL][next(2) as usize],
                },
            };
            s.apply(op);
            // Counters hold for the blocks as they are, partway through a clear too.
            if next(3) == 0 {
                s.step_clears();
            }
            assert_eq!(s.tier_counts().1, s.tier_counts_walked());
            let ix = s.index(IndexId(0)).unwrap();
            let mut per_slot = vec![0u32; ix.per_slot.len()];
            for node in ix.blocks.values() {
                for &h in node.holders.as_slice(&ix.slab) {
                    per_slot[Holder(h).slot().0 as usize] += 1;
                }
            }
            assert_eq!(per_slot, ix.per_slot);
        }
        let p = s.predictions;
        assert!(p.created > 0 && p.confirmed > 0 && p.expired > 0 && p.refreshed > 0);
    }

    #[test]
    fn a_prediction_scores_as_device_until_confirmed_or_expired_and_is_never_dumped() {
        let mut s = Shard::default();
        let predict = |seq: u64, slot: u32, expires: Tick| ShardOp::Predict {
            index: IndexId(0),
            seq: SeqHash(seq),
            parent: None,
            local: BlockHash(seq),
            slot: WorkerSlot(slot),
            expires,
        };
        s.apply(predict(1, 3, 10));
        s.apply(predict(2, 3, 10));
        s.apply(store(2, 4, Tier::HOST));
        let dev = |slot| Holder::new(WorkerSlot(slot), Tier::DEVICE.bit()).0;
        assert_eq!(holders(&mut s, 1), vec![dev(3)]);
        let mut out = Vec::new();
        s.dump(IndexId(0), 0, 0, &mut out);
        assert_eq!(out.len(), 1, "only the stored block: {out:?}");
        // Slot 3 stores block 2 on the host: confirmed, held on the host only.
        s.apply(store(2, 3, Tier::HOST));
        assert_eq!(s.predictions.confirmed, 1);
        assert_eq!(
            holders(&mut s, 2),
            vec![
                Holder::new(WorkerSlot(3), Tier::HOST.bit()).0,
                Holder::new(WorkerSlot(4), Tier::HOST.bit()).0
            ]
        );
        // An engine's removal of everything leaves a prediction alone.
        s.apply(predict(5, 3, 10));
        s.apply(ShardOp::Remove {
            index: IndexId(0),
            seq: SeqHash(5),
            slot: WorkerSlot(3),
            tiers: TierSet::ALL,
        });
        assert_eq!(holders(&mut s, 5), vec![dev(3)]);
        s.expire(9);
        assert_eq!(s.predictions.expired, 0);
        s.expire(10);
        assert_eq!(s.predictions.expired, 2);
        assert_eq!(s.index(IndexId(0)).unwrap().len(), 1);
        assert_eq!(s.tier_counts().1[Tier::PREDICTED.0 as usize], 0);
    }

    #[test]
    fn an_approximate_index_is_pruned_soonest_due_first() {
        let mut s = Shard::default();
        s.set_prune_bound(
            IndexId(0),
            Some(PruneBound {
                max: 100,
                target: 50,
            }),
        );
        for seq in 0..500u64 {
            s.apply(ShardOp::Predict {
                index: IndexId(0),
                seq: SeqHash(seq),
                parent: None,
                local: BlockHash(seq),
                slot: WorkerSlot(1),
                expires: 1000 + seq as Tick,
            });
            assert!(s.index(IndexId(0)).unwrap().len() <= 100);
        }
        assert!(s.predictions.pruned >= 400);
        // The newest survive.
        assert_eq!(holders(&mut s, 499).len(), 1);
        assert_eq!(
            s.tier_counts().1[Tier::PREDICTED.0 as usize],
            s.index(IndexId(0)).unwrap().len() as u64
        );
    }

    #[test]
    fn a_bounded_shard_evicts_unused_blocks_and_keeps_its_counters() {
        let mut s = Shard::default();
        s.set_block_budget(Some(300));
        let op = |index: u32, seq: u64, slot: u32, tier: Tier| ShardOp::Store {
            index: IndexId(index),
            seq: SeqHash(xxhash_rust::xxh3::xxh3_64(&seq.to_le_bytes())),
            parent: None,
            local: BlockHash(seq),
            slot: WorkerSlot(slot),
            tier,
        };
        let key = |seq: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&seq.to_le_bytes()));
        // Index 1 holds 50 blocks a router keeps matching; index 0 gets a stream.
        for seq in 0..50 {
            s.apply(op(1, seq, 2, Tier::DEVICE));
        }
        for seq in 1000..3000u64 {
            s.apply(op(0, seq, (seq % 4) as u32, Tier::DEVICE));
            s.apply(op(0, seq, 9, Tier::HOST));
            if seq % 3 == 0 {
                s.apply(ShardOp::Predict {
                    index: IndexId(0),
                    seq: key(seq),
                    parent: None,
                    local: BlockHash(seq),
                    slot: WorkerSlot(5),
                    expires: 100,
                });
            }
            let mut out = Vec::new();
            s.lookup(IndexId(1), &(0..50).map(key).collect::<Vec<_>>(), &mut out);
            assert_eq!(out.len(), 100, "a matched block was evicted");
            let (blocks, _) = s.tier_counts();
            assert!(blocks <= 300, "{blocks} blocks");
        }
        assert_eq!(s.evicted, 2050 - 300);
        assert_eq!(s.tier_counts().1, s.tier_counts_walked());
        // Per-slot counts match the blocks left.
        let ix = s.index(IndexId(0)).unwrap();
        let per_slot: u32 = ix.tree_sizes().iter().sum();
        let walked: usize = ix
            .blocks
            .values()
            .map(|n| n.holders.as_slice(&ix.slab).len())
            .sum();
        assert_eq!(per_slot as usize, walked);
        // The newest blocks are there; an evicted one's removal and expiry are no-ops.
        assert!(
            s.index(IndexId(0))
                .unwrap()
                .blocks
                .get(&key(2999))
                .is_some()
        );
        let gone =
            (1000..3000).find(|&q| s.index(IndexId(0)).unwrap().blocks.get(&key(q)).is_none());
        s.apply(ShardOp::Remove {
            index: IndexId(0),
            seq: key(gone.unwrap()),
            slot: WorkerSlot(9),
            tiers: TierSet::ALL,
        });
        s.expire(100);
        assert_eq!(s.tier_counts().1, s.tier_counts_walked());
        assert_eq!(s.tier_counts().1[Tier::PREDICTED.0 as usize], 0);
        // Lifting the bound stops evictions.
        s.set_block_budget(None);
        s.apply(op(0, 7, 1, Tier::DEVICE));
        assert_eq!(s.evicted, 2050 - 300);
    }

    /// A prediction's own cost (its holder bit, deadline and wheel entry) stays
    /// under what a confirmed block costs: its shard entry, and at the ingest side an
    /// engine-hash entry (counted here at its payload alone, the least it can cost).
    #[test]
    fn a_prediction_costs_less_than_a_stored_block() {
        let n = 200_000u64;
        let key = |q: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&q.to_le_bytes()));
        let mut s = Shard::default();
        for q in 0..n {
            s.apply(store(key(q).0, 0, Tier::DEVICE));
        }
        let stored = s.heap_bytes();
        for q in 0..n {
            s.apply(ShardOp::Predict {
                index: IndexId(0),
                seq: key(q),
                parent: None,
                local: BlockHash(q),
                slot: WorkerSlot(1),
                expires: 100 + (q % 125) as u32,
            });
        }
        let predicted = s.heap_bytes() - stored;
        let engine_entry = std::mem::size_of::<(crate::types::EngineHash, SeqHash)>();
        let stored = stored + engine_entry * n as usize;
        assert!(
            predicted < stored,
            "{predicted} B of predictions, {stored} B of blocks"
        );
    }
}
