//! A radix index of cached blocks: a prefix tree in an arena, and per worker slot
//! the map from the engine's block hashes to the tree's nodes.
//!
//! A node is one block: its local hash, the engine hash it was first stored under,
//! and its run (20 bytes): a run of nodes, each the only child of the one before,
//! with the same holders, keeps the first one's parent, the last one's children
//! and the holders once ([`arena`]). A parent of more than one child keeps them
//! in a child table, found by local hash (a branch is rare: a prompt's blocks
//! form one chain, so branching is where prompts part).
//! A chain of blocks is filed by appends to the arena and walks from nodes that
//! are already in cache, and a sequence hash is never stored: it is computed on
//! the way down ([`Tree::export`], [`Tree::lookup`] by sequence hash). A store
//! resolves its parent and a removal its block through the slot's engine map, so
//! the ingest side needs no map of its own. A slot that names a block by the
//! engine hash its node holds (engines that agree on hashes, and every block one
//! worker stores first) files a 4-byte reference to the node, keyed by the node's
//! hash; another name (engines seeded apart, a second name for the same content)
//! files the hash beside the reference (12 bytes).
//!
//! Invariants: a node lives while it has holders or children (one without holders
//! but with children stays as the path to them, and answers as not held), and its
//! generation changes whenever it stops holding anything. An engine-map entry names
//! its block while the generation it took is the node's and its slot holds the node:
//! removals and clears take a slot's entries with its holds; eviction takes the
//! 4-byte ones and leaves the others to name nothing. A node's engine hash changes
//! only while no slot holds it on a medium, so no 4-byte entry's key changes while
//! it names its node. A prediction names its node and a check of its local hash.
//! The nodes of a run are consecutive in the arena, each but the first the only
//! child of the one before, and hold alike. Owned by one shard; never shared,
//! never blocks; a store, removal or lookup allocates only as the arena, its runs
//! and the tables grow.
//!
//! The rooms: [`arena`] the nodes and their runs, generations and children; [`names`]
//! the slots' engine maps; [`evict`] a bounded index's eviction; [`clear`] a
//! slot's clear in steps; [`predicted`] a router's predicted holders;
//! [`lookup`] a query's walk; [`export`] the read-out in steps and the seed from
//! one. Here: the tree itself, and the store and removal every event comes to.

mod arena;
mod clear;
mod evict;
mod export;
mod groups;
mod lookup;
mod names;
mod predicted;

pub use arena::NodeId;
pub use export::{ExportWalk, Seed};
pub use groups::{MAX_GROUPS, SlotGroups};
pub use names::NamesAt;
pub use predicted::{ChainAt, NodeKey, PredictCounts};

use crate::shard::holders::{HeldCounts, Holder, HolderSet, HolderSlab};
use crate::shard::predict::Predictions;
use crate::types::{BlockHash, EngineHash, Tier, TierSet, WorkerSlot};
use arena::{Node, Runs, at_mut, change_holders, holders_at, remove_tiers};
use hashbrown::{HashMap, HashTable};
use names::{Names, forget_names};

/// How many blocks of a run ahead a store loads the engine map's buckets: the
/// tree work of a few blocks covers one miss.
const PREFETCH_AHEAD: usize = 4;

/// What a store did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The blocks are filed; `new_holders` of them were not held by the slot before,
    /// `confirmed` of them were predicted (now ordinary holders). The last
    /// `unfiled` were not filed: the arena holds as many nodes as ids can name.
    /// `duplicate`: the slot already held every block on this tier under the same
    /// engine hashes, so the store changed nothing (Dynamo warns of it).
    Filed {
        new_holders: usize,
        confirmed: usize,
        duplicate: bool,
        unfiled: usize,
    },
    /// The parent's engine hash names no block of the slot: nothing was filed.
    UnknownParent,
}

