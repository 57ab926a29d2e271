//! Compact holder sets: which worker slots hold a block, on which tiers.
//!
//! A holder is one `u32`: tier mask in the low 8 bits, [`GROUP_LANES`] group
//! lanes above them, the slot in the rest up to bit 31; the top bit is always
//! clear. A lane is the holder's hold of the block in one of its slot's other
//! KV-cache groups (sliding window, Mamba, …), so a block held in several groups
//! costs a bit a group, no more words. A set of one holder is that word; a
//! larger set spills into a per-shard slab (`HolderSlab`) of power-of-two chunks
//! recycled through free lists, so steady-state churn allocates nothing, and the
//! set keeps the chunk's offset with the top bit set. A tree keeps one set per
//! run of blocks, not per block. When a run parts, its two sides share the
//! chunk ([`HolderSet::share`]), and as one block after another of a run takes
//! the same change, each takes the chunk the first one's change made (the slab
//! remembers its last copy), so the run can join up again with one chunk. A
//! shared chunk never changes in place (a set copies it first), and it goes back
//! to the slab with its last set. Never shared across shards.

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

/// A chunk header: its class in the top bits, how many sets share it beyond the
/// first in the next ones, the holder count below. Every set has at most one
/// holder per slot, so the count fits below [`SHARE_SHIFT`].
const CLASS_SHIFT: u32 = 27;
const SHARE_SHIFT: u32 = 20;
const LEN_MASK: u32 = (1 << SHARE_SHIFT) - 1;
const SHARERS_MAX: u32 = (1 << (CLASS_SHIFT - SHARE_SHIFT)) - 1;
const _: () = assert!(WorkerSlot::MAX < LEN_MASK);

/// A change to a set, as the slab remembers the last one it made by copying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Add(WorkerSlot, Tier),
    /// A predicted holder takes the tier and is predicted no more.
    Confirm(WorkerSlot, Tier),
    Remove(WorkerSlot, TierSet),
    Lane(WorkerSlot, u32, bool),
}

/// The last change that gave a set a new chunk: the set's word before, the
/// change, and the word after. A set with the same word before that takes the
/// same change shares the chunk instead of copying it again, so a chain of
/// blocks that all have the same holders (a prompt's run, stored by the same
/// workers) keeps one chunk for all of them. Invariant: `from` (unless an inline
/// holder) and `to` are live chunks with the holders they had then; the slab
/// forgets the memo when either changes in place or goes.
#[derive(Clone, Copy, Debug)]
struct Memo {
    from: u32,
    change: Change,
    to: u32,
}

