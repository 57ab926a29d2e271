//! A hybrid model's other KV-cache groups (sliding window, chunked local,
//! Mamba): which of a slot's blocks each group holds, what each group's rule is,
//! and the hit a prompt comes to under them ([`super::super::hybrid`]).
//!
//! A group's hold is a bit (by `group_idx`) in one word per (slot, block) the
//! slot holds in its full-attention group: a block held in several groups costs
//! one table entry, never a node or a holder more. A group's store of a block
//! the slot does not hold in full attention is not kept: its hit could not
//! reach past the full-attention hit anyway. The word goes with the slot's
//! hold of the block (removal, clear, eviction). Never touches the holders.

use super::arena::NodeId;
use super::{PREFETCH_AHEAD, Tree};
use crate::shard::Prompt;
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

impl Tree {
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
        let mut unheld = 0;
        for (i, &eh) in blocks.iter().enumerate() {
            if let Some(&ahead) = blocks.get(i + PREFETCH_AHEAD) {
                self.engine[slot.0 as usize].prefetch(ahead);
            }
            if !self.hold_in_group(slot, eh, group, held) {
                unheld += 1;
            }
        }
        unheld
    }

    /// One block of [`Self::hold_run_in_group`]: whether the slot holds it in full
    /// attention.
    fn hold_in_group(&mut self, slot: WorkerSlot, eh: EngineHash, group: u8, held: bool) -> bool {
        let Some(node) = self.named(slot, eh) else {
            return false;
        };
        let bit = 1u32 << (group as u32 % MAX_GROUPS);
        if held {
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
        if self.groups.is_empty() {
            return 0;
        }
        self.groups.get(&(slot, node)).copied().unwrap_or(0)
    }

    /// `slot` no longer holds `node`: neither do its groups.
    pub(super) fn drop_groups(&mut self, slot: WorkerSlot, node: NodeId) {
        if !self.groups.is_empty() {
            self.groups.remove(&(slot, node));
        }
    }

    /// (slot, block) pairs held in some other group, for memory accounting.
    pub fn group_pairs(&self) -> usize {
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
    }

    /// The prompt's nodes from its first block while they are filed (held or
    /// not: a window's blocks may follow blocks no one holds).
    fn prompt_path(&self, prompt: Prompt<'_>, out: &mut Vec<NodeId>) {
        let mut p = None;
        for i in 0..prompt.len() {
            let found = match prompt {
                Prompt::Locals(l) => self.child(p, l[i]),
                Prompt::Seqs(s) => self.child_by_seq(p, i.checked_sub(1).map(|j| s[j]), s[i]),
            };
            let Some(id) = found else { return };
            out.push(id);
            p = Some(id);
        }
    }

    /// Per slot with other groups, the blocks of the prompt it would reuse under
    /// its groups' rules (see [`hybrid::hybrid_hit`]), the full-attention hit
    /// counting the device tier as `scores` does, and a predicted block as held
    /// in every group.
    pub fn effective(&self, prompt: Prompt<'_>, out: &mut Vec<(WorkerSlot, u32)>) {
        if !self.is_hybrid() {
            return;
        }
        let mut path = Vec::new();
        self.prompt_path(prompt, &mut path);
        let scored = TierSet(Tier::DEVICE.bit().0 | Tier::PREDICTED.bit().0);
        let mut specs = Vec::new();
        for (s, g) in self.specs.iter().enumerate() {
            if g.groups.is_empty() {
                continue;
            }
            let slot = WorkerSlot(s as u32);
            let bs = g.base.max(1) as u64;
            let full = path
                .iter()
                .take_while(|&&id| {
                    let t = self.node(id).holders.tiers_of(slot, &self.slab);
                    !(t & scored).is_empty()
                })
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
                    self.groups_of(slot, id) & (1 << (group as u32 % MAX_GROUPS)) != 0
                        || self
                            .node(id)
                            .holders
                            .tiers_of(slot, &self.slab)
                            .contains(Tier::PREDICTED)
                })
            };
            let hit = hybrid::hybrid_hit(full * bs, &specs, align, present);
            out.push((slot, (hit / bs) as u32));
        }
    }
}