/// The radix index of one (model, tenant) index's blocks in one shard.
#[derive(Default)]
pub struct Tree {
    chunks: Vec<Vec<Node>>,
    /// The nodes' runs: their links and holders.
    runs: Runs,
    /// Head of the free list (the nodes chain it through their local hash).
    free: Option<NodeId>,
    /// Nodes on the free list.
    free_len: usize,
    live: usize,
    /// First blocks, by local hash.
    roots: HashTable<NodeId>,
    /// Child tables of parents with more than one child.
    wide: HashMap<NodeId, HashTable<NodeId>>,
    slab: HolderSlab,
    /// Per slot, engine hash → node.
    engine: Vec<Names>,
    /// (slot, node) pairs that a second engine hash of the slot names (an engine that
    /// files the same content under two hashes): every engine hash of such a pair is
    /// listed, so that all go when the slot stops holding the node. Usually empty.
    aliases: HashMap<(WorkerSlot, NodeId), Vec<EngineHash>>,
    /// Per (slot, node) the slot holds, the bits (by `group_idx`) of its other
    /// KV-cache groups beyond its lanes that hold the block too (see [`groups`]).
    /// Usually empty.
    groups: HashMap<(WorkerSlot, NodeId), u32>,
    /// Per slot, its other KV-cache groups as their stores described them.
    specs: Vec<SlotGroups>,
    /// Per slot, the groups its holder words' lanes stand for.
    lanes: Vec<groups::Lanes>,
    /// The nodes the last lookup walked, kept for [`Tree::effective`] while the
    /// tree has other groups (scratch).
    walked: Vec<NodeId>,
    /// [`Tree::effective`]'s group specs of one slot (scratch).
    spec_scratch: Vec<crate::shard::hybrid::GroupSpec>,
    /// Nodes whose hold a clear step ended (scratch, empty between calls).
    ended: Vec<NodeId>,
    /// An evicted block's holders (scratch).
    scratch: Vec<u32>,
    /// Deadlines of the predicted holders (empty unless a router predicted).
    predictions: Predictions<NodeKey>,
    held: HeldCounts,
    /// A bounded index's last use per node id: the `clock` of the store,
    /// prediction or match that last touched it. Empty unless tracking.
    used: Vec<u32>,
    /// Ticks once per store run, prediction and lookup (wrapping: ages are
    /// compared as differences).
    clock: u32,
    tracking: bool,
    /// A bounded index's leaves, for eviction.
    leaves: evict::Leaves,
    /// At most this many nodes (`None`: as many as ids can name); tests set less.
    node_limit: Option<u32>,
    /// Counts the times the tree gave its memory back and began again, so that a
    /// node named before ([`ChainAt`]) is not taken for one filed after.
    epoch: u32,
    /// The last prediction request's stamp (see [`Predictions::predict`]).
    stamps: u32,
}

impl Tree {
    /// Live nodes (blocks held, and paths to them).
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Blocks held per slot (any tier), indexed by slot.
    pub fn per_slot(&self) -> &[u32] {
        self.held.per_slot()
    }

    /// (block, holder) pairs per tier; [`Tier::PREDICTED`]'s are the live predictions.
    pub fn tier_pairs(&self) -> &[u64; Tier::COUNT] {
        self.held.tier_pairs()
    }

    /// `slot` stores `blocks` (engine hash, local hash) on `tier`, in chain order,
    /// the first a child of the block the slot's `parent` names (`None`: a first
    /// block).
    pub fn store(
        &mut self,
        slot: WorkerSlot,
        tier: Tier,
        parent: Option<EngineHash>,
        blocks: &[(EngineHash, BlockHash)],
    ) -> Stored {
        let p = match parent {
            None => None,
            Some(eh) => {
                let Some(id) = self.named(slot, eh) else {
                    return Stored::UnknownParent;
                };
                Some(id)
            }
        };
        self.file_run(slot, tier, p, blocks)
    }

    /// Files `blocks` as a store does, the first a child of node `p` (`None`: a root).
    pub(super) fn file_run(
        &mut self,
        slot: WorkerSlot,
        tier: Tier,
        mut p: Option<NodeId>,
        blocks: &[(EngineHash, BlockHash)],
    ) -> Stored {
        self.tick();
        let (mut new_holders, mut confirmed, mut unfiled) = (0, 0, 0);
        let mut duplicate = !blocks.is_empty();
        let map = self.engine_map(slot);
        for &(eh, _) in blocks.iter().take(PREFETCH_AHEAD) {
            map.prefetch(eh);
        }
        for (i, &(eh, local)) in blocks.iter().enumerate() {
            if let Some(&(ahead, _)) = blocks.get(i + PREFETCH_AHEAD) {
                self.engine[slot.0 as usize].prefetch(ahead);
            }
            let (id, before) = match self.child(p, local) {
                Some(id) => (id, self.hold(id, slot, tier, eh)),
                None => {
                    // A new block, filed held by the slot alone.
                    let holder = HolderSet::of(Holder::new(slot, tier.bit()));
                    let Some(id) = self.file_node(p, local, eh, holder) else {
                        unfiled = blocks.len() - i;
                        break;
                    };
                    (id, TierSet::NONE)
                }
            };
            self.mark(id);
            if before.is_empty() {
                new_holders += 1;
                self.held.slot(slot, 1);
            }
            if !before.contains(tier) {
                self.held.add(tier);
                duplicate = false;
            }
            if before.contains(Tier::PREDICTED) {
                let key = self.key(id);
                self.predictions.forget(key, slot);
                self.held.remove(Tier::PREDICTED.bit());
                confirmed += 1;
            }
            // Once the slot holds it, its engine hash names it as it is now: one
            // probe files the entry and says what it named before.
            let reference = self.node(id).reference(id);
            let old = {
                let Tree { engine, chunks, .. } = self;
                engine[slot.0 as usize].set(eh, reference, chunks)
            }
            .and_then(|before| self.resolve(slot, before));
            if old == Some(id) {
                p = Some(id);
                continue;
            }
            duplicate = false;
            if let Some(old) = old {
                // The engine reused the hash for other content: the slot's hold on
                // the old block ends with it.
                self.unhold(slot, old, TierSet::ALL, Some(eh));
            }
            if !(before & TierSet::MEDIA).is_empty() {
                // The slot already held this block under another engine hash (a
                // prediction it confirms has none): both names are listed.
                self.alias(slot, id, eh);
            }
            p = Some(id);
        }
        Stored::Filed {
            new_holders,
            confirmed,
            duplicate: duplicate && unfiled == 0,
            unfiled,
        }
    }

