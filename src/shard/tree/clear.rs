//! A slot's clear, in steps: a walk of the slot's own engine map, never of the
//! whole index, between which the executor serves.

use super::Tree;
use super::arena::{Node, NodeRef, named_by, remove_tiers};
use super::names::{NamesAt, forget_names};
use crate::types::{Tier, TierSet, WorkerSlot};

impl Tree {
    /// `slot` holds nothing any more on `tiers`, in one go.
    pub fn clear_slot(&mut self, slot: WorkerSlot, tiers: TierSet) {
        let mut at = NamesAt::default();
        while !self.clear_step(slot, tiers, &mut at, usize::MAX) {}
    }

    /// A step of clearing `tiers` of `slot`: a walk of at most `budget` buckets of
    /// the slot's engine map from `at` (the whole index is never walked, only the
    /// slot's own blocks). Other changes may come between steps; a store of the
    /// cleared tiers before the walk is done may or may not be cleared with them.
    /// Returns whether the walk is done.
    pub fn clear_step(
        &mut self,
        slot: WorkerSlot,
        tiers: TierSet,
        at: &mut NamesAt,
        budget: usize,
    ) -> bool {
        if slot.0 as usize >= self.engine.len() {
            // Nothing stored: what the slot holds, if anything, is predicted.
            *at = NamesAt::done();
        }
        let mut map = std::mem::take(self.engine_map(slot));
        let mut ended = std::mem::take(&mut self.ended);
        let mut removed = [0u64; Tier::COUNT];
        {
            let Tree {
                chunks, runs, slab, ..
            } = self;
            // Whether the slot still holds the block `reference` names once its
            // `tiers` are taken off (the name then stays).
            let mut keep = |chunks: &mut [Vec<Node>], reference: NodeRef| {
                let id = reference.id();
                if !named_by(chunks, runs, slab, reference, slot) {
                    // It names a block evicted since, or an alias of one whose hold
                    // ended earlier in the walk.
                    return false;
                }
                let (gone_tiers, gone) = remove_tiers(chunks, runs, slab, id, slot, tiers);
                for t in gone_tiers.iter() {
                    removed[t.0 as usize] += 1;
                }
                if gone {
                    ended.push(id);
                }
                !gone
            };
            // The own names first (the node's key does not change while its holds
            // are taken off), a step at a time; then the others.
            if !at.own.is_done() {
                map.own
                    .retain_step_in(&mut at.own, budget, chunks, |c, n| keep(c, n.0));
            } else {
                map.other
                    .retain_step(&mut at.other, budget, |e| keep(chunks, e.node()));
            }
        }
        self.held.remove_pairs(&removed);
        for &node in &ended {
            self.held.slot(slot, -1);
            self.drop_groups(slot, node);
            if let Some(names) = self.aliases.remove(&(slot, node)) {
                forget_names(&mut map, names, node, None, &self.chunks);
            }
            // A node whose child went before it may have gone with that child.
            if !self.node(node).is_free() && self.holders(node).is_empty() {
                self.emptied(node);
            }
        }
        ended.clear();
        self.ended = ended;
        self.engine[slot.0 as usize] = map;
        if at.is_done() && tiers.contains(Tier::PREDICTED) {
            // Predicted holders have no engine hash: the slot's predictions end here.
            self.end_predictions(|p, end| p.end_slot(slot, end));
        }
        at.is_done()
    }
}
