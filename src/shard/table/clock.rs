//! Which entries a bounded table evicts: CLOCK over its buckets, a use bit
//! each, and the hand that passes them ([`BlockTable::evict`]).
//!
//! Owns the use bits and the hand. Must never decide *when* to evict: the
//! shard's block budget does.

use super::{BlockTable, Filed, shrink_if_sparse};

/// CLOCK (second chance) over the buckets: a bit per bucket, set when the entry in
/// it is stored or matched, cleared as the hand passes; the hand evicts the first
/// entry it finds clear. Costs one bit per bucket and nothing per lookup beyond
/// setting it. A resize moves entries, so a segment whose bucket count changed
/// starts over with every bit set (everything counts as just used); a same-size
/// rehash of deleted slots can misplace bits, which only makes a choice less exact.
#[derive(Default)]
pub(super) struct Clock {
    /// `used[seg]`: the bits of that segment's buckets.
    pub(super) used: Vec<Used>,
    seg: usize,
    bucket: usize,
}

#[derive(Default)]
pub(super) struct Used {
    /// The segment's bucket count these bits were laid out for.
    buckets: usize,
    pub(super) bits: Vec<u64>,
}

impl Clock {
    /// The bits of `seg`, laid out for its current `buckets` (all set if they were
    /// laid out for another count).
    pub(super) fn used(&mut self, seg: usize, buckets: usize) -> &mut Used {
        if self.used.len() <= seg {
            self.used.resize_with(seg + 1, Used::default);
        }
        let u = &mut self.used[seg];
        if u.buckets != buckets {
            // Laid out for another count, or forgotten: every entry counts as used.
            u.buckets = buckets;
            u.bits.clear();
            u.bits.resize(buckets.div_ceil(64), u64::MAX);
        }
        u
    }

    /// Forget `seg`'s bits (its entries moved without its bucket count changing):
    /// the next [`Self::used`] sets them all.
    pub(super) fn forget(&mut self, seg: usize) {
        if let Some(u) = self.used.get_mut(seg) {
            u.buckets = 0;
        }
    }

    /// Mark `bucket` of `seg` used without knowing the segment's current bucket
    /// count: if it changed, the next [`Self::used`] sets every bit anyway.
    #[inline]
    pub(super) fn note(&mut self, seg: usize, bucket: usize) {
        if let Some(u) = self.used.get_mut(seg)
            && bucket < u.buckets
        {
            u.bits[bucket / 64] |= 1 << (bucket % 64);
        }
    }

    /// Clear the bit of `bucket`, saying whether it was set.
    fn take(&mut self, seg: usize, buckets: usize, bucket: usize) -> bool {
        let w = &mut self.used(seg, buckets).bits[bucket / 64];
        let bit = 1u64 << (bucket % 64);
        let was = *w & bit != 0;
        *w &= !bit;
        was
    }
}

/// Eviction, for entries that say their own key.
impl<E: Filed<Ctx = ()> + Copy> BlockTable<E> {
    /// Remove and return an entry not stored or matched since the hand last passed
    /// it, looking at no more than `steps` buckets (clearing the bits it passes).
    /// `None` if the table is empty, does not track use, or the steps ran out: a
    /// later call goes on from there, and within two laps always finds one.
    pub fn evict(&mut self, steps: usize) -> Option<E> {
        let clock = self.clock.as_deref_mut()?;
        if self.len == 0 {
            return None;
        }
        for _ in 0..steps {
            let s = clock.seg;
            let Some(seg) = self.segs.get_mut(s) else {
                // The table was emptied and filed anew since the hand was here.
                (clock.seg, clock.bucket) = (0, 0);
                continue;
            };
            let (i, buckets) = (clock.bucket, seg.num_buckets());
            if i >= buckets {
                clock.seg = (s + 1) % self.segs.len();
                clock.bucket = 0;
                continue;
            }
            clock.bucket += 1;
            if seg.get_bucket(i).is_none() || clock.take(s, buckets, i) {
                continue;
            }
            let Ok(entry) = seg.get_bucket_entry(i) else {
                continue;
            };
            let (e, _) = entry.remove();
            self.len -= 1;
            shrink_if_sparse(seg, &mut self.moves[s], &());
            return Some(e);
        }
        None
    }
}
