//! The partition rule: which shard owns a block.
//!
//! Owns only the mapping sequence hash → shard. Kept behind this one function
//! so other rules (e.g. by first block) can be measured against it.

use crate::types::{SeqHash, ShardId};

/// Owner of `seq` among `shards` shards: multiply-shift over the low 32 bits,
/// which spreads XXH3 output evenly without a division.
#[inline]
pub fn shard_of(seq: SeqHash, shards: usize) -> ShardId {
    ShardId((((seq.0 as u32) as u64 * shards as u64) >> 32) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_evenly() {
        for n in [1usize, 2, 3, 4, 7] {
            let mut counts = vec![0u32; n];
            for i in 0..100_000u64 {
                let h = xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes());
                counts[shard_of(SeqHash(h), n).0] += 1;
            }
            let expect = 100_000 / n as u32;
            for c in counts {
                assert!(c.abs_diff(expect) < expect / 20, "n={n} c={c}");
            }
        }
    }
}
