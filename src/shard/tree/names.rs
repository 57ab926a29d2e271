//! Per worker slot, the engine's block hashes → the tree's nodes, so that a
//! store resolves its parent and a removal its block without a map on the
//! ingest side.
//!
//! A slot that names a block by the engine hash its node holds files a 4-byte
//! reference to the node, keyed by the node's hash; another name files the hash
//! beside the reference (12 bytes). An entry is only a claim: it names its
//! block while its generation is the node's and its slot holds the node
//! ([`Tree::resolve`]), so no reference is used without resolving it. Must
//! never change a node's engine hash while a 4-byte entry keyed by it names the
//! node (the entry would be filed under a key it no longer has).

use super::Tree;
use super::arena::{Node, NodeId, NodeRef, at, named_by};
use crate::shard::table::{self, BlockTable, Cursor, Filed, Keyed};
#[cfg(test)]
use crate::types::SeqHash;
use crate::types::{EngineHash, WorkerSlot};

/// An export reads a slot's engine map in at most `1 << ENGINE_PART_BITS_MAX`
/// parts.
const ENGINE_PART_BITS_MAX: u32 = 12;

/// A name of a block that is its node's own engine hash: a reference to the node
/// (generation and id), whose `engine` is the key.
#[derive(Clone, Copy)]
pub(super) struct Named(pub(super) NodeRef);

impl Filed for Named {
    type Key = EngineHash;
    type Ctx = [Vec<Node>];
    #[inline]
    fn key_in(&self, chunks: &[Vec<Node>]) -> EngineHash {
        at(chunks, self.0.id()).engine()
    }
    #[inline]
    fn prefetch_key(&self, chunks: &[Vec<Node>]) {
        table::prefetch(std::ptr::from_ref(&at(chunks, self.0.id()).engine) as usize);
    }
}

/// An engine hash and the node it names: 12 bytes (the hash in halves, so that
/// the entry is 4-byte aligned).
#[derive(Clone, Copy)]
pub(super) struct EngineEntry {
    key: [u32; 2],
    node: NodeRef,
}

impl EngineEntry {
    fn new(eh: EngineHash, node: NodeRef) -> Self {
        EngineEntry {
            key: [eh.0 as u32, (eh.0 >> 32) as u32],
            node,
        }
    }
    /// A reference to the node (generation and id).
    pub(super) fn node(&self) -> NodeRef {
        self.node
    }
}

impl Keyed for EngineEntry {
    type Key = EngineHash;
    #[inline]
    fn key(&self) -> EngineHash {
        EngineHash(self.key[0] as u64 | (self.key[1] as u64) << 32)
    }
}

/// One slot's engine map: engine hash → a reference to a node. A hash is in at
/// most one of the two tables.
#[derive(Default)]
pub(super) struct Names {
    /// Names that are their node's `engine`.
    pub(super) own: BlockTable<Named>,
    /// Other names.
    pub(super) other: BlockTable<EngineEntry>,
}

/// Where a walk of a slot's engine map in steps has got to: its own names, then
/// the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamesAt {
    pub(super) own: Cursor,
    pub(super) other: Cursor,
}

impl NamesAt {
    pub fn is_done(&self) -> bool {
        self.other.is_done()
    }

    /// A walk with nothing left to walk.
    pub(super) fn done() -> Self {
        NamesAt {
            own: Cursor::done(),
            other: Cursor::done(),
        }
    }
}

impl Names {
    /// The reference `eh` names (checked by the caller: it may name nothing now).
    #[inline]
    pub(super) fn get(&self, eh: EngineHash, chunks: &[Vec<Node>]) -> Option<NodeRef> {
        match self.other.get(&eh) {
            Some(e) => Some(e.node()),
            None => self.own.get_in(&eh, chunks).map(|n| n.0),
        }
    }

    /// Files `eh` as a name of `reference`; returns what `eh` named before.
    #[inline]
    pub(super) fn set(
        &mut self,
        eh: EngineHash,
        reference: NodeRef,
        chunks: &[Vec<Node>],
    ) -> Option<NodeRef> {
        if at(chunks, reference.id()).engine() == eh {
            let before = self.other.remove(&eh).map(|e| e.node());
            let replaced = self.own.insert_in(eh, chunks, Named(reference));
            replaced.map(|n| n.0).or(before)
        } else {
            let before = self.own.remove_in(&eh, chunks).map(|n| n.0);
            let replaced = self
                .other
                .insert_in(eh, &(), EngineEntry::new(eh, reference));
            replaced.map(|e| e.node()).or(before)
        }
    }

    pub(super) fn remove(&mut self, eh: EngineHash, chunks: &[Vec<Node>]) {
        if self.own.remove_in(&eh, chunks).is_none() {
            self.other.remove(&eh);
        }
    }

    /// Takes `eh` out if it names node `id` (any generation).
    pub(super) fn forget(&mut self, eh: EngineHash, id: NodeId, chunks: &[Vec<Node>]) {
        if self.get(eh, chunks).is_some_and(|r| r.id() == id) {
            self.remove(eh, chunks);
        }
    }

    #[inline]
    pub(super) fn prefetch(&self, eh: EngineHash) {
        self.own.prefetch(eh);
    }

