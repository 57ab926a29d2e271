//! The partition rule: which shard owns a worker slot's blocks.
//!
//! Owns only the mapping (index, worker slot) → shard. Everything a slot holds
//! lives in one shard, with the slot's engine-hash map: a stored run is filed by
//! one core, a removal resolves where its block is, and a query asks every shard
//! for its slots' holders of the whole prompt.

use crate::types::{IndexId, ShardId, WorkerSlot};

/// How an index's worker slots are spread over the shards: `slots_per_shard`
/// consecutive slots share a shard, and these groups take the shards in turn, each
/// index starting one shard further, so that small indexes do not all pile onto
/// shard 0. Fixed for the process's life: a slot never moves.
///
/// A query walks the prompt once in every shard that holds a slot of its index, so
/// an index of W slots costs ceil(W / slots_per_shard) walks (at most one per
/// shard); its events are filed by as many cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    shards: usize,
    slots_per_shard: usize,
}

impl Partition {
    /// Both are clamped to at least 1.
    pub fn new(shards: usize, slots_per_shard: usize) -> Self {
        Partition {
            shards: shards.max(1),
            slots_per_shard: slots_per_shard.max(1),
        }
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    pub fn slots_per_shard(&self) -> usize {
        self.slots_per_shard
    }

    /// Owner of `slot` of `index`.
    #[inline]
    pub fn shard_of(&self, index: IndexId, slot: WorkerSlot) -> ShardId {
        ShardId((slot.0 as usize / self.slots_per_shard + index.0 as usize) % self.shards)
    }

    /// How many shards hold some of the first `slots` slots of an index.
    #[inline]
    pub fn spread(&self, slots: usize) -> usize {
        slots.div_ceil(self.slots_per_shard).min(self.shards)
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
                        for per in 1..4 {
                            let p = Partition::new(shards, per);
                            let owns = (0..slots as u32)
                                .any(|s| p.shard_of(IndexId(index), WorkerSlot(s)).0 == shard);
                            assert_eq!(
                                p.holds_any(IndexId(index), slots, ShardId(shard)),
                                owns,
                                "index {index}, {slots} slots, shard {shard} of {shards}, {per} a shard"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slots_take_turns_and_indexes_start_apart() {
        let p = Partition::new(3, 1);
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
    fn consecutive_slots_share_a_shard_and_a_query_asks_one_shard_a_group() {
        let p = Partition::new(4, 16);
        let of = |s: u32| p.shard_of(IndexId(1), WorkerSlot(s)).0;
        assert!((0..16).all(|s| of(s) == 1));
        assert_eq!((of(16), of(32), of(48), of(64)), (2, 3, 0, 1));
        assert_eq!(p.spread(16), 1);
        assert_eq!(p.spread(17), 2);
        assert_eq!(p.spread(1000), 4);
        assert_eq!(p.spread(0), 0);
    }
}
