//! One executor's shard of the block index.
//!
//! Owns, for every (model, tenant) index, what the worker slots the partition
//! function gives this shard hold ([`crate::partition::shard_of`]): a radix tree of
//! their blocks with each slot's engine-hash map ([`tree::Tree`]), and beside it a
//! table keyed by sequence hash ([`keyed::KeyedBlocks`]) for blocks published by
//! rolling hash alone, without tokens (they name no parent a tree could hang them
//! from). Changes arrive as [`ShardOp`]s through [`Shard::apply`] (live events,
//! replay, dumps and snapshots alike) and as predictions through
//! [`Shard::predict`]; predictions end through [`Shard::expire`]. A clear of a
//! worker's slot (all its tiers or some) is walked in steps between which the
//! executor serves ([`Shard::step_clears`]), answering as if the clear were done.
//! With a block budget (`--max-blocks`) a store past it evicts the block least
//! recently stored or matched. A shard never touches another shard's memory and
//! never blocks.

pub mod holders;
pub mod keyed;
pub mod predict;
pub mod table;
pub mod tree;

use crate::hash;
use crate::types::{BlockHash, EngineHash, IndexId, SeqHash, Tier, TierSet, WorkerSlot};
use hashbrown::HashMap;
use holders::Holder;
use keyed::{EVICT_TURNS, KeyedBlocks};
use predict::Tick;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
pub use table::SeqHasherBuilder;
use table::Cursor;
use tree::{DumpWalk, Seed, Stored, Tree};

/// In a lookup's output, a block held exactly as the block before it; never a
/// holder count, since a block has fewer holders than there are worker slots.
pub const SAME_HOLDERS: u32 = u32::MAX;

/// A lookup's output read block by block: each block's holders (a
/// [`SAME_HOLDERS`] block's are the block before's) and whether they repeat the
/// block before's. Ends with the output (a lookup's ends at its first empty block).
pub struct HolderLists<'a> {
    list: &'a [u32],
    at: usize,
    last: std::ops::Range<usize>,
}

impl<'a> HolderLists<'a> {
    pub fn new(list: &'a [u32]) -> Self {
        HolderLists {
            list,
            at: 0,
            last: 0..0,
        }
    }
}

impl<'a> Iterator for HolderLists<'a> {
    type Item = (&'a [u32], bool);

    fn next(&mut self) -> Option<Self::Item> {
        let n = *self.list.get(self.at)?;
        if n == SAME_HOLDERS {
            self.at += 1;
            return Some((self.list.get(self.last.clone())?, true));
        }
        let r = self.at + 1..self.at + 1 + n as usize;
        let hs = self.list.get(r.clone())?;
        self.at = r.end;
        self.last = r;
        Some((hs, false))
    }
}

/// The one way to change a shard's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardOp {
    /// `slot` holds the block it names `block` (local hash `local`) on `tier`, a
    /// child of the block it names `parent` (`None`: a first block). Consecutive
    /// stores of one slot and tier, each the child of the one before, are filed as
    /// one run. With `by_seq` the publisher names blocks by standardized sequence
    /// hashes: a parent the slot does not name (another of its streams named it
    /// otherwise) is taken as the sequence hash it is, and the run is filed in the
    /// keyed table under the sequence hashes its tokens chain to.
    Store {
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        parent: Option<EngineHash>,
        block: EngineHash,
        local: BlockHash,
        by_seq: bool,
    },
    /// `slot` holds the block with rolling sequence hash `seq` on `tier` (a
    /// publisher of standardized hashes that sends no tokens).
    StoreKeyed {
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        seq: SeqHash,
        parent: Option<SeqHash>,
    },
    /// A block of a dump or snapshot, parents first (see [`tree::Tree::seed`]).
    Seed {
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        block: EngineHash,
        local: BlockHash,
        parent: SeedParent,
    },
    /// An import's blocks are all applied: the sequence hashes it filed are forgotten.
    SeedDone { index: IndexId },
    /// `slot` no longer holds the block it names `block` on the tiers in `tiers`
    /// (a block stored by rolling hash alone is named by that hash).
    Remove {
        index: IndexId,
        slot: WorkerSlot,
        block: EngineHash,
        tiers: TierSet,
    },
    /// `slot` holds nothing any more on the tiers in `tiers` (AllBlocksCleared, unregister).
    ClearSlot {
        index: IndexId,
        slot: WorkerSlot,
        tiers: TierSet,
    },
}

// A ring chunk holds CHUNK ops; a larger op would cost every op more cache lines.
const _: () = assert!(std::mem::size_of::<ShardOp>() <= 48);