/// Per-shard arena for spilled holder sets. Chunk layout: `[header, h0, h1, ...]`
/// with capacity `1 << class`. A chunk may be shared by many sets (the header
/// counts them); a shared chunk never changes: a set that changes copies it
/// first.
#[derive(Default)]
pub struct HolderSlab {
    words: Vec<u32>,
    free: [Vec<u32>; 25],
    /// Chunks handed out and not released.
    live: u32,
    memo: Option<Memo>,
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
        self.words
            .resize(self.words.len() + 1 + (1usize << class), 0);
        self.words[off as usize] = class << CLASS_SHIFT;
        off
    }

    /// One set fewer uses chunk `off`: the last one gives it back.
    fn drop_ref(&mut self, off: u32) {
        let hdr = self.words[off as usize];
        if (hdr >> SHARE_SHIFT) & SHARERS_MAX > 0 {
            self.words[off as usize] = hdr - (1 << SHARE_SHIFT);
            return;
        }
        self.forget(off);
        self.live -= 1;
        if self.live == 0 && self.words.capacity() >= RELEASE_WORDS {
            // Nothing points into the slab any more: give its memory back rather
            // than keep the peak of a burst that has since been removed.
            *self = HolderSlab::default();
            return;
        }
        let class = hdr >> CLASS_SHIFT;
        self.words[off as usize] = class << CLASS_SHIFT;
        self.free[class as usize].push(off);
    }

    fn shared(&self, off: u32) -> bool {
        (self.words[off as usize] >> SHARE_SHIFT) & SHARERS_MAX > 0
    }

    /// Chunk `off` changes in place or goes: a remembered change naming it no
    /// longer holds.
    fn forget(&mut self, off: u32) {
        let w = SPILLED | off;
        if self.memo.is_some_and(|m| m.from == w || m.to == w) {
            self.memo = None;
        }
    }

    /// The word a set of word `from` gets from `change`, if the last copy made
    /// was that one and its chunk can take another sharer (now counted).
    fn recall(&mut self, from: u32, change: Change) -> Option<u32> {
        let m = self.memo.filter(|m| m.from == from && m.change == change)?;
        let off = (m.to & !SPILLED) as usize;
        if (self.words[off] >> SHARE_SHIFT) & SHARERS_MAX == SHARERS_MAX {
            return None;
        }
        self.words[off] += 1 << SHARE_SHIFT;
        Some(m.to)
    }

    fn remember(&mut self, from: u32, change: Change, to: u32) {
        if to & SPILLED != 0 {
            self.memo = Some(Memo { from, change, to });
        }
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

    /// A copy of chunk `off` in a new chunk of `class` (room for its holders at
    /// least), the new one's only set's.
    fn copy_of(&mut self, off: u32, class: u32) -> u32 {
        let len = self.words[off as usize] & LEN_MASK;
        debug_assert!(len as usize <= 1 << class);
        let copy = self.alloc(class);
        let src = off as usize + 1;
        self.words
            .copy_within(src..src + len as usize, copy as usize + 1);
        self.words[copy as usize] = (class << CLASS_SHIFT) | len;
        copy
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
        let change = Change::Lane(slot, lane, held);
        self.rewrite(
            slot,
            change,
            |h| if held { h | bit } else { h & !bit },
            slab,
        );
    }

    /// `slot`'s holder word becomes `to` of it (a change the slab may remember);
    /// nothing for a slot that is not a holder.
    fn rewrite(
        &mut self,
        slot: WorkerSlot,
        change: Change,
        to: impl FnOnce(u32) -> u32,
        slab: &mut HolderSlab,
    ) {
        let Some(pos) = self.position(slot, slab) else {
            return;
        };
        let h = self.as_slice(slab)[pos];
        let to = to(h);
        if to != h {
            self.replace(pos, to, change, slab);
        }
    }

    fn position(&self, slot: WorkerSlot, slab: &HolderSlab) -> Option<usize> {
        self.as_slice(slab)
            .iter()
            .position(|&h| Holder(h).slot() == slot)
    }

    /// Holder `pos` becomes `to`: in place if the set is the only one with its
    /// chunk (or holds one holder), else in a copy (or the copy the same change
    /// made last).
    fn replace(&mut self, pos: usize, to: u32, change: Change, slab: &mut HolderSlab) {
        let Some(off) = self.spilled() else {
            self.w = to;
            return;
        };
        let off = off as u32;
        if self.reuse(change, slab) {
            return;
        }
        if !slab.shared(off) {
            slab.forget(off);
            slab.words[off as usize + 1 + pos] = to;
            return;
        }
        let copy = slab.copy_of(off, slab.words[off as usize] >> CLASS_SHIFT);
        slab.words[copy as usize + 1 + pos] = to;
        self.move_to(off, copy, change, slab);
    }

    /// Takes the chunk the same change from the same set made last, if the slab
    /// remembers it (see [`Memo`]); the set's old chunk loses a set.
    fn reuse(&mut self, change: Change, slab: &mut HolderSlab) -> bool {
        let Some(w) = slab.recall(self.w, change) else {
            return false;
        };
        if let Some(off) = self.spilled() {
            slab.drop_ref(off as u32);
        }
        self.w = w;
        true
    }

    /// Moves the set from chunk `off` to `copy` (the changed set, a new chunk of
    /// its own), remembering the change for the next set that makes it from the
    /// same chunk. The old chunk loses a set, and if that was its last, the slab
    /// forgets the change with it (no other set can make it from there).
    fn move_to(&mut self, off: u32, copy: u32, change: Change, slab: &mut HolderSlab) {
        let from = self.w;
        self.w = SPILLED | copy;
        slab.remember(from, change, self.w);
        slab.drop_ref(off);
    }

    /// Add `tier` for `slot`. Returns the slot's tier bits before (0: it was not a
    /// holder).
    pub fn add(&mut self, slot: WorkerSlot, tier: Tier, slab: &mut HolderSlab) -> TierSet {
        if let Some(pos) = self.position(slot, slab) {
            let h = self.as_slice(slab)[pos];
            let before = TierSet(h as u8);
            if !before.contains(tier) {
                let to = h | tier.bit().0 as u32;
                self.replace(pos, to, Change::Add(slot, tier), slab);
            }
            return before;
        }
        let new = Holder::new(slot, tier.bit()).0;
        if self.w == EMPTY {
            self.w = new;
            return TierSet::NONE;
        }
        let change = Change::Add(slot, tier);
        if self.reuse(change, slab) {
            return TierSet::NONE;
        }
        match self.spilled() {
            // Spill: the inline holder and the new one go to a slab chunk.
            None => {
                let off = slab.alloc(MIN_CLASS);
                let base = off as usize;
                slab.words[base] |= 2;
                slab.words[base + 1] = self.w;
                slab.words[base + 2] = new;
                let from = self.w;
                self.w = SPILLED | off;
                slab.remember(from, change, self.w);
            }
            Some(off) => {
                let off = off as u32;
                let hdr = slab.words[off as usize];
                let (class, len) = (hdr >> CLASS_SHIFT, (hdr & LEN_MASK) as usize);
                let full = len == 1usize << class;
                // Appended in place, or in a copy if the chunk is full or shared.
                let at = if full || slab.shared(off) {
                    slab.copy_of(off, class + u32::from(full))
                } else {
                    slab.forget(off);
                    off
                };
                slab.words[at as usize + 1 + len] = new;
                slab.words[at as usize] += 1;
                if at != off {
                    self.move_to(off, at, change, slab);
                }
            }
        }
        TierSet::NONE
    }

    /// `slot`, a predicted holder, holds the block on `tier` now and is predicted
    /// no more (its lanes stay). Nothing changes for a slot that is not a holder.
    pub fn confirm(&mut self, slot: WorkerSlot, tier: Tier, slab: &mut HolderSlab) {
        let (on, off) = (tier.bit().0 as u32, Tier::PREDICTED.bit().0 as u32);
        self.rewrite(slot, Change::Confirm(slot, tier), |h| (h | on) & !off, slab);
    }

    /// Remove the tiers of `tier_mask` from `slot`. Returns the tier bits that were
    /// removed and whether the slot is no longer a holder (its lanes go with it).
    pub fn remove(
        &mut self,
        slot: WorkerSlot,
        tiers: TierSet,
        slab: &mut HolderSlab,
    ) -> (TierSet, bool) {
        let Some(pos) = self.position(slot, slab) else {
            return (TierSet::NONE, false);
        };
        let h = self.as_slice(slab)[pos];
        let removed = TierSet(h as u8 & tiers.0);
        let left = h & !(tiers.0 as u32);
        if left & TIERS != 0 {
            if !removed.is_empty() {
                self.replace(pos, left, Change::Remove(slot, tiers), slab);
            }
            return (removed, false);
        }
        // A slot that holds the block on no tier holds it in no group either.
        let Some(off) = self.spilled() else {
            self.w = EMPTY;
            return (removed, true);
        };
        let off = off as u32;
        let hdr = slab.words[off as usize];
        let len = (hdr & LEN_MASK) as usize;
        if len == 2 {
            let one = slab.chunk(off)[1 - pos];
            slab.drop_ref(off);
            self.w = one;
            return (removed, true);
        }
        let change = Change::Remove(slot, tiers);
        if self.reuse(change, slab) {
            return (removed, true);
        }
        // In place, or in a copy if the chunk is shared; insertion order kept by
        // shifting the tail left.
        let at = if slab.shared(off) {
            slab.copy_of(off, hdr >> CLASS_SHIFT)
        } else {
            slab.forget(off);
            off
        };
        let base = at as usize + 1;
        slab.words
            .copy_within(base + pos + 1..base + len, base + pos);
        slab.words[at as usize] -= 1;
        if at != off {
            self.move_to(off, at, change, slab);
        }
        (removed, true)
    }

    /// A second set with the same holders: the same chunk with one more sharer,
    /// or a copy once the chunk has as many as it can count.
    pub fn share(&self, slab: &mut HolderSlab) -> HolderSet {
        let Some(off) = self.spilled() else {
            return *self;
        };
        let hdr = slab.words[off];
        if (hdr >> SHARE_SHIFT) & SHARERS_MAX < SHARERS_MAX {
            slab.words[off] = hdr + (1 << SHARE_SHIFT);
            return *self;
        }
        HolderSet {
            w: SPILLED | slab.copy_of(off as u32, hdr >> CLASS_SHIFT),
        }
    }

    /// Whether `other` is this set or one sharing its chunk: equal holders, found
    /// without reading them (sets that are equal apart may answer false).
    #[inline]
    pub fn same_as(&self, other: &HolderSet) -> bool {
        self.w == other.w
    }

    /// Return any spilled chunk to the slab; the set becomes empty.
    pub fn free(&mut self, slab: &mut HolderSlab) {
        if let Some(off) = self.spilled() {
            slab.drop_ref(off as u32);
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

        /// Sets changed alike, one after another (as a store changes the blocks of a
        /// run), share chunks; each still agrees with its own list through adds,
        /// removes and lane changes, whether its chunk is shared or not, and once
        /// every set is freed every chunk is back.
        #[test]
        fn sets_changed_alike_share_and_stay_their_holders(
            ops in proptest::collection::vec(
                (0usize..6, 1usize..6, 0u8..3, 0u32..5, 0u8..3, 0u32..2),
                1..120,
            )
        ) {
            const SETS: usize = 6;
            let mut slab = HolderSlab::default();
            let mut sets = [HolderSet::default(); SETS];
            // Per set: (slot, tier bits, lane bits) in insertion order.
            let mut model: Vec<Vec<(u32, u8, u32)>> = vec![Vec::new(); SETS];
            for (first, n, kind, slot, tier, lane) in ops {
                for i in first..(first + n).min(SETS) {
                    let (set, m) = (&mut sets[i], &mut model[i]);
                    let at = m.iter().position(|&(s, _, _)| s == slot);
                    let bit = 1u8 << tier;
                    match kind {
                        0 => {
                            set.add(WorkerSlot(slot), Tier(tier), &mut slab);
                            match at {
                                Some(j) => m[j].1 |= bit,
                                None => m.push((slot, bit, 0)),
                            }
                        }
                        1 => {
                            let (_, gone) = set.remove(WorkerSlot(slot), TierSet(bit), &mut slab);
                            if let Some(j) = at {
                                m[j].1 &= !bit;
                                prop_assert_eq!(gone, m[j].1 == 0);
                                if m[j].1 == 0 {
                                    m.remove(j);
                                }
                            }
                        }
                        _ => {
                            let held = tier != 0;
                            set.set_lane(WorkerSlot(slot), lane, held, &mut slab);
                            if let Some(j) = at {
                                if held {
                                    m[j].2 |= 1 << lane;
                                } else {
                                    m[j].2 &= !(1 << lane);
                                }
                            }
                        }
                    }
                }
                for (set, m) in sets.iter().zip(&model) {
                    let got: Vec<(u32, u8, u32)> = set
                        .as_slice(&slab)
                        .iter()
                        .map(|&h| (Holder(h).slot().0, Holder(h).tiers().0, Holder(h).lanes()))
                        .collect();
                    prop_assert_eq!(&got, m);
                }
            }
            for set in &mut sets {
                set.free(&mut slab);
            }
            prop_assert_eq!(slab.live, 0);
        }

        /// A run of equal sets that each take the same holder ends up with one chunk.
        #[test]
        fn a_run_changed_alike_keeps_one_chunk(len in 2usize..300) {
            let mut slab = HolderSlab::default();
            let mut sets = vec![HolderSet::default(); len];
            for set in &mut sets {
                set.add(WorkerSlot(1), Tier::DEVICE, &mut slab);
            }
            for slot in 2..5 {
                for set in &mut sets {
                    set.add(WorkerSlot(slot), Tier::DEVICE, &mut slab);
                }
                prop_assert_eq!(slab.live as usize, len.div_ceil(SHARERS_MAX as usize + 1));
            }
            for set in &mut sets {
                set.remove(WorkerSlot(3), TierSet::ALL, &mut slab);
            }
            prop_assert!(slab.live as usize <= len.div_ceil(SHARERS_MAX as usize + 1));
            for set in &mut sets {
                set.free(&mut slab);
            }
            prop_assert_eq!(slab.live, 0);
        }
    }
}
