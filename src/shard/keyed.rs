//! The blocks of one index shard that were published by rolling sequence hash
//! alone (an engine's standardized hashes, sent without tokens): they carry no
//! local hash and name no parent a tree could hang them from, so they are filed
//! by that hash in a table of their own, usually empty.
//!
//! Owns those blocks, their holders, the counts kept of them per slot and per
//! tier (so that metrics and `tree_sizes` never walk the table), and their
//! eviction hand. A block is filed with the parent its first store names, which
//! never changes while it is filed; it never reaches into the tree beside it.

use super::holders::{HeldCounts, Holder, HolderSet, HolderSlab};
use super::table::{BlockTable, Cursor};
use super::{ExportedBlock, NO_NODE};
use crate::types::{BlockHash, SeqHash, Tier, TierSet, WorkerSlot};

/// One keyed block: its parent's sequence hash (a first block's: its own) and
/// its holders.
#[derive(Clone, Copy, Debug)]
struct Block {
    parent: SeqHash,
    holders: HolderSet,
}

/// An eviction looks at a quarter of the table's buckets (at least
/// `EVICT_STEPS`) before the shard passes the turn on to the tree: a table whose
/// blocks are all in use gives way, and its hand laps in a few turns whatever its
/// size.
pub const EVICT_TURNS: usize = 4;
const EVICT_STEPS: usize = 16;

/// Sequence hash → block, with the blocks' holders and their counts.
#[derive(Default)]
pub struct KeyedBlocks {
    table: BlockTable<(SeqHash, Block)>,
    slab: HolderSlab,
    held: HeldCounts,
}

impl KeyedBlocks {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Blocks held per slot (any tier), indexed by slot.
    pub fn per_slot(&self) -> &[u32] {
        self.held.per_slot()
    }

    /// (block, holder) pairs per tier.
    pub fn tier_pairs(&self) -> &[u64; Tier::COUNT] {
        self.held.tier_pairs()
    }

    /// Note stores and matches from now on, for [`Self::evict`].
    pub fn track_use(&mut self) {
        self.table.track_use();
    }

    /// `slot` holds the block `seq` on `tier`, a child of `parent` (`None`: a first
    /// block) if the block is new; a use either way. Returns whether the block is
    /// new. A new block is written whole, so nothing reads back a bucket whose cache
    /// line the insert has only begun to fetch.
    pub fn store(
        &mut self,
        slot: WorkerSlot,
        tier: Tier,
        seq: SeqHash,
        parent: Option<SeqHash>,
    ) -> bool {
        let mut grew = false;
        let (_, block) = self.table.get_or_insert_with(seq, || {
            grew = true;
            let holders = HolderSet::of(Holder::new(slot, tier.bit()));
            let parent = parent.unwrap_or(seq);
            (seq, Block { parent, holders })
        });
        let before = if grew {
            TierSet::NONE
        } else {
            block.holders.add(slot, tier, &mut self.slab)
        };
        if before.is_empty() {
            self.held.slot(slot, 1);
        }
        if !before.contains(tier) {
            self.held.add(tier);
        }
        grew
    }

    /// `slot` no longer holds the block `seq` on `tiers` (media only: a keyed block
    /// is never predicted); the block goes once nobody holds it. Returns whether
    /// `seq` names a block here.
    pub fn remove(&mut self, slot: WorkerSlot, seq: SeqHash, tiers: TierSet) -> bool {
        let Some((_, block)) = self.table.get_mut(&seq) else {
            return false;
        };
        let (removed, gone) = block
            .holders
            .remove(slot, tiers & TierSet::MEDIA, &mut self.slab);
        if gone {
            if block.holders.is_empty() {
                self.table.remove(&seq);
            }
            self.held.slot(slot, -1);
        }
        self.held.remove(removed);
        true
    }

    /// The holders of the block `seq`, if one is filed; a match counts as a use.
    #[inline]
    pub fn matched(&mut self, seq: &SeqHash) -> Option<&[u32]> {
        let (_, block) = self.table.get_matched(seq)?;
        Some(block.holders.as_slice(&self.slab))
    }

    /// Take `losing[slot]` off every holder among at most `budget` buckets from `at`
    /// (see [`BlockTable::retain_step`]; a block seen again has nothing more to
    /// lose), and the blocks left with no holder.
    pub fn clear_step(&mut self, losing: &[TierSet], at: &mut Cursor, budget: usize) {
        let KeyedBlocks { table, slab, held } = self;
        let mut removed = vec![0u32; losing.len()];
        let mut hit: Vec<(WorkerSlot, TierSet)> = Vec::new();
        table.retain_step(at, budget, |(_, block)| {
            hit.clear();
            hit.extend(block.holders.as_slice(slab).iter().filter_map(|&h| {
                let slot = Holder(h).slot();
                let tiers = losing.get(slot.0 as usize).copied()?;
                (!tiers.is_empty()).then_some((slot, tiers))
            }));
            for &(slot, tiers) in &hit {
                let (bits, gone) = block.holders.remove(slot, tiers, slab);
                held.remove(bits);
                if gone {
                    removed[slot.0 as usize] += 1;
                }
            }
            if block.holders.is_empty() {
                block.holders.free(slab);
                false
            } else {
                true
            }
        });
        for (slot, n) in removed.into_iter().enumerate() {
            if n > 0 {
                held.slot(WorkerSlot(slot as u32), -(n as i32));
            }
        }
    }

