//! How ops reach a shard's index shards: [`Shard::apply`] and its staged form,
//! which files a run of stores (one slot and tier, each block the child of the
//! one before) or of one group event's blocks in one go.
//!
//! Owns the order ops apply in and the runs they form. Walking a clear and
//! evicting are not its own: a clear is started and stepped by `clear.rs` (an op
//! a clear under way must wait for is handed to [`Clearing`]), and the block
//! budget is kept by `budget.rs`; this module only calls them.
//!
//! [`Clearing`]: super::clear::Clearing

use super::tree::{Seed, Stored};
use super::{Shard, ShardOp, index_mut};
use crate::hash;
use crate::types::{BlockHash, EngineHash, IndexId, SeqHash, Tier, WorkerSlot};
use hashbrown::HashMap;

impl Shard {
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
    /// what it stores past the block budget goes by [`Self::step_budget`].
    pub fn apply_staged(&mut self, ops: &[ShardOp]) {
        let mut i = 0;
        while i < ops.len() {
            i += self.apply_run(&ops[i..]);
        }
    }

    /// Applies one op (as [`Self::apply_staged`] does), then keeps the block budget.
    pub fn apply(&mut self, op: ShardOp) {
        self.apply_op(op);
        while self.step_budget() {}
    }

    fn apply_op(&mut self, op: ShardOp) {
        self.apply_run(std::slice::from_ref(&op));
    }

    /// Applies the first of `ops` and the ops after it that make one run with it,
    /// returning how many it took. A run of stores (one slot and tier, each block
    /// the child of the one before) is filed in one go: its parents are the
    /// blocks just filed, not looked up again. One group event's blocks arrive
    /// together, as a store's run does.
    fn apply_run(&mut self, ops: &[ShardOp]) -> usize {
        let op = ops[0];
        // Every index with a clear under way is in `self.clearing`, which is
        // usually empty: checked first, it spares each op a look into its index.
        // A run's ops share the slot and tier, so they wait, or not, together
        // (a clear between them is an op that ends the run).
        if !self.clearing.is_empty() && self.must_wait(&op) {
            self.defer(op);
            return 1;
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
            } => {
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
                }) = ops.get(run.len())
                    && (ix, s, t, p, q) == (index, slot, tier, run[run.len() - 1].0, by_seq)
                {
                    run.push((b, l));
                }
                let took = run.len();
                self.store(index, slot, tier, parent, &run, by_seq);
                self.run = run;
                return took;
            }
            ShardOp::GroupHold {
                index,
                slot,
                group,
                block,
                held,
            } => {
                let mut run = std::mem::take(&mut self.group_run);
                run.clear();
                run.push(block);
                while let Some(&ShardOp::GroupHold {
                    index: ix,
                    slot: s,
                    group: g,
                    block: b,
                    held: h,
                }) = ops.get(run.len())
                    && (ix, s, g, h) == (index, slot, group, held)
                {
                    run.push(b);
                }
                let took = run.len();
                self.hold_in_group(index, slot, group, &run, held);
                self.group_run = run;
                return took;
            }
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
                    return 1;
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
        }
        1
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
                let parent = parent.map(|p| SeqHash(p.0));
                let seqs = hash::chained(parent, run.iter().map(|&(_, local)| local));
                for op in ShardOp::keyed_chain(index, slot, tier, parent, seqs) {
                    self.apply_op(op);
                }
            }
            Stored::UnknownParent => self.unknown_parent += 1,
        }
    }
}
