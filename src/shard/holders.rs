//! Compact holder sets: which worker slots hold a block, on which tiers.
//!
//! A holder is one `u32`: slot in the high 24 bits, tier mask in the low 8.
//! Up to two holders live inline in the node; larger sets spill into a
//! per-shard slab (`HolderSlab`) of power-of-two chunks recycled through free
//! lists, so steady-state churn allocates nothing. Never shared across shards.

use crate::types::{Tier, TierSet, WorkerSlot};

/// Packed (slot, tier mask).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Holder(pub u32);

impl Holder {
    pub fn new(slot: WorkerSlot, tiers: TierSet) -> Self {
        Holder((slot.0 << 8) | tiers.0 as u32)
    }
    pub fn slot(self) -> WorkerSlot {
        WorkerSlot(self.0 >> 8)
    }
    pub fn tiers(self) -> TierSet {
        TierSet(self.0 as u8)
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

const EMPTY: u32 = 0;
/// Marks a spilled set; cannot collide with a holder since slots stay below `WorkerSlot::MAX`.
const SPILLED: u32 = u32::MAX;
const MIN_CLASS: u32 = 2; // 4 holders
/// An empty slab at least this big (256 KiB) is freed; a smaller one is kept, so a
/// lone block moving between two and three holders does not allocate each time.
const RELEASE_WORDS: usize = 1 << 16;

/// Inline-or-spilled set of holders; 8 bytes.
#[derive(Clone, Copy, Debug)]
pub struct HolderSet {
    /// Inline: `[holder, holder]` (EMPTY-padded); spilled: `[SPILLED, slab offset]`.
    w: [u32; 2],
}

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
        let off = self.words.len() as u32;
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

    fn chunk(&self, off: u32) -> &[u32] {
        let hdr = self.words[off as usize];
        let len = (hdr & 0xff_ffff) as usize;
        &self.words[off as usize + 1..off as usize + 1 + len]
    }

    /// Heap bytes, for memory accounting.
    pub fn capacity_bytes(&self) -> usize {
        self.words.capacity() * 4 + self.free.iter().map(|f| f.capacity() * 4).sum::<usize>()
    }
}

impl Default for HolderSet {
    fn default() -> Self {
        HolderSet { w: [EMPTY, EMPTY] }
    }
}

impl HolderSet {
    /// The set of one holder.
    pub fn of(holder: Holder) -> Self {
        HolderSet {
            w: [holder.0, EMPTY],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.w[0] == EMPTY
    }

    /// Holders in insertion order.
    pub fn as_slice<'s>(&'s self, slab: &'s HolderSlab) -> &'s [u32] {
        if self.w[0] == SPILLED {
            slab.chunk(self.w[1])
        } else if self.w[0] == EMPTY {
            &[]
        } else if self.w[1] == EMPTY {
            &self.w[..1]
        } else {
            &self.w[..2]
        }
    }

    /// The tiers `slot` holds this block on (empty: not a holder).
    /// Whether some holder holds the block on a medium (not only predicted).
    pub fn on_media(&self, slab: &HolderSlab) -> bool {
        self.as_slice(slab)
            .iter()
            .any(|&h| !(Holder(h).tiers() & TierSet::MEDIA).is_empty())
    }

    pub fn tiers_of(&self, slot: WorkerSlot, slab: &HolderSlab) -> TierSet {
        self.as_slice(slab)
            .iter()
            .find(|&&h| h >> 8 == slot.0)
            .map_or(TierSet::NONE, |&h| TierSet(h as u8))
    }

    /// Add `tier` for `slot`. Returns the slot's tier bits before (0: it was not a
    /// holder).
    pub fn add(&mut self, slot: WorkerSlot, tier: Tier, slab: &mut HolderSlab) -> TierSet {
        let bit = tier.bit().0 as u32;
        let key = slot.0;
        if self.w[0] != SPILLED {
            for h in self.w.iter_mut() {
                if *h != EMPTY && *h >> 8 == key {
                    let before = TierSet(*h as u8);
                    *h |= bit;
                    return before;
                }
            }
            let new = Holder::new(slot, tier.bit()).0;
            if self.w[0] == EMPTY {
                self.w[0] = new;
                return TierSet::NONE;
            }
            if self.w[1] == EMPTY {
                self.w[1] = new;
                return TierSet::NONE;
            }
            // Spill: move both inline holders plus the new one into a slab chunk.
            let off = slab.alloc(MIN_CLASS);
            let base = off as usize;
            slab.words[base] |= 3;
            slab.words[base + 1] = self.w[0];
            slab.words[base + 2] = self.w[1];
            slab.words[base + 3] = new;
            self.w[0] = SPILLED;
            self.w[1] = off;
            return TierSet::NONE;
        }
        let off = self.w[1] as usize;
        let hdr = slab.words[off];
        let len = (hdr & 0xff_ffff) as usize;
        for h in &mut slab.words[off + 1..off + 1 + len] {
            if *h >> 8 == key {
                let before = TierSet(*h as u8);
                *h |= bit;
                return before;
            }
        }
        let class = hdr >> 24;
        let new = Holder::new(slot, tier.bit()).0;
        if len < (1usize << class) {
            slab.words[off + 1 + len] = new;
            slab.words[off] = hdr + 1;
            return TierSet::NONE;
        }
        let noff = slab.alloc(class + 1) as usize;
        slab.words.copy_within(off + 1..off + 1 + len, noff + 1);
        slab.words[noff + 1 + len] = new;
        slab.words[noff] = ((class + 1) << 24) | (len as u32 + 1);
        slab.release(off as u32);
        self.w[1] = noff as u32;
        TierSet::NONE
    }

    /// Remove the tiers of `tier_mask` from `slot`. Returns the tier bits that were
    /// removed and whether the slot is no longer a holder.
    pub fn remove(
        &mut self,
        slot: WorkerSlot,
        tiers: TierSet,
        slab: &mut HolderSlab,
    ) -> (TierSet, bool) {
        let key = slot.0;
        let tier_mask = tiers.0;
        if self.w[0] != SPILLED {
            if self.w[0] != EMPTY && self.w[0] >> 8 == key {
                let removed = TierSet(self.w[0] as u8 & tier_mask);
                self.w[0] &= !(tier_mask as u32);
                if self.w[0] & 0xff == 0 {
                    self.w[0] = self.w[1];
                    self.w[1] = EMPTY;
                    return (removed, true);
                }
                return (removed, false);
            } else if self.w[1] != EMPTY && self.w[1] >> 8 == key {
                let removed = TierSet(self.w[1] as u8 & tier_mask);
                self.w[1] &= !(tier_mask as u32);
                if self.w[1] & 0xff == 0 {
                    self.w[1] = EMPTY;
                    return (removed, true);
                }
                return (removed, false);
            }
            return (TierSet::NONE, false);
        }
        let off = self.w[1] as usize;
        let hdr = slab.words[off];
        let len = (hdr & 0xff_ffff) as usize;
        let Some(pos) = slab.words[off + 1..off + 1 + len]
            .iter()
            .position(|h| h >> 8 == key)
        else {
            return (TierSet::NONE, false);
        };
        let h = &mut slab.words[off + 1 + pos];
        let removed = TierSet(*h as u8 & tier_mask);
        *h &= !(tier_mask as u32);
        if *h & 0xff != 0 {
            return (removed, false);
        }
        // Keep insertion order: shift the tail left.
        slab.words
            .copy_within(off + 2 + pos..off + 1 + len, off + 1 + pos);
        let len = len - 1;
        slab.words[off] = (hdr & 0xff00_0000) | len as u32;
        if len <= 2 {
            let (a, b) = (
                slab.words[off + 1],
                if len == 2 { slab.words[off + 2] } else { EMPTY },
            );
            slab.release(off as u32);
            self.w[0] = a;
            self.w[1] = b;
        }
        (removed, true)
    }

    /// Return any spilled chunk to the slab; the set becomes empty.
    pub fn free(&mut self, slab: &mut HolderSlab) {
        if self.w[0] == SPILLED {
            slab.release(self.w[1]);
        }
        *self = HolderSet::default();
    }
}
