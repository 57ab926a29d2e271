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
//! The rooms: [`op`] the ops; [`reply`] a lookup's prompt and the reply encoding
//! the gather reads; [`clear`] clears walked in steps; [`budget`] the block budget
//! the shards share; [`export`] the read-out in steps; [`tree`] and [`keyed`] the
//! two stores of an index shard, [`holders`] their holder sets, [`predict`] the
//! predictions' deadlines, [`table`] the segmented hash table. Here: the shard and
//! its index shards, and how ops, predictions and lookups reach them.

mod answer;
mod budget;
mod clear;
mod export;
pub mod holders;
pub mod hybrid;
pub mod keyed;
mod op;
pub mod predict;
mod reply;
pub mod table;
pub mod tree;

pub use answer::{PromptBlocks, ShardReply, answer};
pub use budget::BlockBudget;
pub use export::{DumpedBlock, ExportAt, NO_NODE, ShardExport};
pub use op::{SeedParent, ShardOp};
pub use reply::{HolderLists, Prompt, SAME_HOLDERS, union_holders};
pub use table::SeqHasherBuilder;
pub use tree::ChainAt;

use crate::hash;
use crate::types::{BlockHash, EngineHash, IndexId, SeqHash, Tier, TierSet, WorkerSlot};
use clear::Clearing;
use hashbrown::HashMap;
use holders::Holder;
use keyed::KeyedBlocks;
use predict::Tick;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tree::{Seed, Stored, Tree};

/// Predictions an expiry looks at per call at most: a mass expiry is spread over
/// drain passes, the executor serving between them.
const EXPIRE_STEP: usize = 1 << 14;

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
    /// Requests refused by `--max-predictions`.
    pub refused: u64,
}

/// `--max-predictions` by default: about 100 MB of predictions an index at most
/// (a prediction of a block nothing else holds costs its node, its holder, its
/// deadline and its place on the wheel).
pub const DEFAULT_MAX_PREDICTIONS: usize = 1 << 20;

/// Blocks a prediction step applies at most: a long prompt is predicted in steps
/// between which the executor serves.
pub const PREDICT_STEP: usize = 4096;

/// One step of a prediction, as the shard owning its slot applies it
/// ([`Shard::predict_step`]): at most [`PREDICT_STEP`] blocks of a prompt, from
/// where its previous step ended.
#[derive(Clone, Debug)]
pub struct PredictStep {
    pub slot: WorkerSlot,
    pub locals: Vec<BlockHash>,
    pub expires: Tick,
    /// Where the prompt's previous step ended (the default: its first step).
    pub at: ChainAt,
    /// On a prompt's first step its length in blocks, which the caps are checked
    /// against; 0 on the steps after.
    pub total: usize,
    /// The index's live predictions over every shard.
    pub live: Arc<AtomicUsize>,
}

