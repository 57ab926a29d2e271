//! Predictions as a shard takes them: a `/speculate` prompt in steps, the caps
//! on how many an index may hold, the pruning of an approximate index, and their
//! expiry, counted for metrics.
//!
//! Owns when a prediction is refused, pruned or ended. Must never keep a
//! deadline itself: the tree's wheel ([`super::predict`]) does.

use super::predict::Tick;
use super::{ChainAt, IndexShard, Shard, index_mut};
use crate::types::{BlockHash, IndexId, Tier, WorkerSlot};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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

impl IndexShard {
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
}

impl Shard {
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
}
