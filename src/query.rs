//! Gather: per-shard holder lists → per-worker prefix overlap.
//!
//! Owns the scoring rule: walking the query's blocks in prefix order, a worker
//! scores block `i` only if it scored every block before it; the walk stops at
//! the first block that extends nobody. Scores are kept for three cumulative
//! tier sets (device; device+host; every tier), as Dynamo's `instances` and
//! Mooncake's tiers need. Pure computation: no I/O, no shard access.

use crate::partition::shard_of;
use crate::shard::Shard;
use crate::shard::holders::Holder;
use crate::types::{IndexId, SeqHash, Tier, WorkerSlot};

/// What one shard answers for its part of a query.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShardReply {
    /// Per requested block, in order: `[n, holder_1 .. holder_n]`.
    pub holders: Vec<u32>,
    /// Blocks held per slot in this shard (for `tree_sizes`).
    pub per_slot: Vec<u32>,
}

/// Scatter: the query's blocks split by owning shard, each part in prefix order.
pub fn split(seqs: &[SeqHash], shards: usize) -> Vec<Vec<SeqHash>> {
    let mut parts: Vec<Vec<SeqHash>> = vec![Vec::new(); shards];
    for s in seqs {
        parts[shard_of(*s, shards).0].push(*s);
    }
    parts
}

/// What `shard` answers for its part `seqs` of a query on `index`.
pub fn answer(shard: &Shard, index: IndexId, seqs: &[SeqHash]) -> ShardReply {
    let mut reply = ShardReply {
        holders: Vec::with_capacity(seqs.len() * 3),
        per_slot: Vec::new(),
    };
    shard.lookup(index, seqs, &mut reply.holders);
    if let Some(ix) = shard.index(index) {
        reply.per_slot.extend_from_slice(ix.blocks_per_slot());
    }
    reply
}

/// Cumulative tier sets scored per slot.
pub const TIER_SETS: [u8; 3] = [
    Tier::DEVICE.bit(),
    Tier::DEVICE.bit() | Tier::HOST.bit(),
    0xff,
];

/// The overlap of one query with every slot of one index.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// Matched prefix blocks per slot for each of [`TIER_SETS`].
    pub matched: Vec<[u32; 3]>,
    /// Per matched depth, how many slots hold the device prefix up to it.
    pub frequencies: Vec<u32>,
    /// Blocks held per slot, summed over shards.
    pub tree_sizes: Vec<u32>,
}

/// Walk `seqs` in prefix order over the replies of `replies.len()` shards.
/// `live` filters out slots that were unregistered but not yet cleared.
pub fn gather(
    seqs: &[SeqHash],
    replies: &[ShardReply],
    slots: usize,
    live: impl Fn(WorkerSlot) -> bool,
) -> Overlap {
    let shards = replies.len();
    let mut out = Overlap {
        matched: vec![[0; 3]; slots],
        frequencies: Vec::new(),
        tree_sizes: vec![0; slots],
    };
    for r in replies {
        for (t, c) in out.tree_sizes.iter_mut().zip(&r.per_slot) {
            *t += c;
        }
    }
    let mut cursor = vec![0usize; shards];
    for (depth, seq) in seqs.iter().enumerate() {
        let s = shard_of(*seq, shards).0;
        let words = &replies[s].holders;
        let Some(&n) = words.get(cursor[s]) else {
            break;
        };
        let holders = &words[cursor[s] + 1..cursor[s] + 1 + n as usize];
        cursor[s] += 1 + n as usize;
        let depth = depth as u32;
        let (mut advanced, mut freq) = (false, 0);
        for &h in holders {
            let h = Holder(h);
            let slot = h.slot();
            if slot.0 as usize >= slots || !live(slot) {
                continue;
            }
            let m = &mut out.matched[slot.0 as usize];
            for (k, set) in TIER_SETS.iter().enumerate() {
                if h.tiers() & set != 0 && m[k] == depth {
                    m[k] = depth + 1;
                    advanced = true;
                    if k == 0 {
                        freq += 1;
                    }
                }
            }
        }
        if !advanced {
            break;
        }
        if freq > 0 {
            out.frequencies.push(freq);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(slot: u32, tiers: u8) -> u32 {
        Holder::new(WorkerSlot(slot), tiers).0
    }

    #[test]
    fn stops_each_worker_at_its_first_miss() {
        // One shard; blocks 0..3. Slot 0 holds 0,1,2; slot 1 holds 0,2 (gap at 1).
        let seqs = [SeqHash(1), SeqHash(2), SeqHash(3)];
        let d = Tier::DEVICE.bit();
        let reply = ShardReply {
            holders: vec![2, h(0, d), h(1, d), 1, h(0, d), 2, h(0, d), h(1, d)],
            per_slot: vec![3, 2],
        };
        let o = gather(&seqs, &[reply], 2, |_| true);
        assert_eq!(o.matched[0], [3, 3, 3]);
        assert_eq!(o.matched[1], [1, 1, 1]);
        assert_eq!(o.frequencies, vec![2, 1, 1]);
        assert_eq!(o.tree_sizes, vec![3, 2]);
    }

    #[test]
    fn lower_tiers_extend_cumulatively() {
        let seqs = [SeqHash(1), SeqHash(2), SeqHash(3)];
        let (d, c, k) = (Tier::DEVICE.bit(), Tier::HOST.bit(), Tier::DISK.bit());
        let reply = ShardReply {
            holders: vec![1, h(0, d | c), 1, h(0, c), 1, h(0, k)],
            per_slot: vec![3],
        };
        let o = gather(&seqs, &[reply], 1, |_| true);
        assert_eq!(o.matched[0], [1, 2, 3]);
    }

    #[test]
    fn dead_slots_are_ignored() {
        let seqs = [SeqHash(1)];
        let reply = ShardReply {
            holders: vec![1, h(0, 1)],
            per_slot: vec![1],
        };
        let o = gather(&seqs, &[reply], 1, |_| false);
        assert_eq!(o.matched[0], [0, 0, 0]);
        assert!(o.frequencies.is_empty());
    }
}