    /// One eviction turn: remove a block not stored or matched since the hand last
    /// passed it, with every holder, looking at a quarter of the table (see
    /// [`BlockTable::evict`]). Returns whether the turn found one.
    pub fn evict(&mut self) -> bool {
        let steps = (self.table.buckets() / EVICT_TURNS).max(EVICT_STEPS);
        let Some((_, mut block)) = self.table.evict(steps) else {
            return false;
        };
        for &h in block.holders.as_slice(&self.slab) {
            let h = Holder(h);
            self.held.slot(h.slot(), -1);
            self.held.remove(h.tiers());
        }
        block.holders.free(&mut self.slab);
        true
    }

    /// The bits an export splits the table by (see [`BlockTable::part_bits`]), at
    /// most `max`; `None` when it was never filed.
    pub fn part_bits(&self, max: u32) -> Option<u32> {
        self.table.part_bits().map(|b| b.min(max))
    }

    /// Every (block, holder) of part `part` of `1 << bits`, which together cover
    /// every block once (an export reads them one by one, serving between). A
    /// keyed block has no local hash and no node: it reads as local hash 0 and
    /// [`NO_NODE`].
    pub fn export_part(&self, part: usize, bits: u32, out: &mut Vec<ExportedBlock>) {
        for &(seq, block) in self.table.iter_part(part, bits) {
            let parent = (block.parent != seq).then_some(block.parent);
            for &h in block.holders.as_slice(&self.slab) {
                out.push(ExportedBlock {
                    seq,
                    parent,
                    local: BlockHash(0),
                    holder: Holder(h),
                    node: NO_NODE,
                    groups: 0,
                });
            }
        }
    }

    /// Heap bytes owned by the keyed blocks.
    pub fn heap_bytes(&self) -> usize {
        self.table.allocation_size() + self.slab.capacity_bytes() + self.held.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: Tier = Tier::DEVICE;
    const HOST: Tier = Tier::HOST;

    fn exported(k: &KeyedBlocks) -> Vec<(SeqHash, Option<SeqHash>, u32)> {
        let mut out = Vec::new();
        let bits = k.part_bits(4).unwrap_or(0);
        for part in 0..1 << bits {
            k.export_part(part, bits, &mut out);
        }
        let mut v: Vec<_> = out.iter().map(|d| (d.seq, d.parent, d.holder.0)).collect();
        v.sort_by_key(|&(s, _, h)| (s, h));
        v
    }

    #[test]
    fn a_block_keeps_the_parent_it_was_filed_with_and_goes_with_its_last_holder() {
        let (a, b) = (WorkerSlot(0), WorkerSlot(1));
        let mut k = KeyedBlocks::default();
        assert!(k.store(a, DEV, SeqHash(7), None));
        assert!(k.store(a, DEV, SeqHash(42), Some(SeqHash(7))));
        // A later store names another parent: the block is filed already.
        assert!(!k.store(b, HOST, SeqHash(42), Some(SeqHash(1))));
        assert!(!k.store(a, HOST, SeqHash(42), None));
        assert_eq!(k.len(), 2);
        assert_eq!(k.per_slot(), &[2, 1]);
        assert_eq!(k.tier_pairs()[DEV.0 as usize], 2);
        assert_eq!(k.tier_pairs()[HOST.0 as usize], 2);
        let held = |s: WorkerSlot, t: TierSet| Holder::new(s, t).0;
        assert_eq!(
            exported(&k),
            vec![
                (SeqHash(7), None, held(a, DEV.bit())),
                (
                    SeqHash(42),
                    Some(SeqHash(7)),
                    held(a, DEV.bit() | HOST.bit())
                ),
                (SeqHash(42), Some(SeqHash(7)), held(b, HOST.bit())),
            ]
        );
        assert_eq!(k.matched(&SeqHash(42)).map(<[u32]>::len), Some(2));
        assert!(k.matched(&SeqHash(1)).is_none());
        // A removal names media; a hash filed nowhere names nothing.
        assert!(k.remove(a, SeqHash(42), TierSet::ALL));
        assert!(!k.remove(a, SeqHash(1), TierSet::ALL));
        assert!(k.remove(b, SeqHash(42), HOST.bit()));
        assert!(k.matched(&SeqHash(42)).is_none());
        assert_eq!(k.len(), 1);
        assert_eq!(k.per_slot(), &[1, 0]);
        assert_eq!(k.tier_pairs()[HOST.0 as usize], 0);
    }

    #[test]
    fn a_clear_in_steps_takes_only_its_slots_tiers() {
        let (a, b) = (WorkerSlot(0), WorkerSlot(1));
        let mut k = KeyedBlocks::default();
        for i in 0..1000 {
            k.store(a, DEV, SeqHash(i), None);
            k.store(a, HOST, SeqHash(i), None);
            if i % 2 == 0 {
                k.store(b, DEV, SeqHash(i), None);
            }
        }
        let losing = [DEV.bit() | HOST.bit(), TierSet::NONE];
        let mut at = Cursor::default();
        while !at.is_done() {
            k.clear_step(&losing, &mut at, 7);
        }
        assert_eq!(k.len(), 500);
        assert_eq!(k.per_slot(), &[0, 500]);
        assert_eq!(k.tier_pairs()[DEV.0 as usize], 500);
        assert_eq!(k.tier_pairs()[HOST.0 as usize], 0);
    }

    #[test]
    fn eviction_takes_every_block_in_time() {
        let mut k = KeyedBlocks::default();
        k.track_use();
        for i in 0..200 {
            k.store(WorkerSlot((i % 3) as u32), DEV, SeqHash(i), None);
        }
        let mut n = 0;
        for _ in 0..10_000 {
            if k.is_empty() {
                break;
            }
            n += k.evict() as usize;
        }
        assert_eq!(n, 200);
        assert_eq!(k.per_slot(), &[0, 0, 0]);
        assert_eq!(k.tier_pairs()[DEV.0 as usize], 0);
    }
}
