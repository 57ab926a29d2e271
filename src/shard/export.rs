//! An index shard read out in steps, for `/dump` and snapshots: the keyed table a
//! part at a time, then the tree depth first, then each slot's engine names. A
//! step never changes the index; predictions (the router's guesses, not the
//! engines' state) are never exported.

use super::Shard;
use super::holders::Holder;
use super::tree::{ExportWalk, SlotGroups};
use crate::types::{BlockHash, EngineHash, IndexId, SeqHash, TierSet, WorkerSlot};

/// An export of a keyed table splits it into at most `1 << EXPORT_BITS_MAX`
/// parts, one step each.
const EXPORT_BITS_MAX: u32 = 12;

/// Blocks of a tree an export step reads: a fraction of a millisecond.
const EXPORT_STEP_BLOCKS: usize = 1 << 14;

/// A block as an export reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportedBlock {
    pub seq: SeqHash,
    pub parent: Option<SeqHash>,
    pub local: BlockHash,
    pub holder: Holder,
    /// The block's node in its shard's tree (its slot's engine hashes name it:
    /// [`Shard::engine_names`]); [`NO_NODE`] for a block of the keyed table.
    pub node: u32,
    /// The slot's KV-cache groups other than full attention holding the block,
    /// as bits by `group_idx` ([`super::tree::Tree::groups_of`]).
    pub groups: u32,
}

/// One index shard's export, as its steps read it.
#[derive(Debug, Default)]
pub struct ShardExport {
    /// Every (block, holder), in the steps the shard read them in.
    pub parts: Vec<Vec<ExportedBlock>>,
    /// How the shard's slots name those blocks ([`Shard::engine_names`]).
    pub names: Vec<(WorkerSlot, u32, EngineHash)>,
    /// The shard's slots with KV-cache groups besides full attention, and what
    /// their stores said of them ([`Shard::group_specs`]).
    pub groups: Vec<(WorkerSlot, SlotGroups)>,
}

/// A [`ExportedBlock`]'s node when it is not in a tree.
pub const NO_NODE: u32 = u32::MAX;

/// Where an export of one index shard ([`Shard::export_step`]) has got to; the
/// default starts one. The keyed table goes first, a hash part a step, then the
/// tree, depth first, then each slot's engine map, a part a step.
#[derive(Clone, Debug, Default)]
pub struct ExportAt {
    keyed_part: usize,
    keyed_bits: Option<u32>,
    keyed_done: bool,
    tree: ExportWalk,
    tree_done: bool,
    names_slot: usize,
    names_part: usize,
    names_bits: Option<u32>,
}

impl Shard {
    /// A step of an export of `index` (at most a keyed table's part,
    /// [`EXPORT_STEP_BLOCKS`] of the tree's blocks, or about as many engine names
    /// from the slots' engine maps), appending every (block, holder) it reads to `blocks` and the names
    /// the slots give their blocks ([`tree::Tree::engine_names_part`]) to `names`;
    /// returns whether the export is done. Together the steps cover every block
    /// held throughout, once, however the index changes between them; a block
    /// whose slot's name for it went meanwhile is named by nobody. Predictions are
    /// the router's guesses, not the engines' state: never exported.
    pub fn export_step(
        &self,
        index: IndexId,
        at: &mut ExportAt,
        blocks: &mut Vec<ExportedBlock>,
        names: &mut Vec<(WorkerSlot, u32, EngineHash)>,
    ) -> bool {
        let Some(ix) = self.index(index) else {
            return true;
        };
        if at.tree_done {
            // Parts of one slot's map or several slots' small maps, up to a step's
            // worth of names: one step per slot would cost a fleet of slots as many
            // round trips.
            let tree = &ix.tree;
            let from = names.len();
            while at.names_slot < tree.engine_slots() && names.len() - from < EXPORT_STEP_BLOCKS {
                let slot = WorkerSlot(at.names_slot as u32);
                let bits = *at
                    .names_bits
                    .get_or_insert_with(|| tree.engine_part_bits(slot));
                tree.engine_names_part(slot, at.names_part, bits, names);
                at.names_part += 1;
                if at.names_part >= 1 << bits {
                    (at.names_slot, at.names_part, at.names_bits) = (at.names_slot + 1, 0, None);
                }
            }
            return at.names_slot >= tree.engine_slots();
        }
        let out = blocks;
        let from = out.len();
        if !at.keyed_done {
            let bits = *at
                .keyed_bits
                .get_or_insert_with(|| ix.keyed.part_bits(EXPORT_BITS_MAX).unwrap_or(0));
            ix.keyed.export_part(at.keyed_part, bits, out);
            at.keyed_part += 1;
            at.keyed_done = at.keyed_part >= 1 << bits;
        } else {
            at.tree_done = ix.tree.export_step(&mut at.tree, EXPORT_STEP_BLOCKS, out);
        }
        let clearing = ix.clearing.as_deref();
        let mut k = from;
        for i in from..out.len() {
            // As if the clears under way were done, and on media only.
            let h = match clearing {
                None => Some(out[i].holder),
                Some(d) => d.after(out[i].holder),
            };
            let Some(h) = h else { continue };
            let tiers = h.tiers() & TierSet::MEDIA;
            if !tiers.is_empty() {
                out[k] = ExportedBlock {
                    holder: Holder::new(h.slot(), tiers),
                    ..out[i]
                };
                k += 1;
            }
        }
        out.truncate(k);
        false
    }

    /// Every slot of `index` in this shard with KV-cache groups besides full
    /// attention, and what its stores said of them.
    pub fn group_specs(&self, index: IndexId, out: &mut Vec<(WorkerSlot, SlotGroups)>) {
        if let Some(ix) = self.index(index) {
            out.extend(ix.tree.slot_groups().map(|(s, g)| (s, g.clone())));
        }
    }

    /// Every (slot, node, engine hash) by which this shard's slots name the blocks
    /// of `index` they hold, in one go (an export reads them in steps).
    pub fn engine_names(&self, index: IndexId, out: &mut Vec<(WorkerSlot, u32, EngineHash)>) {
        if let Some(ix) = self.index(index) {
            ix.tree.engine_names(out);
        }
    }
}
