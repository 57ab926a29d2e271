//! A hybrid model's other KV-cache groups (sliding window, chunked local,
//! Mamba): which of a slot's blocks each group holds, what each group's rule is,
//! and the hit a prompt comes to under them ([`super::super::hybrid`]).
//!
//! A group's hold of a block is a lane bit in the slot's holder word on the
//! block's node ([`crate::shard::holders`]): a slot's first [`GROUP_LANES`]
//! groups (in the order its stores first described them) cost no memory beyond
//! the hold itself. A slot with more groups keeps the others' holds as bits (by
//! `group_idx`) in one word per (slot, block) in a side table. A group's store of
//! a block the slot does not hold in full attention is not kept: its hit could
//! not reach past the full-attention hit anyway. Lane and word go with the slot's
//! hold of the block (removal, clear, eviction).

use super::arena::NodeId;
use super::{PREFETCH_AHEAD, Tree};
use crate::shard::holders::{GROUP_LANES, Holder};
use crate::shard::hybrid::{self, GroupSpec};
use crate::types::{EngineHash, Tier, TierSet, WorkerSlot};

/// The most `group_idx` values a slot's groups may take (bits of one word).
pub const MAX_GROUPS: u32 = 32;

/// A slot's non-full KV-cache groups, as their stores described them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotGroups {
    /// (group_idx, spec), in group order.
    pub groups: Vec<(u8, GroupSpec)>,
    /// The alignment of a hit in tokens, when set (else the least common
    /// multiple of the block sizes).
    pub align: Option<u32>,
    /// The index's block size (the tree's blocks).
    pub base: u32,
}

/// A slot's group lanes: the `group_idx` each lane of its holder words stands
/// for, in the order its stores first described them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Lanes {
    groups: [u8; GROUP_LANES as usize],
    len: u8,
}

impl Lanes {
    fn of(&self, group: u8) -> Option<u32> {
        self.groups[..self.len as usize]
            .iter()
            .position(|&g| g == group)
            .map(|i| i as u32)
    }

    /// `group`'s lane, given one if it has none and a lane is free.
    fn take(&mut self, group: u8) -> Option<u32> {
        if let Some(lane) = self.of(group) {
            return Some(lane);
        }
        let lane = self.len as u32;
        (lane < GROUP_LANES).then(|| {
            self.groups[lane as usize] = group;
            self.len += 1;
            lane
        })
    }

    /// Lane bits as bits by `group_idx`.
    fn as_groups(&self, lanes: u32) -> u32 {
        self.groups[..self.len as usize]
            .iter()
            .enumerate()
            .filter(|&(lane, _)| lanes & (1 << lane) != 0)
            .fold(0, |bits, (_, &g)| bits | group_bit(g))
    }
}

/// A group's bit in a word of bits by `group_idx`.
fn group_bit(group: u8) -> u32 {
    1 << (group as u32 % MAX_GROUPS)
}

impl Tree {
    /// `slot`'s group `group`'s lane, given one if a lane is free (`take`).
    fn lane(&mut self, slot: WorkerSlot, group: u8, take: bool) -> Option<u32> {
        let i = slot.0 as usize;
        if !take {
            return self.lanes.get(i)?.of(group);
        }
        if self.lanes.len() <= i {
            self.lanes.resize(i + 1, Lanes::default());
        }
        self.lanes[i].take(group)
    }

    /// `slot`'s group `group` is described by `spec` (a store said so).
    pub fn set_group_spec(
        &mut self,
        slot: WorkerSlot,
        group: u8,
        spec: GroupSpec,
        align: Option<u32>,
        base: u32,
    ) {
        let i = slot.0 as usize;
        if self.specs.len() <= i {
            self.specs.resize_with(i + 1, SlotGroups::default);
        }
        self.lane(slot, group, true);
        let s = &mut self.specs[i];
        (s.align, s.base) = (align, base);
        match s.groups.binary_search_by_key(&group, |g| g.0) {
            Ok(at) => s.groups[at].1 = spec,
            Err(at) => s.groups.insert(at, (group, spec)),
        }
    }

    /// `slot`'s groups, if a store described any.
    pub fn group_specs(&self, slot: WorkerSlot) -> Option<&SlotGroups> {
        self.specs
            .get(slot.0 as usize)
            .filter(|s| !s.groups.is_empty())
    }