    /// (engine hash, reference) of every name in part `part` of `1 << bits`.
    fn part<'a>(
        &'a self,
        part: usize,
        bits: u32,
        chunks: &'a [Vec<Node>],
    ) -> impl Iterator<Item = (EngineHash, NodeRef)> + 'a {
        self.own
            .iter_part_in(part, bits, chunks)
            .map(move |n| (n.key_in(chunks), n.0))
            .chain(
                self.other
                    .iter_part(part, bits)
                    .map(|e| (e.key(), e.node())),
            )
    }

    fn part_bits(&self) -> Option<u32> {
        self.own.part_bits().or_else(|| self.other.part_bits())
    }

    fn allocation_size(&self) -> usize {
        self.own.allocation_size() + self.other.allocation_size()
    }
}

/// Takes out of a slot's engine map the `names` that still name `node`, but `keep`.
pub(super) fn forget_names(
    map: &mut Names,
    names: Vec<EngineHash>,
    node: NodeId,
    keep: Option<EngineHash>,
    chunks: &[Vec<Node>],
) {
    for eh in names.into_iter().filter(|&eh| Some(eh) != keep) {
        map.forget(eh, node, chunks);
    }
}

impl Tree {
    pub(super) fn engine_map(&mut self, slot: WorkerSlot) -> &mut Names {
        let i = slot.0 as usize;
        if self.engine.len() <= i {
            self.engine.resize_with(i + 1, Names::default);
        }
        &mut self.engine[i]
    }

    /// The node `slot`'s engine hash `eh` names, if it names one the slot holds.
    pub(super) fn named(&self, slot: WorkerSlot, eh: EngineHash) -> Option<NodeId> {
        let reference = self.engine.get(slot.0 as usize)?.get(eh, &self.chunks)?;
        self.resolve(slot, reference)
    }

    /// The node a reference names, if it is still that node (same generation) and
    /// `slot` holds it.
    pub(super) fn resolve(&self, slot: WorkerSlot, reference: NodeRef) -> Option<NodeId> {
        named_by(&self.chunks, &self.runs, &self.slab, reference, slot).then_some(reference.id())
    }

    /// Records a second engine hash of `slot` for `node`.
    pub(super) fn alias(&mut self, slot: WorkerSlot, node: NodeId, eh: EngineHash) {
        if !self.aliases.contains_key(&(slot, node)) {
            // The first engine hash: the entry that names the node besides `eh`, the
            // node's own or another (a walk of the slot's other names; engines name
            // a block once, so this is rare).
            let names = &self.engine[slot.0 as usize];
            let own = self.node(node).engine();
            let own_named = own != eh
                && names
                    .get(own, &self.chunks)
                    .is_some_and(|r| self.resolve(slot, r) == Some(node));
            let first: Vec<EngineHash> = own_named
                .then_some(own)
                .into_iter()
                .chain(
                    names
                        .other
                        .iter()
                        .filter(|e| e.key() != eh && self.resolve(slot, e.node()) == Some(node))
                        .map(Keyed::key),
                )
                .collect();
            self.aliases.insert((slot, node), first);
        }
        self.aliases.entry((slot, node)).or_default().push(eh);
    }

    /// Every (slot, sequence hash, engine hash) the engine maps hold for blocks
    /// their slots still hold (the tests' plain form of [`Self::engine_names`]).
    #[cfg(test)]
    pub(super) fn engine_hashes(&self, out: &mut Vec<(WorkerSlot, SeqHash, EngineHash)>) {
        let mut path = Vec::new();
        for (i, map) in self.engine.iter().enumerate() {
            let slot = WorkerSlot(i as u32);
            for (eh, reference) in map.part(0, 0, &self.chunks) {
                if let Some(id) = self.resolve(slot, reference) {
                    out.push((slot, self.seq_of(id, &mut path), eh));
                }
            }
        }
    }

    /// Every (slot, node, engine hash) by which the slots name the blocks they
    /// hold, in one go (see [`Self::engine_names_part`]).
    pub fn engine_names(&self, out: &mut Vec<(WorkerSlot, u32, EngineHash)>) {
        for i in 0..self.engine_slots() {
            let slot = WorkerSlot(i as u32);
            let bits = self.engine_part_bits(slot);
            for part in 0..1 << bits {
                self.engine_names_part(slot, part, bits, out);
            }
        }
    }

    /// Slots with an engine map (a slot's is at index `slot`).
    pub fn engine_slots(&self) -> usize {
        self.engine.len()
    }

    /// How many bits [`Self::engine_names_part`] splits `slot`'s map by: enough
    /// that a part is one of its segments, so no part holds the executor long.
    pub fn engine_part_bits(&self, slot: WorkerSlot) -> u32 {
        self.engine
            .get(slot.0 as usize)
            .and_then(Names::part_bits)
            .unwrap_or(0)
            .min(ENGINE_PART_BITS_MAX)
    }

    /// (slot, node, engine hash) of the entries of part `part` of `1 << bits` of
    /// `slot`'s engine map that name a block the slot holds: with an export's nodes
    /// ([`ExportedBlock::node`]), how each worker names each block it holds. The
    /// parts together pass every entry filed throughout once, however the map
    /// changes between them.
    pub fn engine_names_part(
        &self,
        slot: WorkerSlot,
        part: usize,
        bits: u32,
        out: &mut Vec<(WorkerSlot, u32, EngineHash)>,
    ) {
        if let Some(map) = self.engine.get(slot.0 as usize) {
            out.extend(
                map.part(part, bits, &self.chunks)
                    .filter_map(|(eh, r)| Some((slot, self.resolve(slot, r)?.index(), eh))),
            );
        }
    }

    /// Heap bytes of the engine maps (part of [`Self::heap_bytes`]).
    pub fn engine_heap_bytes(&self) -> usize {
        self.engine
            .iter()
            .map(Names::allocation_size)
            .sum::<usize>()
    }
}
