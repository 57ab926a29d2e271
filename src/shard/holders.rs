//! Compact holder sets: which worker slots hold a block, on which tiers.
//!
//! A holder is one `u32`: tier mask in the low 8 bits, [`GROUP_LANES`] group
//! lanes above them, the slot in the rest up to bit 31; the top bit is always
//! clear. A lane is the holder's hold of the block in one of its slot's other
//! KV-cache groups (sliding window, Mamba, …), so a block held in several groups
//! costs a bit a group, no more words. A set of one holder is that word, in the
//! node; a larger set spills into a per-shard slab (`HolderSlab`) of power-of-two chunks
//! recycled through free lists, so steady-state churn allocates nothing, and the
//! node keeps the chunk's offset with the top bit set. Most blocks have one
//! holder, so a node pays 4 bytes for its holders. Never shared across shards.

use crate::types::{Tier, TierSet, WorkerSlot};

/// Group lanes in a holder word: a slot's first this many other KV-cache groups
/// keep their holds in the holder itself.
pub const GROUP_LANES: u32 = 4;
const LANE_SHIFT: u32 = 8;
const SLOT_SHIFT: u32 = LANE_SHIFT + GROUP_LANES;
const LANES: u32 = ((1 << GROUP_LANES) - 1) << LANE_SHIFT;
/// The tier mask's bits.
const TIERS: u32 = 0xff;

/// Packed (slot, group lanes, tier mask).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Holder(pub u32);

impl Holder {
    /// The most slots a holder word can name (the top bit stays clear).
    pub const SLOTS: u32 = 1 << (31 - SLOT_SHIFT);

    pub fn new(slot: WorkerSlot, tiers: TierSet) -> Self {
        Holder((slot.0 << SLOT_SHIFT) | tiers.0 as u32)
    }
    #[inline]
    pub fn slot(self) -> WorkerSlot {
        WorkerSlot(self.0 >> SLOT_SHIFT)
    }
    #[inline]
    pub fn tiers(self) -> TierSet {
        TierSet(self.0 as u8)
    }
    /// The group lanes the holder holds the block in, as bits by lane.
    #[inline]
    pub fn lanes(self) -> u32 {
        (self.0 & LANES) >> LANE_SHIFT
    }
    /// The holder with the same slot and lanes, on `tiers`.
    pub fn with_tiers(self, tiers: TierSet) -> Self {
        Holder((self.0 & !TIERS) | tiers.0 as u32)
    }
    pub fn has(self, tier: Tier) -> bool {
        self.tiers().contains(tier)
    }
    /// The holder as scorers see it: a predicted holder counts as the device.
    #[inline]
    pub fn as_scored(self) -> Holder {
        let p = Tier::PREDICTED.bit().0 as u32;
        if self.0 & p == 0 {
            self
        } else {
            Holder((self.0 & !p) | Tier::DEVICE.bit().0 as u32)
        }
    }
}

// Every slot the registry hands out fits a holder word.
const _: () = assert!(WorkerSlot::MAX < Holder::SLOTS);

const EMPTY: u32 = 0;
/// Marks a spilled set's word, the rest being the chunk's offset; no holder has
/// it, since slots stay below `WorkerSlot::MAX`.
const SPILLED: u32 = 1 << 31;
const MIN_CLASS: u32 = 1; // 2 holders
/// An empty slab at least this big (256 KiB) is freed; a smaller one is kept, so a
/// lone block moving between two and three holders does not allocate each time.
const RELEASE_WORDS: usize = 1 << 16;

/// Inline-or-spilled set of holders; 4 bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct HolderSet {
    /// EMPTY, the one holder, or `SPILLED | slab offset` of two or more.
    w: u32,
}

/// A chunk header's holder count; its class is the top byte.
const LEN_MASK: u32 = 0xff_ffff;