/// Why a shard refused a prediction; nothing of it was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PredictRefused {
    #[error("a prediction of {blocks} blocks is longer than --max-predictions ({max})")]
    TooLong { blocks: usize, max: usize },
    #[error(
        "the index holds {live} live predictions; {blocks} more would pass --max-predictions ({max})"
    )]
    Full {
        live: usize,
        blocks: usize,
        max: usize,
    },
}

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

    /// Tell the index's shared count how many live predictions this shard holds.
    fn tell_predictions(&mut self) {
        let Some(live) = &self.live_predictions else {
            return;
        };
        let now = self.tree.predicted_pairs();
        if now > self.told {
            live.fetch_add(now - self.told, Ordering::Relaxed);
        } else if now < self.told {
            live.fetch_sub(self.told - now, Ordering::Relaxed);
        }
        self.told = now;
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

    /// [`Self::apply`] each op in order. Every clear is done on return, and the
    /// shard is within its block budget.
    pub fn apply_all(&mut self, ops: &[ShardOp]) {
        self.apply_staged(ops);
        self.finish();
        while self.step_budget() {}
    }

    /// [`Self::apply_all`], except that clears are walked later, in steps
    /// ([`Self::step_clears`]); the shard answers meanwhile as if they were done.
    /// Clears that come before their walk begins share it. Nor does it evict:
    /// what it stores past the block budget goes by [`Self::step_budget`]. A run
    /// of stores (one slot and tier, each block the child of the one before) is
    /// filed in one go: its parents are the blocks just filed, not looked up
    /// again.
    pub fn apply_staged(&mut self, ops: &[ShardOp]) {
        let mut i = 0;
        while i < ops.len() {
            let op = ops[i];
            i += 1;
            if let ShardOp::GroupHold {
                index,
                slot,
                group,
                block,
                held,
            } = op
            {
                if !self.clearing.is_empty() && self.must_wait(&op) {
                    self.defer(op);
                    continue;
                }
                // One group event's blocks arrive together, as a store's run does.
                let mut run = std::mem::take(&mut self.group_run);
                run.clear();
                run.push(block);
                while let Some(&ShardOp::GroupHold {
                    index: ix,
                    slot: s,
                    group: g,
                    block: b,
                    held: h,
                }) = ops.get(i)
                    && (ix, s, g, h) == (index, slot, group, held)
                {
                    run.push(b);
                    i += 1;
                }
                self.hold_in_group(index, slot, group, &run, held);
                self.group_run = run;
                continue;
            }
            let ShardOp::Store {
                index,
                slot,
                tier,
                parent,
                block,
                local,
                by_seq,
                ..
            } = op
            else {
                self.apply_op(op);
                continue;
            };
            if !self.clearing.is_empty() && self.must_wait(&op) {
                self.defer(op);
                continue;
            }
            // A run's ops share the slot and tier, so they wait, or not, together
            // (a clear between them is an op that ends the run).
            let mut run = std::mem::take(&mut self.run);
            run.clear();
            run.push((block, local));
            while let Some(&ShardOp::Store {
                index: ix,
                slot: s,
                tier: t,
                parent: Some(p),
                block: b,
                local: l,
                by_seq: q,
                event_start: false,
            }) = ops.get(i)
                && (ix, s, t, p, q) == (index, slot, tier, run[run.len() - 1].0, by_seq)
            {
                run.push((b, l));
                i += 1;
            }
            self.store(index, slot, tier, parent, &run, by_seq);
            self.run = run;
        }
    }

    /// `slot`'s group `group` holds, or no longer holds, `blocks` (see
    /// [`ShardOp::GroupHold`]).
    fn hold_in_group(
        &mut self,
        index: IndexId,
        slot: WorkerSlot,
        group: u8,
        blocks: &[EngineHash],
        held: bool,
    ) {
        self.applied += blocks.len() as u64;
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        self.group_unheld += ix.tree.hold_run_in_group(slot, blocks, group, held) as u64;
    }

    /// Files a run of stores (see [`ShardOp::Store`]).
    fn store(
        &mut self,
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        parent: Option<EngineHash>,
        run: &[(EngineHash, BlockHash)],
        by_seq: bool,
    ) {
        self.applied += run.len() as u64;
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        match ix.tree.store(slot, tier, parent, run) {
            Stored::Filed {
                confirmed,
                unfiled,
                duplicate,
                ..
            } => {
                self.predictions.confirmed += confirmed as u64;
                self.duplicate_stores += u64::from(duplicate);
                if unfiled > 0 {
                    tracing::warn!(unfiled, "an index shard's tree is full; blocks not filed");
                }
            }
            Stored::UnknownParent if by_seq => {
                self.applied -= run.len() as u64;
                let mut parent = parent.map(|p| SeqHash(p.0));
                for &(_, local) in run {
                    let seq = hash::chain(parent, local);
                    self.apply_op(ShardOp::StoreKeyed {
                        index,
                        slot,
                        tier,
                        seq,
                        parent,
                    });
                    parent = Some(seq);
                }
            }
            Stored::UnknownParent => self.unknown_parent += 1,
        }
    }

    /// Applies one op (as [`Self::apply_staged`] does), then keeps the block budget.
    pub fn apply(&mut self, op: ShardOp) {
        self.apply_op(op);
        while self.step_budget() {}
    }

    fn apply_op(&mut self, op: ShardOp) {
        // Every index with a clear under way is in `self.clearing`, which is
        // usually empty: checked first, it spares each op a look into its index.
        if !self.clearing.is_empty() && self.must_wait(&op) {
            return self.defer(op);
        }
        let bounded = self.budget.is_some();
        match op {
            ShardOp::Store {
                index,
                slot,
                tier,
                parent,
                block,
                local,
                by_seq,
                ..
            } => self.store(index, slot, tier, parent, &[(block, local)], by_seq),
            ShardOp::StoreKeyed {
                index,
                slot,
                tier,
                seq,
                parent,
            } => {
                self.applied += 1;
                let ix = index_mut(&mut self.indexes, index, bounded);
                ix.keyed.store(slot, tier, seq, parent);
            }
            ShardOp::Seed {
                index,
                slot,
                tier,
                block,
                local,
                parent,
            } => {
                self.applied += 1;
                let ix = index_mut(&mut self.indexes, index, bounded);
                let seed = Seed {
                    slot,
                    tier,
                    engine: block,
                    local,
                    parent_engine: parent.engine(),
                    parent_seq: parent.seq(),
                };
                if !ix.tree.seed(&seed, &mut ix.seeding) {
                    self.unknown_parent += 1;
                }
            }
            ShardOp::SeedDone { index } => {
                if let Some(ix) = self.indexes.get_mut(index.0 as usize) {
                    ix.seeding = HashMap::new();
                }
            }
            ShardOp::Remove {
                index,
                slot,
                block,
                tiers,
            } => {
                self.applied += 1;
                let ix = index_mut(&mut self.indexes, index, bounded);
                if ix.tree.remove(slot, block, tiers) {
                    ix.shrink_if_empty();
                    return;
                }
                if !ix.keyed.remove(slot, SeqHash(block.0), tiers) {
                    self.unknown_removed += 1;
                }
            }
            ShardOp::ClearSlot { index, slot, tiers } => {
                self.applied += 1;
                self.clear_slot(index, slot, tiers)
            }
            ShardOp::GroupSpec {
                index,
                slot,
                group,
                spec,
                align,
                base,
            } => {
                let ix = index_mut(&mut self.indexes, index, bounded);
                let align = (align > 0).then_some(align);
                ix.tree.set_group_spec(slot, group, spec, align, base);
            }
            ShardOp::GroupHold {
                index,
                slot,
                group,
                block,
                held,
            } => self.hold_in_group(index, slot, group, &[block], held),
        }
    }

    /// Per slot of `index` in this shard with KV-cache groups besides full
    /// attention, the blocks of the prompt the last [`Self::lookup`] of `index`
    /// walked that it would reuse under their rules.
    pub fn effective(&mut self, index: IndexId, out: &mut Vec<(WorkerSlot, u32)>) {
        if let Some(ix) = self.indexes.get_mut(index.0 as usize) {
            ix.tree.effective(out);
        }
    }

    /// A router expects `slot` to hold the prompt's blocks `locals` soon: they count
    /// as held on the device until `expires`, or until a store of the block by the
    /// slot confirms it (the whole prompt in one step, no caps: see
    /// [`Self::predict_step`]).
    pub fn predict(
        &mut self,
        index: IndexId,
        slot: WorkerSlot,
        locals: &[BlockHash],
        expires: Tick,
    ) {
        self.predict_in(index, slot, locals, expires, &mut ChainAt::default());
    }

    /// One step of a prediction (see [`PredictStep`]): its blocks from where the
    /// prompt's previous step ended, returning where this one did. A prompt's
    /// first step is refused whole, and counted, if it is longer than the most
    /// live predictions an index may hold, or if an index fed by events would
    /// hold more than that with it (an approximate index is pruned instead).
    pub fn predict_step(
        &mut self,
        index: IndexId,
        step: &PredictStep,
    ) -> Result<ChainAt, PredictRefused> {
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        if ix.live_predictions.is_none() {
            ix.live_predictions = Some(step.live.clone());
        }
        if let Some(max) = self.max_predictions
            && step.total > 0
        {
            let blocks = step.total;
            // This index over every shard, with what this shard did since it last said.
            let live = (step.live.load(Ordering::Relaxed) + ix.tree.predicted_pairs())
                .saturating_sub(ix.told);
            let refused = if blocks > max {
                Some(PredictRefused::TooLong { blocks, max })
            } else if ix.prune.is_none() && live + blocks > max {
                Some(PredictRefused::Full { live, blocks, max })
            } else {
                None
            };
            if let Some(r) = refused {
                self.predictions.refused += 1;
                return Err(r);
            }
        }
        let mut at = step.at;
        self.predict_in(index, step.slot, &step.locals, step.expires, &mut at);
        self.indexes[index.0 as usize].tell_predictions();
        Ok(at)
    }

    /// Predicts `locals` from `at` on: a clear of the slot's predictions under
    /// way is finished first, so the prediction is not taken by it; an
    /// approximate index is pruned to its bound after.
    fn predict_in(
        &mut self,
        index: IndexId,
        slot: WorkerSlot,
        locals: &[BlockHash],
        expires: Tick,
        at: &mut ChainAt,
    ) {
        if expires <= self.expired_to {
            return;
        }
        let ix = index_mut(&mut self.indexes, index, self.budget.is_some());
        if ix
            .clearing
            .as_ref()
            .is_some_and(|d| d.waits(slot) || d.clears(slot).contains(Tier::PREDICTED))
        {
            self.finish_clears(index);
        }
        let ix = &mut self.indexes[index.0 as usize];
        let counts = ix.tree.predict(slot, locals, expires, at);
        self.predictions.created += counts.created as u64;
        self.predictions.refreshed += counts.refreshed as u64;
        if let Some(b) = ix.prune
            && ix.len() > b.max
        {
            // A block may have several predicted holders, so one pass can fall short.
            let mut passes = 0;
            while ix.len() > b.target && ix.tree.has_predictions() && passes < 4 {
                let ended = ix.tree.prune(ix.len() - b.target);
                self.predictions.pruned += ended as u64;
                passes += 1;
            }
        }
        // As much as a step files goes at once: a chain predicted past the budget
        // loses its end before the next step would go on below it.
        self.keep_budget(PREDICT_STEP);
    }

    /// The most live predictions an index may hold over every shard, and the
    /// longest prediction (`--max-predictions`); `None`: no bound.
    pub fn set_max_predictions(&mut self, max: Option<usize>) {
        self.max_predictions = max;
    }

    /// Bound an index fed by predictions alone (approximate mode); applies from its
    /// next prediction on.
    pub fn set_prune_bound(&mut self, index: IndexId, bound: Option<PruneBound>) {
        index_mut(&mut self.indexes, index, self.budget.is_some()).prune = bound;
    }

    /// Does some prediction wait for [`Self::expire`] to end it?
    pub fn has_predictions(&self) -> bool {
        self.indexes.iter().any(|ix| ix.tree.has_predictions())
    }

    /// The tick by which [`Self::expire`] next has work (predictions to end, or
    /// to move down the wheel), if any prediction waits: an idle executor
    /// sleeps until then.
    pub fn next_prediction_due(&self) -> Option<Tick> {
        self.indexes
            .iter()
            .filter_map(|ix| ix.tree.next_prediction_due())
            .min()
    }

    /// End the predictions due at `now`, in the indexes that hold predictions,
    /// looking at no more than [`EXPIRE_STEP`] of them, and tell each index's
    /// shared count what its predictions here came to (they also end by
    /// confirmation, clears and eviction). Returns whether some due are left for
    /// the next call.
    pub fn expire(&mut self, now: Tick) -> bool {
        self.expired_to = self.expired_to.max(now);
        let mut budget = EXPIRE_STEP;
        let mut left = false;
        for ix in &mut self.indexes {
            if ix.tree.has_predictions() && !left {
                let (ended, more) = ix.tree.expire(now, budget);
                self.predictions.expired += ended as u64;
                ix.shrink_if_empty();
                left = more;
                budget -= ended.min(budget - 1);
            }
            ix.tell_predictions();
        }
        left
    }

    /// Holders of the prompt's blocks (in prefix order) among this shard's slots as
    /// `[n, holder..]` per block, or [`SAME_HOLDERS`] for a block held exactly as
    /// the block before it, up to and including the first block none of them
    /// holds: no worker's prefix reaches past it, so the blocks after it are not
    /// looked up. A match counts as a use of the block for a bounded shard's
    /// eviction; a predicted holder reads as the device tier it stands for.
    pub fn lookup(&mut self, index: IndexId, prompt: Prompt<'_>, out: &mut Vec<u32>) {
        let Some(ix) = self.indexes.get_mut(index.0 as usize) else {
            out.extend((!prompt.is_empty()).then_some(0));
            return;
        };
        let at = out.len();
        ix.tree.lookup(prompt, out);
        if ix.keyed.is_empty() && ix.clearing.is_none() {
            return;
        }
        let mut tree_out = std::mem::take(&mut self.merge);
        tree_out.clear();
        tree_out.extend_from_slice(&out[at..]);
        out.truncate(at);
        let seqs = match prompt {
            Prompt::Seqs(s) => s,
            Prompt::Locals(l) if !ix.keyed.is_empty() => {
                hash::seq_hashes_for_locals(l, &mut self.seqs);
                &self.seqs[..]
            }
            Prompt::Locals(_) => &[],
        };
        let clearing = ix.clearing.as_deref();
        let keep = |h: u32| match clearing {
            None => Some(h),
            // Answer as if the clears were done: without the cleared tiers.
            Some(d) => d.after(Holder(h)).map(|h| h.0),
        };
        // Per block, the tree's holders (until its answer ends) and the keyed
        // table's (a keyed block may follow one the tree holds).
        let mut tree_lists = HolderLists::new(&tree_out);
        for i in 0..prompt.len() {
            let head = out.len();
            out.push(0);
            if let Some((hs, _)) = tree_lists.next() {
                out.extend(hs.iter().filter_map(|&h| keep(h)));
            }
            if let Some(hs) = seqs.get(i).and_then(|s| ix.keyed.matched(s)) {
                out.extend(hs.iter().filter_map(|&h| keep(h)));
            }
            let n = out.len() - head - 1;
            out[head] = n as u32;
            if n == 0 {
                break;
            }
        }
        self.merge = tree_out;
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