/// How a seeded block names its parent: by the slot's engine hash, by sequence
/// hash (among the blocks the import filed), both, or neither (a first block).
/// Two bare words and flags, packed to 4-byte alignment so that a seed is no
/// larger than a store on the rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, packed(4))]
pub struct SeedParent {
    engine: u64,
    seq: u64,
    known: u8,
}

impl SeedParent {
    const ENGINE: u8 = 1;
    const SEQ: u8 = 2;

    pub fn new(engine: Option<EngineHash>, seq: Option<SeqHash>) -> Self {
        SeedParent {
            engine: engine.map_or(0, |e| e.0),
            seq: seq.map_or(0, |s| s.0),
            known: engine.map_or(0, |_| Self::ENGINE) | seq.map_or(0, |_| Self::SEQ),
        }
    }

    pub fn engine(&self) -> Option<EngineHash> {
        (self.known & Self::ENGINE != 0).then_some(EngineHash(self.engine))
    }

    pub fn seq(&self) -> Option<SeqHash> {
        (self.known & Self::SEQ != 0).then_some(SeqHash(self.seq))
    }
}

impl ShardOp {
    /// The index an op changes.
    pub fn index(&self) -> IndexId {
        match *self {
            ShardOp::Store { index, .. }
            | ShardOp::StoreKeyed { index, .. }
            | ShardOp::Seed { index, .. }
            | ShardOp::SeedDone { index }
            | ShardOp::Remove { index, .. }
            | ShardOp::ClearSlot { index, .. } => index,
        }
    }

    /// The worker slot an op changes (its shard's key); `None` for the end of an
    /// import, which goes to every shard.
    pub fn slot(&self) -> Option<WorkerSlot> {
        match *self {
            ShardOp::Store { slot, .. }
            | ShardOp::StoreKeyed { slot, .. }
            | ShardOp::Seed { slot, .. }
            | ShardOp::Remove { slot, .. }
            | ShardOp::ClearSlot { slot, .. } => Some(slot),
            ShardOp::SeedDone { .. } => None,
        }
    }
}