    /// Every slot a store described groups of, with them.
    pub fn slot_groups(&self) -> impl Iterator<Item = (WorkerSlot, &SlotGroups)> {
        self.specs
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.groups.is_empty())
            .map(|(s, g)| (WorkerSlot(s as u32), g))
    }

    /// Whether some slot has groups besides full attention.
    pub fn is_hybrid(&self) -> bool {
        self.specs.iter().any(|s| !s.groups.is_empty())
    }

    /// `slot`'s group `group` holds (or, with `held` false, no longer holds) the
    /// blocks the slot names `blocks`, one group event's run. Each block's engine
    /// name is prefetched a few blocks ahead, as a store's run is. Returns how many
    /// the slot does not hold in full attention (nothing changes for those).
    pub fn hold_run_in_group(
        &mut self,
        slot: WorkerSlot,
        blocks: &[EngineHash],
        group: u8,
        held: bool,
    ) -> usize {
        let Some(names) = self.engine.get(slot.0 as usize) else {
            return blocks.len();
        };
        for &eh in blocks.iter().take(PREFETCH_AHEAD) {
            names.prefetch(eh);
        }
        // The run's group has the same lane for every block.
        let lane = self.lane(slot, group, held);
        let mut unheld = 0;
        for (i, &eh) in blocks.iter().enumerate() {
            if let Some(&ahead) = blocks.get(i + PREFETCH_AHEAD) {
                self.engine[slot.0 as usize].prefetch(ahead);
            }
            if !self.hold_in_group(slot, eh, group, lane, held) {
                unheld += 1;
            }
        }
        unheld
    }

    /// One block of [`Self::hold_run_in_group`], `lane` being the group's: whether
    /// the slot holds it in full attention.
    fn hold_in_group(
        &mut self,
        slot: WorkerSlot,
        eh: EngineHash,
        group: u8,
        lane: Option<u32>,
        held: bool,
    ) -> bool {
        let Some(node) = self.named(slot, eh) else {
            return false;
        };
        if let Some(lane) = lane {
            let bit = 1 << lane;
            let holder = self.holders(node).holder_of(slot, &self.slab);
            if holder.is_some_and(|h| (h.lanes() & bit != 0) != held) {
                self.with_holders(node, |h, slab| h.set_lane(slot, lane, held, slab));
            }
        }
        // A group that has (or had, before a lane was free) no lane keeps its holds
        // here.
        let bit = group_bit(group);
        if held && lane.is_none() {
            *self.groups.entry((slot, node)).or_insert(0) |= bit;
        } else if let Some(w) = self.groups.get_mut(&(slot, node)) {
            *w &= !bit;
            if *w == 0 {
                self.groups.remove(&(slot, node));
            }
        }
        true
    }

    /// The groups `slot` holds `node` in, as bits by `group_idx`.
    pub fn groups_of(&self, slot: WorkerSlot, node: NodeId) -> u32 {
        self.groups_of_holder(slot, node, self.holders(node).holder_of(slot, &self.slab))
    }

    /// [`Self::groups_of`], `holder` being `slot`'s holder word on `node`.
    fn groups_of_holder(&self, slot: WorkerSlot, node: NodeId, holder: Option<Holder>) -> u32 {
        let lanes = match (holder, self.lanes.get(slot.0 as usize)) {
            (Some(h), Some(l)) if h.lanes() != 0 => l.as_groups(h.lanes()),
            _ => 0,
        };
        if self.groups.is_empty() {
            return lanes;
        }
        lanes | self.groups.get(&(slot, node)).copied().unwrap_or(0)
    }

    /// `slot` no longer holds `node`: neither do its groups (its lanes went with
    /// its holder word).
    pub(super) fn drop_groups(&mut self, slot: WorkerSlot, node: NodeId) {
        if !self.groups.is_empty() {
            self.groups.remove(&(slot, node));
        }
    }

    /// (slot, block) pairs held in a group without a lane.
    #[cfg(test)]
    pub fn side_group_pairs(&self) -> usize {
        self.groups.len()
    }

    pub(super) fn groups_heap_bytes(&self) -> usize {
        self.groups.allocation_size()
            + self
                .specs
                .iter()
                .map(|s| s.groups.capacity() * std::mem::size_of::<(u8, GroupSpec)>())
                .sum::<usize>()
            + self.specs.capacity() * std::mem::size_of::<SlotGroups>()
            + self.lanes.capacity() * std::mem::size_of::<Lanes>()
    }

    /// Per slot with other groups, the blocks of the prompt the last
    /// [`Tree::lookup`] walked that it would reuse under its groups' rules (see
    /// [`hybrid::hybrid_hit`]), the full-attention hit counting the device tier as
    /// `scores` does, and a predicted block as held in every group. The lookup's
    /// walk is enough: it ends at the first block nobody holds, past every slot's
    /// full-attention hit, which caps the others.
    pub fn effective(&mut self, out: &mut Vec<(WorkerSlot, u32)>) {
        if !self.is_hybrid() {
            return;
        }
        let mut specs = std::mem::take(&mut self.spec_scratch);
        let path = &self.walked;
        let scored = TierSet(Tier::DEVICE.bit().0 | Tier::PREDICTED.bit().0);
        for (s, g) in self.specs.iter().enumerate() {
            if g.groups.is_empty() {
                continue;
            }
            let slot = WorkerSlot(s as u32);
            let bs = g.base.max(1) as u64;
            let holder = |id: NodeId| self.holders(id).holder_of(slot, &self.slab);
            let full = path
                .iter()
                .take_while(|&&id| holder(id).is_some_and(|h| !(h.tiers() & scored).is_empty()))
                .count() as u64;
            specs.clear();
            specs.extend(g.groups.iter().map(|&(_, spec)| spec));
            let align = hybrid::alignment(g.base.max(1), &specs, g.align);
            let present = |i: usize, b: u64| {
                let (group, spec) = g.groups[i];
                // The group's block `b` ends where the index's block `last` does.
                let last = ((b + 1) * spec.block_size as u64 / bs).saturating_sub(1) as usize;
                // A prediction stands for every group's blocks: the worker will
                // compute them all.
                path.get(last).is_some_and(|&id| {
                    let h = holder(id);
                    h.is_some_and(|h| h.has(Tier::PREDICTED))
                        || self.groups_of_holder(slot, id, h) & group_bit(group) != 0
                })
            };
            let hit = hybrid::hybrid_hit(full * bs, &specs, align, present);
            out.push((slot, (hit / bs) as u32));
        }
        self.spec_scratch = specs;
    }
}