/// Per-shard arena for spilled holder sets. Chunk layout: `[len, h0, h1, ...]`
/// with capacity `1 << class`.
#[derive(Default)]
pub struct HolderSlab {
    words: Vec<u32>,
    free: [Vec<u32>; 25],
    /// Chunks handed out and not released.
    live: u32,
}

impl HolderSlab {
    fn alloc(&mut self, class: u32) -> u32 {
        self.live += 1;
        if let Some(off) = self.free[class as usize].pop() {
            return off;
        }
        // A set names its chunk by a 31-bit offset (the top bit marks a spilled
        // set): 8 GiB of holder words in one shard, far past any index's memory.
        let off = u32::try_from(self.words.len())
            .ok()
            .filter(|o| o & SPILLED == 0)
            .expect("holder slab past 2^31 words");
        // Header word carries the class in its top byte and the length below.
        self.words
            .resize(self.words.len() + 1 + (1usize << class), 0);
        self.words[off as usize] = class << 24;
        off
    }

    fn release(&mut self, off: u32) {
        self.live -= 1;
        if self.live == 0 && self.words.capacity() >= RELEASE_WORDS {
            // Nothing points into the slab any more: give its memory back rather
            // than keep the peak of a burst that has since been removed.
            *self = HolderSlab::default();
            return;
        }
        let class = self.words[off as usize] >> 24;
        self.words[off as usize] = class << 24;
        self.free[class as usize].push(off);
    }

    /// Where chunk `off`'s holders are in `words`: after its header, as many as
    /// the header counts.
    fn span(&self, off: u32) -> std::ops::Range<usize> {
        let start = off as usize + 1;
        start..start + (self.words[off as usize] & LEN_MASK) as usize
    }

    fn chunk(&self, off: u32) -> &[u32] {
        &self.words[self.span(off)]
    }

    fn chunk_mut(&mut self, off: u32) -> &mut [u32] {
        let span = self.span(off);
        &mut self.words[span]
    }

    /// Heap bytes, for memory accounting.
    pub fn capacity_bytes(&self) -> usize {
        self.words.capacity() * 4 + self.free.iter().map(|f| f.capacity() * 4).sum::<usize>()
    }
}

impl HolderSet {
    /// The set of one holder.
    pub fn of(holder: Holder) -> Self {
        HolderSet { w: holder.0 }
    }

    pub fn is_empty(&self) -> bool {
        self.w == EMPTY
    }

    #[inline]
    fn spilled(&self) -> Option<usize> {
        (self.w & SPILLED != 0).then_some((self.w & !SPILLED) as usize)
    }

    /// Holders in insertion order.
    #[inline]
    pub fn as_slice<'s>(&'s self, slab: &'s HolderSlab) -> &'s [u32] {
        match self.spilled() {
            Some(off) => slab.chunk(off as u32),
            None if self.w == EMPTY => &[],
            None => std::slice::from_ref(&self.w),
        }
    }

    /// Whether some holder holds the block on a medium (not only predicted).
    pub fn on_media(&self, slab: &HolderSlab) -> bool {
        self.as_slice(slab)
            .iter()
            .any(|&h| !(Holder(h).tiers() & TierSet::MEDIA).is_empty())
    }

    /// The tiers `slot` holds this block on (empty: not a holder).
    pub fn tiers_of(&self, slot: WorkerSlot, slab: &HolderSlab) -> TierSet {
        self.holder_of(slot, slab)
            .map_or(TierSet::NONE, Holder::tiers)
    }

    /// `slot`'s holder word, if it holds this block.
    #[inline]
    pub fn holder_of(&self, slot: WorkerSlot, slab: &HolderSlab) -> Option<Holder> {
        self.as_slice(slab)
            .iter()
            .find(|&&h| Holder(h).slot() == slot)
            .map(|&h| Holder(h))
    }