/// A query's blocks as a lookup takes them: local hashes (a prompt's tokens, or
/// Dynamo's `/query_by_hash`), or sequence hashes (Mooncake's rolling hashes).
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    Locals(&'a [BlockHash]),
    Seqs(&'a [SeqHash]),
}

impl Prompt<'_> {
    pub fn len(&self) -> usize {
        match self {
            Prompt::Locals(l) => l.len(),
            Prompt::Seqs(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Merges lists of `[n, holder..]` per block (each ending at its first block
/// nobody holds, or with the prompt; [`SAME_HOLDERS`] for a repeated list) into
/// one, keeping what `keep` returns for each holder: a block's holders are the
/// union of its lists'. Ends, as every list does, at the first block left with no
/// holder: no worker's prefix reaches past it. A block every list repeats is
/// written as [`SAME_HOLDERS`].
pub fn union_holders(
    parts: &[&[u32]],
    mut keep: impl FnMut(u32) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    let mut lists: Vec<HolderLists> = parts.iter().map(|p| HolderLists::new(p)).collect();
    loop {
        let head = out.len();
        out.push(0);
        let (mut listed, mut all_same) = (false, true);
        for (hs, same) in lists.iter_mut().filter_map(Iterator::next) {
            listed = true;
            all_same &= same;
            out.extend(hs.iter().filter_map(|&h| keep(h)));
        }
        if !listed {
            out.pop();
            return;
        }
        let n = out.len() - head - 1;
        if all_same && n > 0 {
            out.truncate(head);
            out.push(SAME_HOLDERS);
            continue;
        }
        out[head] = n as u32;
        if n == 0 {
            return;
        }
    }
}

/// An export of a keyed table splits it into at most `1 << EXPORT_BITS_MAX`
/// parts, one step each.
const EXPORT_BITS_MAX: u32 = 12;

/// Blocks of a tree an export step reads: a fraction of a millisecond.
const EXPORT_STEP_BLOCKS: usize = 1 << 14;

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
/// if it were: lookups and dumps leave the cleared tiers of these slots out, and
/// `tree_sizes` counts a slot cleared of every tier as holding nothing. A store
/// or seed on a tier being cleared waits (in `deferred`) until the walks that
/// clear it are done, so it never lands on a block a walk has yet to pass, and so
/// does every later op of its slot, to keep the slot's order. Other ops commute
/// with the clears and apply at once: removals and further clears take bits off
/// either way, and stores to other tiers or slots are bits the walks do not take.
#[derive(Default)]
struct Clearing {
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
            ShardOp::Remove { .. } | ShardOp::ClearSlot { .. } | ShardOp::SeedDone { .. } => false,
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
    fn after(&self, holder: Holder) -> Option<Holder> {
        let slot = holder.slot();
        let tiers = holder.tiers().without(self.clears(slot));
        (!tiers.is_empty()).then(|| Holder::new(slot, tiers))
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
    /// The block's node in its shard's tree (its slot's engine hashes name it:
    /// [`Shard::engine_names`]); [`NO_NODE`] for a block of the keyed table.
    pub node: u32,
}

/// A [`DumpedBlock`]'s node when it is not in a tree.
pub const NO_NODE: u32 = u32::MAX;

/// Where an export of one index shard ([`Shard::export_step`]) has got to; the
/// default starts one. The keyed table goes first, a hash part a step, then the
/// tree, depth first, then each slot's engine map, a part a step.
#[derive(Clone, Debug, Default)]
pub struct ExportAt {
    keyed_part: usize,
    keyed_bits: Option<u32>,
    keyed_done: bool,
    tree: DumpWalk,
    tree_done: bool,
    names_slot: usize,
    names_part: usize,
    names_bits: Option<u32>,
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
    seeding: HashMap<SeqHash, u32>,
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

    /// Whether `op` must wait for the clears under way (see [`Clearing`]).
    #[inline]
    fn must_wait(&self, op: &ShardOp) -> bool {
        self.clearing.as_ref().is_some_and(|d| d.must_wait(op))
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
    /// The bound on every shard's blocks together; `None`: unbounded.
    budget: Option<BlockBudget>,
    /// Blocks this shard has added to the budget's count.
    counted: usize,
    /// Blocks evicted to stay within the budget, since start.
    pub evicted: u64,
    /// The eviction turn (index × its tree, then its keyed table) next.
    evict_from: usize,
    /// Indexes with slots being cleared, oldest first (see [`Clearing`]).
    clearing: Vec<IndexId>,
    /// The latest tick [`Self::expire`] was given: predictions due by then ended.
    expired_to: Tick,
    /// Buckets a clear walks per step; 0 means [`CLEAR_STEP_BUCKETS`].
    clear_step_buckets: usize,
    /// A run of stores being filed (scratch).
    run: Vec<(EngineHash, BlockHash)>,
    /// Lookup scratch.
    merge: Vec<u32>,
    seqs: Vec<SeqHash>,
}

/// Eviction turns per index: its tree, then its keyed table.
const TURNS_PER_INDEX: usize = 2;

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

    /// [`Self::apply`] each op in order. Every clear is done on return.
    pub fn apply_all(&mut self, ops: &[ShardOp]) {
        self.apply_staged(ops);
        self.finish();
    }

    /// [`Self::apply_all`], except that clears are walked later, in steps
    /// ([`Self::step_clears`]); the shard answers meanwhile as if they were done.
    /// Clears that come before their walk begins share it. A run of stores (one
    /// slot and tier, each block the child of the one before) is filed in one go:
    /// its parents are the blocks just filed, not looked up again.
    pub fn apply_staged(&mut self, ops: &[ShardOp]) {
        let mut i = 0;
        while i < ops.len() {
            let op = ops[i];
            i += 1;
            let ShardOp::Store {
                index,
                slot,
                tier,
                parent,
                block,
                local,
                by_seq,
            } = op
            else {
                self.apply(op);
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

    fn must_wait(&self, op: &ShardOp) -> bool {
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
                confirmed, unfiled, ..
            } => {
                self.predictions.confirmed += confirmed as u64;
                if unfiled > 0 {
                    tracing::warn!(unfiled, "an index shard's tree is full; blocks not filed");
                }
            }
            Stored::UnknownParent if by_seq => {
                self.applied -= run.len() as u64;
                let mut parent = parent.map(|p| SeqHash(p.0));
                for &(_, local) in run {
                    let seq = hash::chain(parent, local);
                    self.apply(ShardOp::StoreKeyed {
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
        self.keep_budget();
    }

    pub fn apply(&mut self, op: ShardOp) {
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
                if ix.keyed.store(slot, tier, seq, parent) {
                    self.keep_budget();
                }
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
                self.keep_budget();
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
        }
    }

    /// A router expects `slot` to hold the prompt's blocks `locals` soon: they count
    /// as held on the device until `expires`, or until a store of the block by the
    /// slot confirms it. A clear of the slot's predictions under way is finished
    /// first, so the prediction is not taken by it.
    pub fn predict(
        &mut self,
        index: IndexId,
        slot: WorkerSlot,
        locals: &[BlockHash],
        expires: Tick,
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
        let counts = ix.tree.predict(slot, locals, expires);
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
        self.keep_budget();
    }

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
            self.keep_budget();
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
    /// nothing left to evict). Every index's tree and keyed table take turns; one
    /// that finds nothing passes the turn on.
    fn keep_budget(&mut self) {
        let Some(max) = self.budget.as_ref().map(|b| b.max) else {
            return;
        };
        let mut total = self.sync_budget();
        let turns = self.indexes.len() * TURNS_PER_INDEX;
        // Turns without an eviction: a full round of them means nothing here can go.
        let mut misses = 0;
        while total > max && misses < 4 * (EVICT_TURNS + 1) * turns {
            let turn = self.evict_from % turns;
            self.evict_from = turn + 1;
            let ix = &mut self.indexes[turn / TURNS_PER_INDEX];
            let evicted = match turn % TURNS_PER_INDEX {
                0 => ix.tree.evict().is_some(),
                _ => ix.keyed.evict(),
            };
            if !evicted {
                misses += 1;
                continue;
            }
            misses = 0;
            self.evicted += 1;
            total = self.sync_budget();
        }
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

    /// End every prediction due at `now`, in the indexes that hold predictions.
    pub fn expire(&mut self, now: Tick) {
        self.expired_to = self.expired_to.max(now);
        for ix in &mut self.indexes {
            if ix.tree.has_predictions() {
                self.predictions.expired += ix.tree.expire(now) as u64;
                ix.shrink_if_empty();
            }
        }
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

    /// A step of an export of `index` (at most a keyed table's part,
    /// [`EXPORT_STEP_BLOCKS`] of the tree's blocks, or a part of one slot's engine
    /// map), appending every (block, holder) it reads to `blocks` and the names
    /// the slots give their blocks ([`tree::Tree::engine_names_part`]) to `names`;
    /// returns whether the export is done. Together the steps cover every block
    /// held throughout, once, however the index changes between them; a block
    /// whose slot's name for it went meanwhile is named by nobody. Predictions are
    /// the router's guesses, not the engines' state: never exported.
    pub fn export_step(
        &self,
        index: IndexId,
        at: &mut ExportAt,
        blocks: &mut Vec<DumpedBlock>,
        names: &mut Vec<(WorkerSlot, u32, EngineHash)>,
    ) -> bool {
        let Some(ix) = self.index(index) else {
            return true;
        };
        if at.tree_done {
            let tree = &ix.tree;
            if at.names_slot < tree.engine_slots() {
                let slot = WorkerSlot(at.names_slot as u32);
                let bits = *at
                    .names_bits
                    .get_or_insert_with(|| tree.engine_part_bits(slot));
                tree.engine_names_part(slot, at.names_part, bits, names);
                at.names_part += 1;
                if at.names_part >= 1 << bits {
                    (at.names_slot, at.names_part, at.names_bits) = (at.names_slot + 1, 0, None);
                }
            }
            return at.names_slot >= tree.engine_slots();
        }
        let out = blocks;
        let from = out.len();
        if !at.keyed_done {
            let bits = *at
                .keyed_bits
                .get_or_insert_with(|| ix.keyed.part_bits(EXPORT_BITS_MAX).unwrap_or(0));
            ix.keyed.export_part(at.keyed_part, bits, out);
            at.keyed_part += 1;
            at.keyed_done = at.keyed_part >= 1 << bits;
        } else {
            at.tree_done = ix.tree.dump_step(&mut at.tree, EXPORT_STEP_BLOCKS, out);
        }
        let clearing = ix.clearing.as_deref();
        let mut k = from;
        for i in from..out.len() {
            // As if the clears under way were done, and on media only.
            let h = match clearing {
                None => Some(out[i].holder),
                Some(d) => d.after(out[i].holder),
            };
            let Some(h) = h else { continue };
            let tiers = h.tiers() & TierSet::MEDIA;
            if !tiers.is_empty() {
                out[k] = DumpedBlock {
                    holder: Holder::new(h.slot(), tiers),
                    ..out[i]
                };
                k += 1;
            }
        }
        out.truncate(k);
        false
    }

    /// Every (slot, node, engine hash) by which this shard's slots name the blocks
    /// of `index` they hold, in one go (an export reads them in steps).
    pub fn engine_names(&self, index: IndexId, out: &mut Vec<(WorkerSlot, u32, EngineHash)>) {
        if let Some(ix) = self.index(index) {
            ix.tree.engine_names(out);
        }
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
mod tests {
    use super::*;
    use crate::testing::Xorshift;

    const IX: IndexId = IndexId(0);
    const DEV: Tier = Tier::DEVICE;
    const HOST: Tier = Tier::HOST;

    /// The engine hash slot `slot` names block `local` by (engines name blocks
    /// their own way).
    fn eh(slot: u32, local: u64) -> EngineHash {
        EngineHash(local ^ (u64::from(slot) + 1) << 40)
    }

    /// Slot `slot` stores the chain `locals` on `tier` below its block `parent`.
    fn run(slot: u32, tier: Tier, parent: Option<u64>, locals: &[u64]) -> Vec<ShardOp> {
        let mut p = parent.map(|l| eh(slot, l));
        locals
            .iter()
            .map(|&l| {
                let op = ShardOp::Store {
                    index: IX,
                    slot: WorkerSlot(slot),
                    tier,
                    parent: p,
                    block: eh(slot, l),
                    local: BlockHash(l),
                    by_seq: false,
                };
                p = Some(eh(slot, l));
                op
            })
            .collect()
    }

    fn remove(slot: u32, local: u64, tiers: TierSet) -> ShardOp {
        ShardOp::Remove {
            index: IX,
            slot: WorkerSlot(slot),
            block: eh(slot, local),
            tiers,
        }
    }

    fn clear(slot: u32, tiers: TierSet) -> ShardOp {
        ShardOp::ClearSlot {
            index: IX,
            slot: WorkerSlot(slot),
            tiers,
        }
    }

    fn held(slot: u32, tiers: TierSet) -> u32 {
        Holder::new(WorkerSlot(slot), tiers).0
    }

    fn lookup(s: &mut Shard, locals: &[u64]) -> Vec<u32> {
        let locals: Vec<BlockHash> = locals.iter().map(|&l| BlockHash(l)).collect();
        let mut out = Vec::new();
        s.lookup(IX, Prompt::Locals(&locals), &mut out);
        out
    }

    /// Every exported (sequence hash, holder), sorted, and the export's names.
    fn export(s: &Shard) -> (Vec<(u64, u32)>, usize) {
        let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
        while !s.export_step(IX, &mut at, &mut out, &mut names) {}
        let mut v: Vec<(u64, u32)> = out.iter().map(|b| (b.seq.0, b.holder.0)).collect();
        v.sort();
        (v, names.len())
    }

    #[test]
    fn a_lookup_stops_after_the_first_block_nobody_holds() {
        let mut s = Shard::default();
        s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
        s.apply_all(&run(2, HOST, None, &[10]));
        let d = DEV.bit();
        assert_eq!(
            lookup(&mut s, &[10, 11, 99, 12]),
            [2, held(1, d), held(2, HOST.bit()), 1, held(1, d), 0]
        );
        assert_eq!(lookup(&mut s, &[]), Vec::<u32>::new());
        let mut out = Vec::new();
        s.lookup(IndexId(5), Prompt::Locals(&[BlockHash(10)]), &mut out);
        assert_eq!(out, [0]);
    }

    #[test]
    fn a_block_held_as_the_one_before_is_written_once_and_merges_keep_it() {
        let mut s = Shard::default();
        s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
        s.apply_all(&run(2, DEV, None, &[10, 11]));
        let (a, b) = (held(1, DEV.bit()), held(2, DEV.bit()));
        let out = lookup(&mut s, &[10, 11, 12]);
        assert_eq!(out, [2, a, b, SAME_HOLDERS, 1, a]);
        // Two shards' answers: a block both repeat is repeated in the union; one
        // that only one repeats is spelled out.
        let other = [1, held(3, HOST.bit()), SAME_HOLDERS, 0];
        let mut merged = Vec::new();
        union_holders(&[&out, &other], Some, &mut merged);
        let c = held(3, HOST.bit());
        assert_eq!(merged, [3, a, b, c, SAME_HOLDERS, 1, a]);
        let mut merged = Vec::new();
        union_holders(&[&out, &[1, c, 1, c, 0]], Some, &mut merged);
        assert_eq!(merged, [3, a, b, c, 3, a, b, c, 1, a]);
    }

    #[test]
    fn tiers_go_independently_and_unknown_names_are_counted() {
        let mut s = Shard::default();
        s.apply_all(&run(1, DEV, None, &[10, 11]));
        s.apply_all(&run(1, HOST, None, &[10, 11]));
        s.apply(remove(1, 11, DEV.bit()));
        assert_eq!(
            lookup(&mut s, &[10, 11]),
            [1, held(1, DEV.bit() | HOST.bit()), 1, held(1, HOST.bit())]
        );
        assert_eq!(s.tier_counts(), (2, [1, 2, 0, 0, 0, 0, 0, 0]));
        s.apply(remove(1, 77, TierSet::ALL));
        s.apply_all(&run(1, DEV, Some(78), &[12, 13]));
        assert_eq!((s.unknown_removed, s.unknown_parent), (1, 1));
        // The whole run was skipped.
        assert_eq!(s.tier_counts().0, 2);
    }

    #[test]
    fn a_clear_is_walked_in_steps_answering_as_if_done_and_a_store_to_its_tier_waits() {
        let mut s = Shard::default();
        s.set_clear_step_buckets(1);
        let chain: Vec<u64> = (10..40).collect();
        s.apply_all(&run(1, DEV, None, &chain));
        s.apply_all(&run(1, HOST, None, &chain));
        s.apply_all(&run(2, DEV, None, &chain[..5]));
        s.apply_staged(&[clear(1, DEV.bit())]);
        // Answered as if done, before any step.
        let got = lookup(&mut s, &chain[..2]);
        assert_eq!(
            got,
            [
                2,
                held(1, HOST.bit()),
                held(2, DEV.bit()),
                2,
                held(1, HOST.bit()),
                held(2, DEV.bit())
            ]
        );
        assert!(s.step_clears());
        // A store to the tier being cleared waits, and every later op of its slot;
        // other slots' ops apply.
        s.apply_staged(&run(1, DEV, None, &[90]));
        s.apply_staged(&[remove(1, 10, HOST.bit())]);
        s.apply_staged(&run(2, DEV, None, &[91]));
        assert_eq!(s.waiting_ops(), 2);
        assert_eq!(lookup(&mut s, &[91]), [1, held(2, DEV.bit())]);
        assert_eq!(lookup(&mut s, &[90]), [0]);
        assert_eq!(s.index(IX).unwrap().tree_sizes(), [0, 30, 6]);
        while s.step_clears() {}
        assert_eq!(s.waiting_ops(), 0);
        assert_eq!(lookup(&mut s, &[90]), [1, held(1, DEV.bit())]);
        assert_eq!(lookup(&mut s, &[10]), [1, held(2, DEV.bit())]);
        assert_eq!(s.index(IX).unwrap().tree_sizes(), [0, 30, 6]);
        let (pairs, _) = export(&s);
        assert_eq!(pairs.len(), 29 + 1 + 6);
    }

    /// Random ops, applied with clears walked in tiny steps between them (and
    /// lookups meeting them partway), answer and leave the shard as applying each
    /// at once does.
    #[test]
    fn staged_clears_equal_clears_at_once() {
        let mut rng = Xorshift::new(7);
        for case in 0..50 {
            let (mut stepped, mut direct) = (Shard::default(), Shard::default());
            stepped.set_clear_step_buckets(1 + case % 3);
            for _ in 0..60 {
                let slot = rng.below(3) as u32;
                let tier = Tier(rng.below(2) as u8);
                let ops = match rng.below(8) {
                    0 => vec![clear(slot, tier.bit())],
                    1 => vec![clear(slot, TierSet::ALL)],
                    2 | 3 => vec![remove(slot, 10 + rng.below(12), tier.bit())],
                    _ => {
                        let from = 10 + rng.below(10);
                        let locals: Vec<u64> = (from..from + 1 + rng.below(4)).collect();
                        let parent = (from > 10).then_some(from - 1);
                        run(slot, tier, parent, &locals)
                    }
                };
                stepped.apply_staged(&ops);
                stepped.step_clears();
                // Ops waiting for a clear show once it is done (as a query's answer
                // waits for them in service); a clear nothing waits for stays
                // partway, answered as if done.
                stepped.finish_deferred();
                let probe: Vec<u64> = (10..22).collect();
                let (mut a, mut b) = (stepped.clone_answers(&probe), Vec::new());
                direct.apply_all(&ops);
                b.extend(direct.clone_answers(&probe));
                a.sort();
                b.sort();
                assert_eq!(a, b, "case {case}");
            }
            stepped.finish();
            assert_eq!(export(&stepped).0, export(&direct).0, "case {case}");
            assert_eq!(stepped.tier_counts(), direct.tier_counts(), "case {case}");
        }
    }

    impl Shard {
        /// The holders of every prefix of `locals`, each sorted (a clear under way
        /// and a clear done may list holders in another order).
        fn clone_answers(&mut self, locals: &[u64]) -> Vec<Vec<u32>> {
            (1..=locals.len())
                .map(|n| {
                    let mut v: Vec<u32> = expanded(&lookup(self, &locals[..n]))
                        .into_iter()
                        .flatten()
                        .collect();
                    v.sort();
                    v
                })
                .collect()
        }
    }

    /// A lookup's output as one holder list per block, [`SAME_HOLDERS`] spelled out.
    fn expanded(out: &[u32]) -> Vec<Vec<u32>> {
        HolderLists::new(out).map(|(hs, _)| hs.to_vec()).collect()
    }

    #[test]
    fn a_prediction_scores_as_device_until_confirmed_or_expired_and_is_never_exported() {
        let mut s = Shard::default();
        let locals = [BlockHash(10), BlockHash(11)];
        s.predict(IX, WorkerSlot(1), &locals, 100);
        assert_eq!(
            lookup(&mut s, &[10, 11]),
            [1, held(1, DEV.bit()), 1, held(1, DEV.bit())]
        );
        assert_eq!(export(&s).0, []);
        assert_eq!(s.tier_counts().1[Tier::PREDICTED.0 as usize], 2);
        // The worker stores the first block on the host: that is what it holds now.
        s.apply_all(&run(1, HOST, None, &[10]));
        assert_eq!(s.predictions.confirmed, 1);
        assert_eq!(
            lookup(&mut s, &[10, 11]),
            [1, held(1, HOST.bit()), 1, held(1, DEV.bit())]
        );
        s.expire(99);
        assert_eq!(lookup(&mut s, &[10, 11]).len(), 4);
        s.expire(100);
        assert_eq!(lookup(&mut s, &[10, 11]), [1, held(1, HOST.bit()), 0]);
        assert_eq!(s.predictions.expired, 1);
        assert!(!s.has_predictions());
        // A prediction due before the latest expiry is ended already.
        s.predict(IX, WorkerSlot(2), &locals, 50);
        assert_eq!(s.predictions.created, 2);
    }

    #[test]
    fn an_approximate_index_is_pruned_soonest_due_first() {
        let mut s = Shard::default();
        s.set_prune_bound(IX, Some(PruneBound { max: 8, target: 4 }));
        for p in 0..4u64 {
            let locals: Vec<BlockHash> = (0..3).map(|b| BlockHash(100 * (p + 1) + b)).collect();
            s.predict(IX, WorkerSlot(1), &locals, 10 + p as Tick);
        }
        let (blocks, _) = s.tier_counts();
        assert!(blocks <= 8, "{blocks}");
        assert!(s.predictions.pruned > 0);
        // The newest prediction stays.
        assert_eq!(lookup(&mut s, &[400, 401, 402]).len(), 6);
        assert_eq!(lookup(&mut s, &[100]), [0]);
    }

    #[test]
    fn shards_sharing_a_budget_stay_within_it_and_keep_their_counters() {
        let budget = BlockBudget::new(40);
        let mut shards = [Shard::default(), Shard::default()];
        for s in &mut shards {
            s.set_block_budget(Some(budget.clone()));
        }
        for p in 0..20u64 {
            let locals: Vec<u64> = (0..4).map(|b| 100 * (p + 1) + b).collect();
            let slot = (p % 3) as u32;
            shards[(slot % 2) as usize].apply_all(&run(slot, DEV, None, &locals));
            let held: u64 = shards.iter().map(|s| s.tier_counts().0).sum();
            assert!(held <= 40, "{held} after prompt {p}");
        }
        let evicted: u64 = shards.iter().map(|s| s.evicted).sum();
        let held: u64 = shards.iter().map(|s| s.tier_counts().0).sum();
        assert_eq!(evicted + held, 80);
        for s in &shards {
            let (pairs, _) = export(s);
            assert_eq!(pairs.len() as u64, s.tier_counts().1[0]);
        }
        // Removals free room for the next stores without eviction.
        let before = evicted;
        for p in 0..20u64 {
            let slot = (p % 3) as u32;
            for b in 0..4 {
                shards[(slot % 2) as usize].apply(remove(slot, 100 * (p + 1) + b, TierSet::ALL));
            }
        }
        for s in &mut shards {
            s.sync_budget();
        }
        shards[0].apply_all(&run(0, DEV, None, &[1, 2, 3]));
        assert_eq!(shards.iter().map(|s| s.evicted).sum::<u64>(), before);
    }

    /// A standardized publisher's block under a parent its slot named by another
    /// hash is filed by sequence hash, and a lookup finds it after the tree's.
    #[test]
    fn a_keyed_block_follows_a_tree_block_in_a_lookup_and_goes_by_its_removal() {
        let mut s = Shard::default();
        s.apply_all(&run(1, DEV, None, &[10, 11]));
        let seq11 = hash::chain(Some(hash::chain(None, BlockHash(10))), BlockHash(11));
        let seq12 = hash::chain(Some(seq11), BlockHash(12));
        s.apply_all(&[ShardOp::Store {
            index: IX,
            slot: WorkerSlot(1),
            tier: Tier::DISK,
            parent: Some(EngineHash(seq11.0)),
            block: EngineHash(seq12.0),
            local: BlockHash(12),
            by_seq: true,
        }]);
        assert_eq!(s.unknown_parent, 0);
        assert_eq!(
            lookup(&mut s, &[10, 11, 12]),
            [
                1,
                held(1, DEV.bit()),
                1,
                held(1, DEV.bit()),
                1,
                held(1, Tier::DISK.bit())
            ]
        );
        let mut out = Vec::new();
        s.lookup(
            IX,
            Prompt::Seqs(&[hash::chain(None, BlockHash(10)), seq11, seq12]),
            &mut out,
        );
        assert_eq!(out.len(), 6);
        assert_eq!(export(&s).0.len(), 3);
        s.apply(ShardOp::Remove {
            index: IX,
            slot: WorkerSlot(1),
            block: EngineHash(seq12.0),
            tiers: TierSet::ALL,
        });
        assert_eq!(lookup(&mut s, &[10, 11, 12]).len(), 5);
        assert_eq!(s.unknown_removed, 0);
    }

    #[test]
    fn an_export_names_every_block_its_slots_hold() {
        let mut s = Shard::default();
        s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
        s.apply_all(&run(2, DEV, None, &[10]));
        s.apply_all(&run(2, DEV, Some(10), &[20]));
        let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
        while !s.export_step(IX, &mut at, &mut out, &mut names) {}
        let mut all = Vec::new();
        s.engine_names(IX, &mut all);
        names.sort_unstable_by_key(|n| (n.0, n.1, n.2.0));
        all.sort_unstable_by_key(|n| (n.0, n.1, n.2.0));
        assert_eq!(names, all);
        for b in &out {
            let slot = b.holder.slot();
            let name = names.iter().find(|n| n.0 == slot && n.1 == b.node).unwrap();
            assert_eq!(name.2, eh(slot.0, b.local.0));
        }
        assert_eq!(out.len(), 5);
    }

    /// What a query waits behind while one worker is cleared from a large index
    /// (`KVIX_STALL_ENTRIES` blocks, default 4M, in chains of 64 held by 16 workers):
    /// the longest clear step. A figure, not a check:
    /// `cargo test --release --lib clear_stall -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn clear_stall() {
        use std::time::{Duration, Instant};
        let n = crate::testing::env_u64("KVIX_STALL_ENTRIES", 4 << 20);
        let mut s = Shard::default();
        for c in 0..n / 64 {
            let locals: Vec<u64> = (0..64).map(|b| c << 8 | b).collect();
            s.apply_all(&run((c % 16) as u32, DEV, None, &locals));
        }
        s.apply_staged(&[clear(3, TierSet::ALL)]);
        let (mut worst, mut steps) = (Duration::ZERO, 0);
        loop {
            let t = Instant::now();
            let more = s.step_clears();
            worst = worst.max(t.elapsed());
            steps += 1;
            if !more {
                break;
            }
        }
        println!("{n} blocks: clear of one worker in {steps} steps, worst {worst:?}");
    }

    /// The longest step of an export of a large index (`KVIX_STALL_ENTRIES` blocks,
    /// default 4M): what a query waits behind. A figure, not a check:
    /// `cargo test --release --lib export_stall -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn export_stall() {
        use std::time::{Duration, Instant};
        let n = crate::testing::env_u64("KVIX_STALL_ENTRIES", 4 << 20);
        let mut s = Shard::default();
        for c in 0..n / 64 {
            let locals: Vec<u64> = (0..64).map(|b| c << 8 | b).collect();
            s.apply_all(&run((c % 16) as u32, DEV, None, &locals));
        }
        let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
        let (mut worst, mut steps) = (Duration::ZERO, 0);
        loop {
            let t = Instant::now();
            let done = s.export_step(IX, &mut at, &mut out, &mut names);
            worst = worst.max(t.elapsed());
            steps += 1;
            if done {
                break;
            }
        }
        println!("{n} blocks: export with engine names in {steps} steps, worst {worst:?}");
    }
}