    /// `slot` holds filed block `id` on `tier`, which it was stored under as `eh`;
    /// returns the slot's tiers before. A block no slot holds on a medium takes
    /// `eh` as its engine hash.
    fn hold(&mut self, id: NodeId, slot: WorkerSlot, tier: Tier, eh: EngineHash) -> TierSet {
        let Tree {
            chunks, runs, slab, ..
        } = self;
        let holders = holders_at(chunks, runs, id);
        let before = holders.tiers_of(slot, slab);
        if !holders.on_media(slab) {
            // No slot names it by its engine hash: it may take this one.
            at_mut(chunks, id).set_engine(eh);
        }
        if before.contains(Tier::PREDICTED) {
            // The worker stored what it was predicted to: an ordinary holder now, in
            // one change, so that a run confirmed block by block shares the chunk
            // the first block's change made.
            change_holders(chunks, runs, slab, id, |h, slab| {
                h.confirm(slot, tier, slab)
            });
        } else if !before.contains(tier) {
            change_holders(chunks, runs, slab, id, |h, slab| h.add(slot, tier, slab));
        }
        before
    }

    /// Once nothing is filed (every slot cleared), gives the arena's chunks and
    /// the tables back, so that memory a burst grew goes back to the allocator;
    /// a tree in use keeps its chunks (freed nodes are reused).
    pub fn shrink_if_empty(&mut self) {
        if self.live != 0 || !self.predictions.is_empty() || self.chunks.is_empty() {
            return;
        }
        *self = Tree {
            specs: std::mem::take(&mut self.specs),
            lanes: std::mem::take(&mut self.lanes),
            tracking: self.tracking,
            node_limit: self.node_limit,
            epoch: self.epoch.wrapping_add(1),
            ..Tree::default()
        };
    }

    /// `id` holds nothing any more: references taken to it end, and it goes if
    /// nothing hangs from it.
    pub(super) fn emptied(&mut self, id: NodeId) {
        if self.is_leaf(id) {
            self.release(id);
        } else {
            self.node_mut(id).next_generation();
        }
    }

    /// Takes `tiers` off `slot`'s holder of `node`; if the slot holds it no more, its
    /// engine hashes for it go (but `keep`, already re-pointed by the caller), and
    /// the node goes if nothing else holds it or hangs from it.
    pub(super) fn unhold(
        &mut self,
        slot: WorkerSlot,
        node: NodeId,
        tiers: TierSet,
        keep: Option<EngineHash>,
    ) {
        let (removed, gone) = {
            let Tree {
                chunks, runs, slab, ..
            } = self;
            remove_tiers(chunks, runs, slab, node, slot, tiers)
        };
        self.held.remove(removed);
        if !gone {
            return;
        }
        self.held.slot(slot, -1);
        self.drop_groups(slot, node);
        if let Some(names) = self.aliases.remove(&(slot, node)) {
            let Tree { engine, chunks, .. } = self;
            forget_names(&mut engine[slot.0 as usize], names, node, keep, chunks);
        }
        if self.holders(node).is_empty() {
            self.emptied(node);
        }
    }

    /// `slot` no longer holds the block `eh` names on `tiers`. Returns whether the
    /// engine hash named a block. An engine's removal names media; a prediction ends
    /// only by its deadline or a confirming store.
    pub fn remove(&mut self, slot: WorkerSlot, eh: EngineHash, tiers: TierSet) -> bool {
        let tiers = tiers & TierSet::MEDIA;
        let Some(reference) = self
            .engine
            .get(slot.0 as usize)
            .and_then(|m| m.get(eh, &self.chunks))
        else {
            return false;
        };
        let Some(node) = self.resolve(slot, reference) else {
            // It named a block evicted since.
            let Tree { engine, chunks, .. } = self;
            engine[slot.0 as usize].remove(eh, chunks);
            return false;
        };
        let left = self.holders(node).tiers_of(slot, &self.slab).without(tiers);
        if left.is_empty() {
            let Tree { engine, chunks, .. } = self;
            engine[slot.0 as usize].remove(eh, chunks);
        }
        self.unhold(slot, node, tiers, Some(eh));
        true
    }

    /// Heap bytes owned by the tree, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        let node = std::mem::size_of::<Node>();
        self.chunks
            .iter()
            .map(|c| c.capacity() * node)
            .sum::<usize>()
            + self.roots.allocation_size()
            + self.wide.allocation_size()
            + self
                .wide
                .values()
                .map(HashTable::allocation_size)
                .sum::<usize>()
            + self.runs.heap_bytes()
            + self.slab.capacity_bytes()
            + self.predictions.heap_bytes()
            + self.engine_heap_bytes()
            + self.held.heap_bytes()
            + self.used.capacity() * 4
            + self.leaves.heap_bytes()
            + self.groups_heap_bytes()
    }
}

#[cfg(test)]
mod tests;