    /// `slot` holds (or, with `held` false, no longer holds) this block in group
    /// lane `lane` (below [`GROUP_LANES`]). Nothing changes for a slot that does
    /// not hold the block: a lane is only kept beside a hold on some tier.
    pub fn set_lane(&mut self, slot: WorkerSlot, lane: u32, held: bool, slab: &mut HolderSlab) {
        debug_assert!(lane < GROUP_LANES);
        let bit = 1 << (LANE_SHIFT + lane);
        let mut holders = self.as_mut_slice(slab).iter_mut();
        if let Some(h) = holders.find(|h| Holder(**h).slot() == slot) {
            if held {
                *h |= bit;
            } else {
                *h &= !bit;
            }
        }
    }

    /// [`Self::as_slice`], to change a holder's tiers in place.
    #[inline]
    fn as_mut_slice<'s>(&'s mut self, slab: &'s mut HolderSlab) -> &'s mut [u32] {
        match self.spilled() {
            Some(off) => slab.chunk_mut(off as u32),
            None if self.w == EMPTY => &mut [],
            None => std::slice::from_mut(&mut self.w),
        }
    }

    /// Add `tier` for `slot`. Returns the slot's tier bits before (0: it was not a
    /// holder).
    pub fn add(&mut self, slot: WorkerSlot, tier: Tier, slab: &mut HolderSlab) -> TierSet {
        if let Some(h) = self
            .as_mut_slice(slab)
            .iter_mut()
            .find(|h| Holder(**h).slot() == slot)
        {
            let before = TierSet(*h as u8);
            *h |= tier.bit().0 as u32;
            return before;
        }
        let new = Holder::new(slot, tier.bit()).0;
        match self.spilled() {
            None if self.w == EMPTY => self.w = new,
            None => {
                // Spill: the inline holder and the new one go to a slab chunk.
                let off = slab.alloc(MIN_CLASS);
                let base = off as usize;
                slab.words[base] |= 2;
                slab.words[base + 1] = self.w;
                slab.words[base + 2] = new;
                self.w = SPILLED | off;
            }
            Some(off) => {
                let hdr = slab.words[off];
                let (class, len) = (hdr >> 24, (hdr & LEN_MASK) as usize);
                if len < (1usize << class) {
                    slab.words[off + 1 + len] = new;
                    slab.words[off] = hdr + 1;
                } else {
                    let noff = slab.alloc(class + 1) as usize;
                    slab.words.copy_within(off + 1..off + 1 + len, noff + 1);
                    slab.words[noff + 1 + len] = new;
                    slab.words[noff] = ((class + 1) << 24) | (len as u32 + 1);
                    slab.release(off as u32);
                    self.w = SPILLED | noff as u32;
                }
            }
        }
        TierSet::NONE
    }

    /// Remove the tiers of `tier_mask` from `slot`. Returns the tier bits that were
    /// removed and whether the slot is no longer a holder (its lanes go with it).
    pub fn remove(
        &mut self,
        slot: WorkerSlot,
        tiers: TierSet,
        slab: &mut HolderSlab,
    ) -> (TierSet, bool) {
        let tier_mask = tiers.0;
        let held = self.as_mut_slice(slab);
        let Some(pos) = held.iter().position(|&h| Holder(h).slot() == slot) else {
            return (TierSet::NONE, false);
        };
        let h = &mut held[pos];
        let removed = TierSet(*h as u8 & tier_mask);
        *h &= !(tier_mask as u32);
        if *h & TIERS != 0 {
            return (removed, false);
        }
        // A slot that holds the block on no tier holds it in no group either.
        let Some(off) = self.spilled() else {
            self.w = EMPTY;
            return (removed, true);
        };
        // Keep insertion order: shift the tail left.
        let hdr = slab.words[off];
        let len = (hdr & LEN_MASK) as usize;
        slab.words
            .copy_within(off + 2 + pos..off + 1 + len, off + 1 + pos);
        let len = len - 1;
        slab.words[off] = (hdr & !LEN_MASK) | len as u32;
        if len == 1 {
            let one = slab.words[off + 1];
            slab.release(off as u32);
            self.w = one;
        }
        (removed, true)
    }

