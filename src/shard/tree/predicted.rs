//! Holders a router predicted: counted as held on the device until their
//! deadline or a store by the slot that confirms them. The deadlines live in
//! [`Predictions`]; each names its node and a check of the node's local hash, so
//! that one left behind by a clear never ends another block's. A prediction is
//! the router's guess, never the engines' state: it has no engine hash and is
//! never exported.

use super::Tree;
use super::arena::{NodeId, NodeRef, get};
use crate::shard::predict::{Predicted, PredictedBlock, Predictions, Tick};
use crate::types::{BlockHash, EngineHash, Tier, TierSet, WorkerSlot};

/// A block as a prediction names it: its node, and the low half of its local hash
/// so that a prediction left behind by a clear never ends another block's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeKey {
    id: NodeId,
    check: u32,
}

impl PredictedBlock for NodeKey {
    fn to_bits(self) -> u64 {
        self.id.index() as u64 | (self.check as u64) << 32
    }
    fn from_bits(bits: u64) -> Self {
        NodeKey {
            id: NodeId::at_index(bits as u32),
            check: (bits >> 32) as u32,
        }
    }
}

/// Where a prediction applied in steps has got to: the prompt's first block
/// comes next (`Root`), or the block below the node of the last one predicted,
/// named as it was then (the tree's epoch, the node's reference and local hash
/// check: a node freed, reused or emptied since names nothing), or nothing more
/// is to be predicted (`Lost`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainAt(At);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum At {
    #[default]
    Root,
    Below {
        epoch: u32,
        node: NodeRef,
        check: u32,
        /// The prompt's request, as its first step stamped it.
        stamp: u32,
    },
    Lost,
}

impl ChainAt {
    /// Nothing more of the prompt is to be predicted.
    pub fn is_lost(&self) -> bool {
        self.0 == At::Lost
    }
}

/// What a prediction did, for the shard's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PredictCounts {
    pub created: usize,
    pub refreshed: usize,
}

impl Tree {
    pub(super) fn key(&self, id: NodeId) -> NodeKey {
        NodeKey {
            id,
            check: self.node(id).check(),
        }
    }

    /// `slot` is expected to hold the prompt's blocks `locals` on the device until
    /// `deadline`, from the block after `at` (see [`ChainAt`]; the default: from
    /// the prompt's first): they count as held there until then, or until a
    /// store of the block by the slot confirms it. Blocks the slot holds already
    /// stay as they are. `at` moves on to the last block predicted; if the block
    /// it named is gone (evicted, or its prediction ended), nothing more of the
    /// prompt is predicted: no prefix match could reach past the gap.
    pub fn predict(
        &mut self,
        slot: WorkerSlot,
        locals: &[BlockHash],
        deadline: Tick,
        at: &mut ChainAt,
    ) -> PredictCounts {
        let mut counts = PredictCounts::default();
        let (mut p, stamp) = match at.0 {
            At::Root => {
                self.stamps = self.stamps.wrapping_add(1);
                (None, self.stamps)
            }
            At::Below {
                epoch,
                node,
                check,
                stamp,
            } => {
                let id = node.id();
                let same = epoch == self.epoch
                    && get(&self.chunks, id).is_some_and(|n| {
                        !n.is_free() && n.reference(id) == node && n.check() == check
                    });
                if !same {
                    *at = ChainAt(At::Lost);
                    return counts;
                }
                (Some(id), stamp)
            }
            At::Lost => return counts,
        };
        self.tick();
        for &local in locals {
            let Some(id) = self.child_or_insert(p, local, EngineHash(0)) else {
                *at = ChainAt(At::Lost);
                return counts;
            };
            self.mark(id);
            p = Some(id);
            let tiers = self.holders(id).tiers_of(slot, &self.slab);
            if !(tiers & TierSet::MEDIA).is_empty() {
                continue;
            }
            if tiers.is_empty() {
                self.with_holders(id, |h, slab| h.add(slot, Tier::PREDICTED, slab));
                self.held.slot(slot, 1);
                self.held.add(Tier::PREDICTED);
            }
            let key = self.key(id);
            match self.predictions.predict(key, slot, deadline, stamp) {
                Predicted::Created => counts.created += 1,
                Predicted::Refreshed => counts.refreshed += 1,
            }
        }
        if let Some(id) = p {
            let n = self.node(id);
            *at = ChainAt(At::Below {
                epoch: self.epoch,
                node: n.reference(id),
                check: n.check(),
                stamp,
            });
        }
        counts
    }

    /// Live predicted (block, holder) pairs.
    pub fn predicted_pairs(&self) -> usize {
        self.held.tier_pairs()[Tier::PREDICTED.0 as usize] as usize
    }

    /// Ends the predictions due at or before `now`, looking at no more than
    /// `budget` of them; returns how many ended and whether some due are left.
    pub fn expire(&mut self, now: Tick, budget: usize) -> (usize, bool) {
        let mut left = false;
        let ended = self.end_predictions(|p, end| left = p.expire(now, budget, end));
        (ended, left)
    }

    /// When [`Self::expire`] next has work to do (see [`Predictions::next_due`]).
    pub fn next_prediction_due(&self) -> Option<Tick> {
        self.predictions.next_due()
    }

    /// Ends `n` predictions early, those due soonest first (approximate mode's
    /// pruning); returns how many ended.
    pub fn prune(&mut self, n: usize) -> usize {
        self.end_predictions(|p, end| p.prune(n, end))
    }

    /// Ends the predictions `pick` hands to the function it is given; returns how
    /// many ended (a pair whose block went meanwhile has nothing to end).
    pub(super) fn end_predictions(
        &mut self,
        pick: impl FnOnce(&mut Predictions<NodeKey>, &mut dyn FnMut(NodeKey, WorkerSlot)),
    ) -> usize {
        let mut predictions = std::mem::take(&mut self.predictions);
        let mut ended = 0;
        pick(&mut predictions, &mut |key, slot| {
            ended += self.unpredict(key, slot) as usize
        });
        self.predictions = predictions;
        ended
    }

    pub fn has_predictions(&self) -> bool {
        !self.predictions.is_empty()
    }

    /// Takes the predicted bit off `slot`'s holder of the block `key` names, if it
    /// is still that block and still predicted; the node goes once nothing holds it
    /// or hangs from it. Returns whether the bit was there.
    fn unpredict(&mut self, key: NodeKey, slot: WorkerSlot) -> bool {
        let Some(n) = get(&self.chunks, key.id) else {
            return false;
        };
        if n.is_free()
            || n.check() != key.check
            || !self
                .holders(key.id)
                .tiers_of(slot, &self.slab)
                .contains(Tier::PREDICTED)
        {
            return false;
        }
        self.unhold(slot, key.id, Tier::PREDICTED.bit(), None);
        true
    }
}
