//! The partition rule: which shard owns a worker slot's blocks.
//!
//! Owns only the mapping (index, worker slot) → shard. Everything a slot holds
//! lives in one shard, with the slot's engine-hash map: a stored run is filed by
//! one core, a removal resolves where its block is, and a query asks every shard
//! for its slots' holders of the whole prompt.

use crate::types::{IndexId, ShardId, WorkerSlot};

/// Owner of `slot` of `index` among `shards` shards: slots in turn, each index
/// starting one shard further, so that small indexes do not all pile onto shard 0.
#[inline]
pub fn shard_of(index: IndexId, slot: WorkerSlot, shards: usize) -> ShardId {
    ShardId((slot.0 as usize + index.0 as usize) % shards)
}

/// Can `shard` hold any of the first `slots` slots of `index`? A query asks only
/// those shards: with fewer slots than shards, the others hold nothing of it.
#[inline]
pub fn holds_any(index: IndexId, slots: usize, shard: ShardId, shards: usize) -> bool {
    slots >= shards || (shard.0 + shards - index.0 as usize % shards) % shards < slots
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
                        let owns = (0..slots as u32)
                            .any(|s| shard_of(IndexId(index), WorkerSlot(s), shards).0 == shard);
                        assert_eq!(
                            holds_any(IndexId(index), slots, ShardId(shard), shards),
                            owns,
                            "index {index}, {slots} slots, shard {shard} of {shards}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn slots_take_turns_and_indexes_start_apart() {
        let of = |i: u32, s: u32| shard_of(IndexId(i), WorkerSlot(s), 3).0;
        assert_eq!(
            (0..6).map(|s| of(0, s)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        assert_eq!(of(1, 0), 1);
        assert_eq!(shard_of(IndexId(7), WorkerSlot(9), 1).0, 0);
    }
}