    /// Return any spilled chunk to the slab; the set becomes empty.
    pub fn free(&mut self, slab: &mut HolderSlab) {
        if let Some(off) = self.spilled() {
            slab.release(off as u32);
        }
        *self = HolderSet::default();
    }
}

/// What a store of blocks holds, counted as it changes so that metrics and
/// `tree_sizes` never walk the blocks: blocks held per slot (on any tier), and
/// (block, holder) pairs per tier.
#[derive(Debug, Default)]
pub struct HeldCounts {
    per_slot: Vec<u32>,
    pairs: [u64; Tier::COUNT],
}

impl HeldCounts {
    /// Blocks held per slot (any tier), indexed by slot.
    pub fn per_slot(&self) -> &[u32] {
        &self.per_slot
    }

    /// (block, holder) pairs per tier.
    pub fn tier_pairs(&self) -> &[u64; Tier::COUNT] {
        &self.pairs
    }

    /// `slot` holds `delta` blocks more (or fewer).
    pub fn slot(&mut self, slot: WorkerSlot, delta: i32) {
        let i = slot.0 as usize;
        if self.per_slot.len() <= i {
            self.per_slot.resize(i + 1, 0);
        }
        self.per_slot[i] = self.per_slot[i].wrapping_add_signed(delta);
    }

    /// A holder took on `tier` for a block.
    pub fn add(&mut self, tier: Tier) {
        self.pairs[tier.0 as usize] += 1;
    }

    /// A holder lost `tiers` for a block.
    pub fn remove(&mut self, tiers: TierSet) {
        for t in tiers.iter() {
            self.pairs[t.0 as usize] -= 1;
        }
    }

    /// Holders lost `removed[t]` pairs of each tier `t`.
    pub fn remove_pairs(&mut self, removed: &[u64; Tier::COUNT]) {
        for (pairs, removed) in self.pairs.iter_mut().zip(removed) {
            *pairs -= removed;
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.per_slot.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A set agrees with a list of (slot, tiers) through adds and removes that
        /// cross the inline/spilled line both ways, and a slab with no live set
        /// left has handed every chunk back.
        #[test]
        fn a_set_is_its_holders(ops in proptest::collection::vec((any::<bool>(), 0u32..6, 0u8..3), 1..200)) {
            let mut slab = HolderSlab::default();
            let mut set = HolderSet::default();
            let mut model: Vec<(u32, u8)> = Vec::new();
            for (add, slot, tier) in ops {
                let bit = 1u8 << tier;
                let at = model.iter().position(|&(s, _)| s == slot);
                if add {
                    let before = set.add(WorkerSlot(slot), Tier(tier), &mut slab);
                    let want = at.map_or(0, |i| model[i].1);
                    prop_assert_eq!(before.0, want);
                    match at {
                        Some(i) => model[i].1 |= bit,
                        None => model.push((slot, bit)),
                    }
                } else {
                    let (removed, gone) = set.remove(WorkerSlot(slot), TierSet(bit), &mut slab);
                    let had = at.map_or(0, |i| model[i].1);
                    prop_assert_eq!(removed.0, had & bit);
                    if let Some(i) = at {
                        model[i].1 &= !bit;
                        prop_assert_eq!(gone, model[i].1 == 0);
                        if model[i].1 == 0 {
                            model.remove(i);
                        }
                    }
                }
                let got: Vec<(u32, u8)> = set
                    .as_slice(&slab)
                    .iter()
                    .map(|&h| (Holder(h).slot().0, Holder(h).tiers().0))
                    .collect();
                prop_assert_eq!(&got, &model);
                prop_assert_eq!(set.is_empty(), model.is_empty());
                prop_assert_eq!(slab.live, u32::from(model.len() > 1));
            }
            set.free(&mut slab);
            prop_assert_eq!(slab.live, 0);
        }
    }
}
