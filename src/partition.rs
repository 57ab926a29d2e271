//! The partition rule: which shard owns a worker slot's blocks.
//!
//! Owns only the mapping (index, worker slot) → shard. Everything a slot holds
//! lives in one shard, with the slot's engine-hash map: a stored run is filed by
//! one core, a removal resolves where its block is, and a query asks every shard
//! for its slots' holders of the whole prompt.

use crate::types::{IndexId, ShardId, WorkerSlot};

/// How an index's worker slots are spread over the shards: over at most `span`
/// shards, the index's first shard then the next ones, slots taking them in turn;
/// each index starts one shard further, so that small indexes do not all pile onto
/// shard 0. Fixed for the process's life: a slot never moves.
///
/// A query walks the prompt once in every shard that holds a slot of its index, so
/// an index of W slots costs min(W, span) walks; its events are filed by as many
/// cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    shards: usize,
    span: usize,
}

impl Partition {
    /// An index spreads over at most `shards_per_index` of `shards` shards (both
    /// clamped to at least 1, the span to at most `shards`).
    pub fn new(shards: usize, shards_per_index: usize) -> Self {
        let shards = shards.max(1);
        Partition {
            shards,
            span: shards_per_index.clamp(1, shards),
        }
    }

    /// Every slot of an index on the next shard in turn.
    pub fn spread_over(shards: usize) -> Self {
        Self::new(shards, shards)
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The most shards one index spreads over.
    pub fn span(&self) -> usize {
        self.span
    }

    /// Owner of `slot` of `index`.
    #[inline]
    pub fn shard_of(&self, index: IndexId, slot: WorkerSlot) -> ShardId {
        ShardId((slot.0 as usize % self.span + index.0 as usize) % self.shards)
    }

    /// How many shards hold some of the first `slots` slots of an index.
    #[inline]
    pub fn spread(&self, slots: usize) -> usize {
        slots.min(self.span)
    }

    /// Can `shard` hold any of the first `slots` slots of `index`? A query asks only
    /// those shards: the others hold nothing of it.
    #[inline]
    pub fn holds_any(&self, index: IndexId, slots: usize, shard: ShardId) -> bool {
        let first = index.0 as usize % self.shards;
        (shard.0 + self.shards - first) % self.shards < self.spread(slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_holds_some_slot_exactly_when_one_is_assigned_to_it() {
        for shards in 1..6 {
            for index in 0..7 {
                for slots in 0..8usize {
                    for shard in 0..shards {
                        for span in 1..=shards {
                            let p = Partition::new(shards, span);
                            let owns = (0..slots as u32)
                                .any(|s| p.shard_of(IndexId(index), WorkerSlot(s)).0 == shard);
                            assert_eq!(
                                p.holds_any(IndexId(index), slots, ShardId(shard)),
                                owns,
                                "index {index}, {slots} slots, shard {shard} of {shards}, span {span}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slots_take_turns_and_indexes_start_apart() {
        let p = Partition::spread_over(3);
        let of = |i: u32, s: u32| p.shard_of(IndexId(i), WorkerSlot(s)).0;
        assert_eq!(
            (0..6).map(|s| of(0, s)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        assert_eq!(of(1, 0), 1);
        assert_eq!(
            Partition::new(1, 1).shard_of(IndexId(7), WorkerSlot(9)).0,
            0
        );
    }

    #[test]
    fn an_index_spreads_over_at_most_its_span() {
        let p = Partition::new(16, 4);
        let of = |s: u32| p.shard_of(IndexId(1), WorkerSlot(s)).0;
        assert_eq!((0..8).map(of).collect::<Vec<_>>(), [1, 2, 3, 4, 1, 2, 3, 4]);
        assert_eq!((p.spread(3), p.spread(4), p.spread(1000)), (3, 4, 4));
        assert_eq!(p.spread(0), 0);
        assert_eq!(Partition::new(2, 4).span(), 2, "clamped to the shards");
        assert_eq!(Partition::new(2, 0).span(), 1);
    }
}
