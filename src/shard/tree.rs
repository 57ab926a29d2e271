//! A radix index of cached blocks: a prefix tree in an arena, and per worker slot
//! the map from the engine's block hashes to the tree's nodes.
//!
//! A node is one block: its local hash, the engine hash it was first stored under,
//! its parent, its child and its holders (28 bytes). A parent of one child names
//! it; a parent of more keeps them in a child table, found by local hash (a branch
//! is rare: a prompt's blocks form one chain, so branching is where prompts part).
//! A chain of blocks is filed by appends to the arena and walks from nodes that
//! are already in cache, and a sequence hash is never stored: it is computed on
//! the way down ([`Tree::dump`], [`Tree::lookup`] by sequence hash). A store
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
//! Owned by one shard; never shared, never blocks; a store, removal or lookup
//! allocates only as the arena and tables grow.

use super::holders::{Holder, HolderSet, HolderSlab};
use super::predict::{Predicted, PredictedBlock, Predictions, Tick};
use super::table::{self, BlockTable, Cursor, Filed, Keyed};
use super::{DumpedBlock, Prompt, SAME_HOLDERS};
use crate::hash;
use crate::types::{BlockHash, EngineHash, SeqHash, Tier, TierSet, WorkerSlot};
use hashbrown::{HashMap, HashTable};

/// No node: a root's parent, a leaf's child, the end of the free list.
const NIL: u32 = u32::MAX;
/// In `first_child`: the children (two or more) are in the parent's child table.
const WIDE: u32 = u32::MAX - 1;
/// A parent, for a node on the free list.
const FREE: u32 = u32::MAX - 1;
/// Node ids fit in 28 bits (268M nodes an index shard); the top 4 bits of a
/// reference to a node, and of the node's `up` word, are its generation, which
/// changes each time the node stops holding anything: a reference taken before
/// names nothing once it does.
const ID_BITS: u32 = 28;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
const NIL_UP: u32 = ID_MASK;
const FREE_UP: u32 = ID_MASK - 1;
/// How many blocks of a run ahead a store loads the engine map's buckets: the
/// tree work of a few blocks covers one miss.
const PREFETCH_AHEAD: usize = 4;
/// Nodes per arena chunk: the arena grows a chunk at a time, never copying.
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;
/// An export reads a slot's engine map in at most `1 << ENGINE_PART_BITS_MAX`
/// parts.
const ENGINE_PART_BITS_MAX: u32 = 12;
/// Leaves an eviction compares, the least recently used of which goes.
const EVICT_SAMPLE: usize = 16;

/// One block. The hashes are two halves each so that a node is 4-byte aligned:
/// 28 bytes.
#[derive(Clone, Copy, Debug)]
struct Node {
    local: [u32; 2],
    /// The engine hash the block was stored under while no slot held it on a
    /// medium: the key of the slots' 4-byte names for it ([`Named`]).
    engine: [u32; 2],
    /// Generation (top 4 bits) and parent (NIL_UP: a root, FREE_UP: on the free
    /// list).
    up: u32,
    /// NIL, the one child, or WIDE; on the free list, the next free node.
    first_child: u32,
    holders: HolderSet,
}

const _: () = assert!(std::mem::size_of::<Node>() == 28);

impl Node {
    #[inline]
    fn local(&self) -> BlockHash {
        BlockHash(self.local[0] as u64 | (self.local[1] as u64) << 32)
    }

    #[inline]
    fn engine(&self) -> EngineHash {
        EngineHash(self.engine[0] as u64 | (self.engine[1] as u64) << 32)
    }

    fn set_engine(&mut self, eh: EngineHash) {
        self.engine = [eh.0 as u32, (eh.0 >> 32) as u32];
    }

    /// The parent's id: NIL for a root, FREE for a node on the free list.
    #[inline]
    fn parent(&self) -> u32 {
        match self.up & ID_MASK {
            NIL_UP => NIL,
            FREE_UP => FREE,
            p => p,
        }
    }

    fn set_parent(&mut self, parent: u32) {
        let p = match parent {
            NIL => NIL_UP,
            FREE => FREE_UP,
            p => p,
        };
        self.up = (self.up & !ID_MASK) | p;
    }

    /// References taken so far name nothing any more.
    fn next_generation(&mut self) {
        self.up = self.up.wrapping_add(1 << ID_BITS);
    }

    /// A reference to this node, which is `id`, as it is now.
    fn reference(&self, id: u32) -> u32 {
        (self.up & !ID_MASK) | id
    }

    /// Whether `reference` (taken by `slot`) still names this node: the same
    /// generation, not freed, and the slot holds it.
    fn named_by(&self, reference: u32, slot: WorkerSlot, slab: &HolderSlab) -> bool {
        self.reference(reference & ID_MASK) == reference
            && self.parent() != FREE
            && !self.holders.tiers_of(slot, slab).is_empty()
    }
}

/// A name of a block that is its node's own engine hash: a reference to the node
/// (generation and id), whose `engine` is the key.
#[derive(Clone, Copy)]
struct Named(u32);

impl Filed for Named {
    type Key = EngineHash;
    type Ctx = [Vec<Node>];
    #[inline]
    fn key_in(&self, chunks: &[Vec<Node>]) -> EngineHash {
        at(chunks, self.0 & ID_MASK).engine()
    }
    #[inline]
    fn prefetch_key(&self, chunks: &[Vec<Node>]) {
        table::prefetch(std::ptr::from_ref(&at(chunks, self.0 & ID_MASK).engine) as usize);
    }
}

/// An engine hash and the node it names: 12 bytes (three halves, 4-byte aligned).
#[derive(Clone, Copy)]
struct EngineEntry([u32; 3]);

impl EngineEntry {
    fn new(eh: EngineHash, node: u32) -> Self {
        EngineEntry([eh.0 as u32, (eh.0 >> 32) as u32, node])
    }
    /// A reference to the node (generation and id).
    fn node(&self) -> u32 {
        self.0[2]
    }
}

impl Keyed for EngineEntry {
    type Key = EngineHash;
    #[inline]
    fn key(&self) -> EngineHash {
        EngineHash(self.0[0] as u64 | (self.0[1] as u64) << 32)
    }
}

/// One slot's engine map: engine hash → a reference to a node. A hash is in at
/// most one of the two tables.
#[derive(Default)]
struct Names {
    /// Names that are their node's `engine`.
    own: BlockTable<Named>,
    /// Other names.
    other: BlockTable<EngineEntry>,
}

/// Where a walk of a slot's engine map in steps has got to: its own names, then
/// the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamesAt {
    own: Cursor,
    other: Cursor,
}

impl NamesAt {
    pub fn is_done(&self) -> bool {
        self.other.is_done()
    }

    /// A walk with nothing left to walk.
    fn done() -> Self {
        NamesAt {
            own: Cursor::done(),
            other: Cursor::done(),
        }
    }
}

impl Names {
    /// The reference `eh` names (checked by the caller: it may name nothing now).
    #[inline]
    fn get(&self, eh: EngineHash, chunks: &[Vec<Node>]) -> Option<u32> {
        match self.other.get(&eh) {
            Some(e) => Some(e.node()),
            None => self.own.get_in(&eh, chunks).map(|n| n.0),
        }
    }

    /// Files `eh` as a name of `reference`; returns what `eh` named before.
    #[inline]
    fn set(&mut self, eh: EngineHash, reference: u32, chunks: &[Vec<Node>]) -> Option<u32> {
        if at(chunks, reference & ID_MASK).engine() == eh {
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

    fn remove(&mut self, eh: EngineHash, chunks: &[Vec<Node>]) {
        if self.own.remove_in(&eh, chunks).is_none() {
            self.other.remove(&eh);
        }
    }

    /// Takes `eh` out if it names node `id` (any generation).
    fn forget(&mut self, eh: EngineHash, id: u32, chunks: &[Vec<Node>]) {
        if self.get(eh, chunks).is_some_and(|r| r & ID_MASK == id) {
            self.remove(eh, chunks);
        }
    }

    #[inline]
    fn prefetch(&self, eh: EngineHash) {
        self.own.prefetch(eh);
    }

    /// (engine hash, reference) of every name in part `part` of `1 << bits`.
    fn part<'a>(
        &'a self,
        part: usize,
        bits: u32,
        chunks: &'a [Vec<Node>],
    ) -> impl Iterator<Item = (EngineHash, u32)> + 'a {
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

/// The table hash of a child by its local hash: XXH3 output already, so one
/// multiply spreads it over hashbrown's control bits.
#[inline]
fn child_hash(local: BlockHash) -> u64 {
    local.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A block as a prediction names it: its node, and the low half of its local hash
/// so that a prediction left behind by a clear never ends another block's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeKey {
    id: u32,
    check: u32,
}

impl PredictedBlock for NodeKey {
    fn to_bits(self) -> u64 {
        self.id as u64 | (self.check as u64) << 32
    }
    fn from_bits(bits: u64) -> Self {
        NodeKey {
            id: bits as u32,
            check: (bits >> 32) as u32,
        }
    }
}

/// What a prediction did, for the shard's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PredictCounts {
    pub created: usize,
    pub refreshed: usize,
}

/// A block of a peer's dump as one slot holds it (see [`Tree::seed`]).
#[derive(Clone, Copy, Debug)]
pub struct Seed {
    pub slot: WorkerSlot,
    pub tier: Tier,
    /// The slot's engine hash for the block.
    pub engine: EngineHash,
    pub local: BlockHash,
    /// The slot's engine hash for the parent, if the dump names one.
    pub parent_engine: Option<EngineHash>,
    /// The parent's sequence hash; `None` for a first block.
    pub parent_seq: Option<SeqHash>,
}

/// What a store did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The blocks are filed; `new_holders` of them were not held by the slot before,
    /// `confirmed` of them were predicted (now ordinary holders). The last
    /// `unfiled` were not filed: the arena holds as many nodes as ids can name.
    Filed {
        new_holders: usize,
        confirmed: usize,
        unfiled: usize,
    },
    /// The parent's engine hash names no block of the slot: nothing was filed.
    UnknownParent,
}

/// Where a dump in steps ([`Tree::dump_step`]) has got to; the default starts one.
#[derive(Clone, Debug, Default)]
pub struct DumpWalk {
    /// Per level of the depth-first walk (children in local-hash order), the last
    /// block passed, if any: local hashes stay valid while nodes come and go.
    at: Vec<Option<BlockHash>>,
    /// The roots as the walk found them, sorted by local hash once (a tree may have
    /// a root per conversation): each is checked to be that root still when its
    /// turn comes, and a root filed since is not seen.
    roots: Vec<u32>,
    root_locals: Vec<BlockHash>,
    started: bool,
    done: bool,
}

/// One level of a dump's walk: the children of a block (sorted by local hash, in
/// `Walking::kids[start..end]`), the next to visit, and their parent's sequence
/// hash.
struct Frame {
    seq: Option<SeqHash>,
    start: usize,
    end: usize,
    next: usize,
}

/// A dump step's depth-first stack: the levels' children in one buffer, each
/// level's above the next's (a level ends by truncating the buffer to its start).
#[derive(Default)]
struct Walking {
    frames: Vec<Frame>,
    kids: Vec<u32>,
}

impl Walking {
    /// Pushes a level below the roots: `id`'s children, sorted by local hash.
    fn push(&mut self, tree: &Tree, id: u32, seq: Option<SeqHash>) {
        let start = self.kids.len();
        tree.children(id, &mut self.kids);
        self.kids[start..].sort_unstable_by_key(|&k| tree.node(k).local().0);
        let end = self.kids.len();
        self.frames.push(Frame {
            seq,
            start,
            end,
            next: start,
        });
    }

    fn pop(&mut self) {
        if let Some(f) = self.frames.pop() {
            self.kids.truncate(f.start);
        }
    }
}

/// The radix index of one (model, tenant) index's blocks in one shard.
#[derive(Default)]
pub struct Tree {
    chunks: Vec<Vec<Node>>,
    /// Head of the free list through `first_child`.
    free: Option<u32>,
    live: usize,
    /// First blocks, by local hash.
    roots: HashTable<u32>,
    /// Child tables of parents with more than one child.
    wide: HashMap<u32, HashTable<u32>>,
    slab: HolderSlab,
    /// Per slot, engine hash → node.
    engine: Vec<Names>,
    /// (slot, node) pairs that a second engine hash of the slot names (an engine that
    /// files the same content under two hashes): every engine hash of such a pair is
    /// listed, so that all go when the slot stops holding the node. Usually empty.
    aliases: HashMap<(u32, u32), Vec<EngineHash>>,
    /// Blocks held per slot (any tier).
    per_slot: Vec<u32>,
    /// Nodes whose hold a clear step ended (scratch, empty between calls).
    ended: Vec<u32>,
    /// An evicted block's holders (scratch).
    scratch: Vec<u32>,
    /// Deadlines of the predicted holders (empty unless a router predicted).
    predictions: Predictions<NodeKey>,
    /// (block, holder) pairs per tier bit.
    pairs: [u64; Tier::COUNT],
    /// A bounded index's last use per node id: the `clock` of the store,
    /// prediction or match that last touched it. Empty unless tracking.
    used: Vec<u32>,
    /// Ticks once per store run, prediction and lookup (wrapping: ages are
    /// compared as differences).
    clock: u32,
    tracking: bool,
    /// Where the eviction hand is, as a node id.
    hand: u32,
    /// At most this many nodes (`None`: as many as ids can name); tests set less.
    node_limit: Option<u32>,
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
        &self.per_slot
    }

    /// (block, holder) pairs per tier; [`Tier::PREDICTED`]'s are the live predictions.
    pub fn tier_pairs(&self) -> &[u64; Tier::COUNT] {
        &self.pairs
    }

    fn uncount(&mut self, removed: TierSet) {
        for t in removed.iter() {
            self.pairs[t.0 as usize] -= 1;
        }
    }

    fn key(&self, id: u32) -> NodeKey {
        NodeKey {
            id,
            check: self.node(id).local[0],
        }
    }

    #[inline]
    fn node(&self, id: u32) -> &Node {
        at(&self.chunks, id)
    }

    #[inline]
    fn node_mut(&mut self, id: u32) -> &mut Node {
        at_mut(&mut self.chunks, id)
    }

    /// Files `node` (whose generation is ignored) and returns its id; `None` once
    /// the arena holds as many nodes as ids can name.
    fn alloc(&mut self, mut node: Node) -> Option<u32> {
        if let Some(id) = self.free {
            self.live += 1;
            let old = self.node(id);
            let next = old.first_child;
            node.up = (old.up & !ID_MASK) | (node.up & ID_MASK);
            self.free = (next != NIL).then_some(next);
            *self.node_mut(id) = node;
            return Some(id);
        }
        let filed = self.filed();
        if filed >= self.node_limit.unwrap_or(FREE_UP) as usize {
            return None;
        }
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let id = filed as u32;
        node.up &= ID_MASK;
        self.chunks.last_mut()?.push(node);
        self.live += 1;
        Some(id)
    }

    /// Nodes the arena has handed out (free or not): every chunk but the last is
    /// full.
    fn filed(&self) -> usize {
        self.chunks
            .last()
            .map_or(0, |c| ((self.chunks.len() - 1) << CHUNK_BITS) + c.len())
    }

    fn count(&mut self, slot: WorkerSlot, delta: i32) {
        let i = slot.0 as usize;
        if self.per_slot.len() <= i {
            self.per_slot.resize(i + 1, 0);
        }
        self.per_slot[i] = self.per_slot[i].wrapping_add_signed(delta);
    }

    /// The child of `parent` (NIL: a first block) with local hash `local`.
    #[inline]
    fn child(&self, parent: u32, local: BlockHash) -> Option<u32> {
        if parent == NIL {
            return self
                .roots
                .find(child_hash(local), |&c| self.node(c).local() == local)
                .copied();
        }
        match self.node(parent).first_child {
            NIL => None,
            WIDE => self.wide[&parent]
                .find(child_hash(local), |&c| self.node(c).local() == local)
                .copied(),
            c => (self.node(c).local() == local).then_some(c),
        }
    }

    /// The child of `parent` with local hash `local`, filed if new with `engine` as
    /// its engine hash (`None`: new, and the arena is full).
    fn child_or_insert(
        &mut self,
        parent: u32,
        local: BlockHash,
        engine: EngineHash,
    ) -> Option<u32> {
        if let Some(c) = self.child(parent, local) {
            return Some(c);
        }
        let first = if parent == NIL {
            NIL
        } else {
            self.node(parent).first_child
        };
        let mut node = Node {
            local: [local.0 as u32, (local.0 >> 32) as u32],
            engine: [engine.0 as u32, (engine.0 >> 32) as u32],
            up: 0,
            first_child: NIL,
            holders: HolderSet::default(),
        };
        node.set_parent(parent);
        let id = self.alloc(node)?;
        if parent == NIL {
            let Tree { roots, chunks, .. } = self;
            roots.insert_unique(child_hash(local), id, |&c| {
                child_hash(at(chunks, c).local())
            });
        } else if first == NIL {
            self.node_mut(parent).first_child = id;
        } else {
            if first != WIDE {
                self.widen(parent);
            }
            let Tree { wide, chunks, .. } = self;
            let table = wide
                .get_mut(&parent)
                .expect("a wide parent has a child table");
            table.insert_unique(child_hash(local), id, |&c| {
                child_hash(at(chunks, c).local())
            });
        }
        Some(id)
    }

    /// Moves `parent`'s one child into a child table, for a second to join.
    fn widen(&mut self, parent: u32) {
        let mut table = HashTable::with_capacity(2);
        let c = self.node(parent).first_child;
        let chunks = &self.chunks;
        table.insert_unique(child_hash(at(chunks, c).local()), c, |&x| {
            child_hash(at(chunks, x).local())
        });
        self.node_mut(parent).first_child = WIDE;
        self.wide.insert(parent, table);
    }

    /// Takes `id` out of its parent's children and frees it; then its parent too if
    /// that held nothing and has no children left.
    fn release(&mut self, mut id: u32) {
        loop {
            let n = *self.node(id);
            debug_assert!(n.holders.is_empty() && n.first_child == NIL);
            let parent = n.parent();
            let h = child_hash(n.local());
            if parent == NIL {
                let found = self.roots.find_entry(h, |&c| c == id);
                found.expect("a root is in the root table").remove();
            } else {
                let first = self.node(parent).first_child;
                if first == WIDE {
                    let table = self
                        .wide
                        .get_mut(&parent)
                        .expect("a wide parent has a child table");
                    table
                        .find_entry(h, |&c| c == id)
                        .expect("a child is in its table")
                        .remove();
                    if table.is_empty() {
                        self.wide.remove(&parent);
                        self.node_mut(parent).first_child = NIL;
                    }
                } else {
                    debug_assert_eq!(first, id, "a parent of one child names it");
                    self.node_mut(parent).first_child = NIL;
                }
            }
            let free = self.free.unwrap_or(NIL);
            let node = self.node_mut(id);
            node.set_parent(FREE);
            node.next_generation();
            node.first_child = free;
            self.free = Some(id);
            self.live -= 1;
            if parent == NIL {
                return;
            }
            let p = self.node(parent);
            if !p.holders.is_empty() || p.first_child != NIL {
                return;
            }
            id = parent;
        }
    }

    fn engine_map(&mut self, slot: WorkerSlot) -> &mut Names {
        let i = slot.0 as usize;
        if self.engine.len() <= i {
            self.engine.resize_with(i + 1, Names::default);
        }
        &mut self.engine[i]
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
            None => NIL,
            Some(eh) => match self.named(slot, eh) {
                Some(id) => id,
                None => return Stored::UnknownParent,
            },
        };
        self.file_run(slot, tier, p, blocks)
    }

    /// Files `blocks` as a store does, the first a child of node `p` (NIL: a root).
    fn file_run(
        &mut self,
        slot: WorkerSlot,
        tier: Tier,
        mut p: u32,
        blocks: &[(EngineHash, BlockHash)],
    ) -> Stored {
        self.tick();
        let (mut new_holders, mut confirmed, mut unfiled) = (0, 0, 0);
        let map = self.engine_map(slot);
        for &(eh, _) in blocks.iter().take(PREFETCH_AHEAD) {
            map.prefetch(eh);
        }
        for (i, &(eh, local)) in blocks.iter().enumerate() {
            if let Some(&(ahead, _)) = blocks.get(i + PREFETCH_AHEAD) {
                self.engine[slot.0 as usize].prefetch(ahead);
            }
            let Some(id) = self.child_or_insert(p, local, eh) else {
                unfiled = blocks.len() - i;
                break;
            };
            self.mark(id);
            let before = {
                let Tree { chunks, slab, .. } = self;
                let n = at_mut(chunks, id);
                if !n.holders.on_media(slab) {
                    // No slot names it by its engine hash: it may take this one.
                    n.set_engine(eh);
                }
                n.holders.add(slot, tier, slab)
            };
            if before.is_empty() {
                new_holders += 1;
                self.count(slot, 1);
            }
            if !before.contains(tier) {
                self.pairs[tier.0 as usize] += 1;
            }
            if before.contains(Tier::PREDICTED) {
                // The worker stored what it was predicted to: an ordinary holder now.
                let Tree { chunks, slab, .. } = self;
                at_mut(chunks, id)
                    .holders
                    .remove(slot, Tier::PREDICTED.bit(), slab);
                let key = self.key(id);
                self.predictions.forget(key, slot);
                self.pairs[Tier::PREDICTED.0 as usize] -= 1;
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
            match old {
                Some(old) if old == id => {}
                // The engine reused the hash for other content: the slot's hold on
                // the old block ends with it.
                Some(old) => self.unhold(slot, old, TierSet::ALL, Some(eh)),
                // New, or naming a block that is no more.
                None => {
                    if !(before & TierSet::MEDIA).is_empty() {
                        // The slot already held this block under another engine hash
                        // (a prediction it confirms has none).
                        self.alias(slot, id, eh);
                    }
                }
            }
            p = id;
        }
        Stored::Filed {
            new_holders,
            confirmed,
            unfiled,
        }
    }

    /// The node `slot`'s engine hash `eh` names, if it names one the slot holds.
    fn named(&self, slot: WorkerSlot, eh: EngineHash) -> Option<u32> {
        let reference = self.engine.get(slot.0 as usize)?.get(eh, &self.chunks)?;
        self.resolve(slot, reference)
    }

    /// The node a reference names, if it is still that node (same generation) and
    /// `slot` holds it.
    fn resolve(&self, slot: WorkerSlot, reference: u32) -> Option<u32> {
        let id = reference & ID_MASK;
        self.node(id)
            .named_by(reference, slot, &self.slab)
            .then_some(id)
    }

    /// Records a second engine hash of `slot` for `node`.
    fn alias(&mut self, slot: WorkerSlot, node: u32, eh: EngineHash) {
        if !self.aliases.contains_key(&(slot.0, node)) {
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
            self.aliases.insert((slot.0, node), first);
        }
        self.aliases.entry((slot.0, node)).or_default().push(eh);
    }

    /// Once nothing is filed (every slot cleared), gives the arena's chunks and
    /// the tables back, so that memory a burst grew goes back to the allocator;
    /// a tree in use keeps its chunks (freed nodes are reused).
    pub fn shrink_if_empty(&mut self) {
        if self.live != 0 || !self.predictions.is_empty() || self.chunks.is_empty() {
            return;
        }
        *self = Tree {
            tracking: self.tracking,
            node_limit: self.node_limit,
            ..Tree::default()
        };
    }

    /// From now on, note which blocks are stored, predicted or matched, so that
    /// [`Self::evict`] can pick one that was not lately.
    pub fn track_use(&mut self) {
        self.tracking = true;
    }

    /// A store, prediction or match of `id` now.
    #[inline]
    fn mark(&mut self, id: u32) {
        if self.tracking {
            let i = id as usize;
            if self.used.len() <= i {
                self.used.resize((i + 1).next_power_of_two(), 0);
            }
            self.used[i] = self.clock;
        }
    }

    /// A new store run, prediction or lookup: what it touches is newer than
    /// anything before.
    #[inline]
    fn tick(&mut self) {
        if self.tracking {
            self.clock = self.clock.wrapping_add(1);
        }
    }

    /// Evicts the block least recently stored, predicted or matched among the
    /// next [`EVICT_SAMPLE`] leaves from the eviction hand (a sampled LRU over the
    /// arena), with every holder: only blocks nothing hangs from, so the memory is
    /// freed (a parent becomes one once its children go). Its engine hashes are
    /// left to name nothing (their references are of an older generation).
    /// Returns the (block, holder) pairs evicted, or `None` if nothing can be.
    pub fn evict(&mut self) -> Option<usize> {
        let id = self.next_victim()?;
        Some(self.evict_node(id))
    }

    /// The oldest of the next [`EVICT_SAMPLE`] leaves from the hand (one lap at
    /// most); the hand moves on to just past it, so the leaves it passed over are
    /// sampled again by the next eviction.
    fn next_victim(&mut self) -> Option<u32> {
        let end = self.filed() as u32;
        if end == 0 {
            return None;
        }
        let (mut best, mut best_age, mut seen) = (None, 0u32, 0);
        let mut id = self.hand.min(end - 1);
        for _ in 0..end {
            let n = self.node(id);
            if n.parent() != FREE && n.first_child == NIL {
                let last = self.used.get(id as usize).copied().unwrap_or(0);
                let age = self.clock.wrapping_sub(last);
                if best.is_none() || age > best_age {
                    (best, best_age) = (Some(id), age);
                }
                seen += 1;
                if seen == EVICT_SAMPLE {
                    break;
                }
            }
            id = if id + 1 >= end { 0 } else { id + 1 };
        }
        let victim = best?;
        self.hand = if victim + 1 >= end { 0 } else { victim + 1 };
        Some(victim)
    }

    fn evict_node(&mut self, id: u32) -> usize {
        let mut holders = std::mem::take(&mut self.scratch);
        holders.clear();
        holders.extend_from_slice(self.node(id).holders.as_slice(&self.slab));
        for &h in &holders {
            let h = Holder(h);
            self.count(h.slot(), -1);
            self.uncount(h.tiers());
            if h.has(Tier::PREDICTED) {
                let key = self.key(id);
                self.predictions.forget(key, h.slot());
            }
            // The 4-byte name goes (its key is the node's, which a reuse changes);
            // other names are left to name nothing.
            let eh = self.node(id).engine();
            let Tree { engine, chunks, .. } = self;
            if let Some(names) = engine.get_mut(h.slot().0 as usize) {
                names.forget(eh, id, chunks);
            }
            self.aliases.remove(&(h.slot().0, id));
        }
        let Tree { chunks, slab, .. } = self;
        at_mut(chunks, id).holders.free(slab);
        self.emptied(id);
        let n = holders.len();
        self.scratch = holders;
        n
    }

    /// `id` holds nothing any more: references taken to it end, and it goes if
    /// nothing hangs from it.
    fn emptied(&mut self, id: u32) {
        if self.node(id).first_child == NIL {
            self.release(id);
        } else {
            self.node_mut(id).next_generation();
        }
    }

    /// Takes `tiers` off `slot`'s holder of `node`; if the slot holds it no more, its
    /// engine hashes for it go (but `keep`, already re-pointed by the caller), and
    /// the node goes if nothing else holds it or hangs from it.
    fn unhold(&mut self, slot: WorkerSlot, node: u32, tiers: TierSet, keep: Option<EngineHash>) {
        let (removed, gone) = {
            let Tree { chunks, slab, .. } = self;
            at_mut(chunks, node).holders.remove(slot, tiers, slab)
        };
        self.uncount(removed);
        if !gone {
            return;
        }
        self.count(slot, -1);
        if let Some(names) = self.aliases.remove(&(slot.0, node)) {
            let Tree { engine, chunks, .. } = self;
            forget_names(&mut engine[slot.0 as usize], names, node, keep, chunks);
        }
        if self.node(node).holders.is_empty() {
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
        let left = self
            .node(node)
            .holders
            .tiers_of(slot, &self.slab)
            .without(tiers);
        if left.is_empty() {
            let Tree { engine, chunks, .. } = self;
            engine[slot.0 as usize].remove(eh, chunks);
        }
        self.unhold(slot, node, tiers, Some(eh));
        true
    }

    /// `slot` holds nothing any more on `tiers`, in one go.
    pub fn clear_slot(&mut self, slot: WorkerSlot, tiers: TierSet) {
        let mut at = NamesAt::default();
        while !self.clear_step(slot, tiers, &mut at, usize::MAX) {}
    }

    /// A step of clearing `tiers` of `slot`: a walk of at most `budget` buckets of
    /// the slot's engine map from `at` (the whole index is never walked, only the
    /// slot's own blocks). Other changes may come between steps; a store of the
    /// cleared tiers before the walk is done may or may not be cleared with them.
    /// Returns whether the walk is done.
    pub fn clear_step(
        &mut self,
        slot: WorkerSlot,
        tiers: TierSet,
        at: &mut NamesAt,
        budget: usize,
    ) -> bool {
        if slot.0 as usize >= self.engine.len() {
            // Nothing stored: what the slot holds, if anything, is predicted.
            *at = NamesAt::done();
        }
        let mut map = std::mem::take(self.engine_map(slot));
        let mut ended = std::mem::take(&mut self.ended);
        let mut removed = [0u64; Tier::COUNT];
        {
            let Tree { chunks, slab, .. } = self;
            // Whether the slot still holds the block `reference` names once its
            // `tiers` are taken off (the name then stays).
            let mut keep = |chunks: &mut [Vec<Node>], reference: u32| {
                let id = reference & ID_MASK;
                let n = at_mut(chunks, id);
                if !n.named_by(reference, slot, slab) {
                    // It names a block evicted since, or an alias of one whose hold
                    // ended earlier in the walk.
                    return false;
                }
                let (gone_tiers, gone) = n.holders.remove(slot, tiers, slab);
                for t in gone_tiers.iter() {
                    removed[t.0 as usize] += 1;
                }
                if gone {
                    ended.push(id);
                }
                !gone
            };
            // The own names first (the node's key does not change while its holds
            // are taken off), a step at a time; then the others.
            if !at.own.is_done() {
                map.own
                    .retain_step_in(&mut at.own, budget, chunks, |c, n| keep(c, n.0));
            } else {
                map.other
                    .retain_step(&mut at.other, budget, |e| keep(chunks, e.node()));
            }
        }
        for (pairs, removed) in self.pairs.iter_mut().zip(removed) {
            *pairs -= removed;
        }
        for &node in &ended {
            self.count(slot, -1);
            if let Some(names) = self.aliases.remove(&(slot.0, node)) {
                forget_names(&mut map, names, node, None, &self.chunks);
            }
            // A node whose child went before it may have gone with that child.
            let n = self.node(node);
            if n.parent() != FREE && n.holders.is_empty() {
                self.emptied(node);
            }
        }
        ended.clear();
        self.ended = ended;
        self.engine[slot.0 as usize] = map;
        if at.is_done() && tiers.contains(Tier::PREDICTED) {
            // Predicted holders have no engine hash: the slot's predictions end here.
            self.end_predictions(|p, end| p.end_slot(slot, end));
        }
        at.is_done()
    }

    /// `slot` is expected to hold the prompt's blocks `locals` (from its first) on
    /// the device until `deadline`: they count as held there until then, or until a
    /// store of the block by the slot confirms it. Blocks the slot holds already
    /// stay as they are.
    pub fn predict(
        &mut self,
        slot: WorkerSlot,
        locals: &[BlockHash],
        deadline: Tick,
    ) -> PredictCounts {
        self.tick();
        let mut counts = PredictCounts::default();
        let mut p = NIL;
        for &local in locals {
            let Some(id) = self.child_or_insert(p, local, EngineHash(0)) else {
                break;
            };
            self.mark(id);
            p = id;
            let tiers = self.node(id).holders.tiers_of(slot, &self.slab);
            if !(tiers & TierSet::MEDIA).is_empty() {
                continue;
            }
            if tiers.is_empty() {
                let Tree { chunks, slab, .. } = self;
                at_mut(chunks, id).holders.add(slot, Tier::PREDICTED, slab);
                self.count(slot, 1);
                self.pairs[Tier::PREDICTED.0 as usize] += 1;
            }
            let key = self.key(id);
            match self.predictions.predict(key, slot, deadline) {
                Predicted::Created => counts.created += 1,
                Predicted::Refreshed => counts.refreshed += 1,
            }
        }
        counts
    }

    /// Ends the predictions due at or before `now`; returns how many ended.
    pub fn expire(&mut self, now: Tick) -> usize {
        self.end_predictions(|p, end| p.expire(now, end))
    }

    /// Ends `n` predictions early, those due soonest first (approximate mode's
    /// pruning); returns how many ended.
    pub fn prune(&mut self, n: usize) -> usize {
        self.end_predictions(|p, end| p.prune(n, end))
    }

    /// Ends the predictions `pick` hands to the function it is given; returns how
    /// many ended (a pair whose block went meanwhile has nothing to end).
    fn end_predictions(
        &mut self,
        pick: impl FnOnce(&mut Predictions<NodeKey>, &mut dyn FnMut(NodeKey, WorkerSlot)),
    ) -> usize {
        let mut predictions = std::mem::take(&mut self.predictions);
        let mut ended = 0;
        pick(&mut predictions, &mut |key, slot| {
            ended += self.unpredict(key, slot) as usize
        });
        self.predictions = predictions;
        ended
    }

    pub fn has_predictions(&self) -> bool {
        !self.predictions.is_empty()
    }

    /// Takes the predicted bit off `slot`'s holder of the block `key` names, if it
    /// is still that block and still predicted; the node goes once nothing holds it
    /// or hangs from it. Returns whether the bit was there.
    fn unpredict(&mut self, key: NodeKey, slot: WorkerSlot) -> bool {
        let Some(n) = self
            .chunks
            .get((key.id >> CHUNK_BITS) as usize)
            .and_then(|c| c.get(key.id as usize & (CHUNK - 1)))
        else {
            return false;
        };
        if n.parent() == FREE
            || n.local[0] != key.check
            || !n
                .holders
                .tiers_of(slot, &self.slab)
                .contains(Tier::PREDICTED)
        {
            return false;
        }
        self.unhold(slot, key.id, Tier::PREDICTED.bit(), None);
        true
    }

    /// Holders of the prompt's blocks (in prefix order) as `[n, holder..]` per
    /// block, or [`SAME_HOLDERS`] for a block held exactly as the block before it
    /// (a shared prefix: the gather passes it in one step), up to and including
    /// the first block nobody holds. Blocks named by sequence hash are found by
    /// computing each candidate child's chain link. A match counts as a use of
    /// the block for a bounded index's eviction.
    pub fn lookup(&mut self, prompt: Prompt<'_>, out: &mut Vec<u32>) {
        match prompt {
            Prompt::Locals(l) => self.walk(l.len(), |t, p, i| t.child(p, l[i]), out),
            Prompt::Seqs(s) => self.walk(
                s.len(),
                |t, p, i| t.child_by_seq(p, i.checked_sub(1).map(|j| s[j]), s[i]),
                out,
            ),
        }
    }

    /// The lookups' walk down `n` blocks: `find(tree, parent, i)` is the `i`th.
    fn walk(
        &mut self,
        n: usize,
        find: impl Fn(&Self, u32, usize) -> Option<u32>,
        out: &mut Vec<u32>,
    ) {
        self.tick();
        let mut p = NIL;
        // Where the last holder list written is in `out`.
        let mut last = 0..0;
        for i in 0..n {
            let Some(id) = find(self, p, i) else {
                out.push(0);
                return;
            };
            self.mark(id);
            let hs = self.node(id).holders.as_slice(&self.slab);
            if hs.len() > 1 && self.predictions.is_empty() && out.get(last.clone()) == Some(hs) {
                out.push(SAME_HOLDERS);
                p = id;
                continue;
            }
            out.push(hs.len() as u32);
            let at = out.len();
            if self.predictions.is_empty() {
                out.extend_from_slice(hs);
            } else {
                // Scorers see a prediction as the device tier it stands for.
                out.extend(hs.iter().map(|&h| Holder(h).as_scored().0));
            }
            if hs.is_empty() {
                return;
            }
            last = at..out.len();
            p = id;
        }
    }

    /// The child of `p` (whose sequence hash is `parent`) with sequence hash `seq`:
    /// every candidate's chain link is computed, since a node keeps only its local
    /// hash.
    fn child_by_seq(&self, p: u32, parent: Option<SeqHash>, seq: SeqHash) -> Option<u32> {
        if p == NIL {
            // A first block's sequence hash is its local hash.
            return self.child(NIL, BlockHash(seq.0));
        }
        let is = |c: &u32| hash::chain(parent, self.node(*c).local()) == seq;
        match self.node(p).first_child {
            NIL => None,
            WIDE => self.wide[&p].iter().find(|c| is(c)).copied(),
            c => is(&c).then_some(c),
        }
    }

    /// Every (block, holder) with the block's sequence and parent hashes, in one go.
    pub fn dump(&self, out: &mut Vec<DumpedBlock>) {
        let mut walk = DumpWalk::default();
        while !self.dump_step(&mut walk, usize::MAX, out) {}
    }

    /// A step of a dump: at most `budget` blocks from where `walk` got to, each
    /// block's holders (device, host and disk; predictions are not the engines'
    /// state) with its sequence and parent hashes, computed from the roots down.
    /// Blocks come parents first, so a tree can be filed from the output in order.
    /// Other changes may come between steps: every block held from the walk's start
    /// to its end is dumped, once; one filed or dropped meanwhile may or may not be.
    /// Returns whether the walk is done.
    pub fn dump_step(
        &self,
        walk: &mut DumpWalk,
        budget: usize,
        out: &mut Vec<DumpedBlock>,
    ) -> bool {
        if walk.done {
            return true;
        }
        if !walk.started {
            let mut roots: Vec<(BlockHash, u32)> = self
                .roots
                .iter()
                .map(|&r| (self.node(r).local(), r))
                .collect();
            roots.sort_unstable_by_key(|&(l, _)| l.0);
            (walk.root_locals, walk.roots) = roots.into_iter().unzip();
            walk.started = true;
        }
        let mut stack = self.resume(walk);
        let mut left = budget;
        while let Some(top) = stack.frames.last_mut() {
            if top.next == top.end {
                stack.pop();
                continue;
            }
            if left == 0 {
                break;
            }
            let id = stack.kids[top.next];
            top.next += 1;
            if stack.frames.len() == 1 {
                let i = stack.frames[0].next - 1;
                let n = self.node(id);
                if n.parent() != NIL || n.local() != walk.root_locals[i] {
                    // A root that went since the walk began.
                    continue;
                }
            }
            left -= 1;
            let parent = stack.frames.last().expect("a level is being walked").seq;
            let n = self.node(id);
            let (local, seq) = (n.local(), hash::chain(parent, n.local()));
            for &h in n.holders.as_slice(&self.slab) {
                let h = Holder(h);
                let tiers = h.tiers() & TierSet::MEDIA;
                if !tiers.is_empty() {
                    out.push(DumpedBlock {
                        seq,
                        parent,
                        local,
                        holder: Holder::new(h.slot(), tiers),
                        node: id,
                    });
                }
            }
            stack.push(self, id, Some(seq));
        }
        // Where each level got to: the last block it passed (its subtree is where a
        // deeper level is).
        walk.at.clear();
        walk.at
            .extend(stack.frames.iter().enumerate().map(|(level, f)| {
                (f.next > f.start).then(|| match level {
                    0 => walk.root_locals[f.next - 1],
                    _ => self.node(stack.kids[f.next - 1]).local(),
                })
            }));
        walk.done = stack.frames.is_empty();
        // The roots are the bottom of the buffer: they go back to the walk.
        walk.roots = stack.kids;
        walk.roots.truncate(walk.root_locals.len());
        if walk.done {
            *walk = DumpWalk {
                done: true,
                ..DumpWalk::default()
            };
        }
        walk.done
    }

    /// The walk's frames rebuilt from the local hashes it saved: at each level, the
    /// children after the last one passed; below it, that child's, if it is still
    /// there (a node goes only with its subtree).
    fn resume(&self, walk: &mut DumpWalk) -> Walking {
        let mut stack = Walking::default();
        let (mut parent, mut seq) = (NIL, None);
        let levels = walk.at.len().max(1);
        for level in 0..levels {
            let last = walk.at.get(level).copied().flatten();
            let (next, into) = if level == 0 {
                // The roots the walk sorted when it began.
                stack.kids = std::mem::take(&mut walk.roots);
                let end = stack.kids.len();
                stack.frames.push(Frame {
                    seq: None,
                    start: 0,
                    end,
                    next: 0,
                });
                let locals = &walk.root_locals;
                let next = last.map_or(0, |l| locals.partition_point(|k| k.0 <= l.0));
                let into = last
                    .filter(|l| next > 0 && locals[next - 1] == *l)
                    .map(|_| stack.kids[next - 1])
                    .filter(|&r| {
                        self.node(r).parent() == NIL && Some(self.node(r).local()) == last
                    });
                (next, into)
            } else {
                stack.push(self, parent, seq);
                let f = stack.frames.last().expect("just pushed");
                let kids = &stack.kids[f.start..f.end];
                let next = last.map_or(0, |l| {
                    kids.partition_point(|&k| self.node(k).local().0 <= l.0)
                });
                let into = last
                    .filter(|l| next > 0 && self.node(kids[next - 1]).local() == *l)
                    .map(|_| kids[next - 1]);
                (next, into)
            };
            let f = stack.frames.last_mut().expect("just pushed");
            f.next = f.start + next;
            match (into, level + 1 < levels) {
                (Some(c), true) => {
                    seq = Some(hash::chain(seq, self.node(c).local()));
                    parent = c;
                }
                _ => break,
            }
        }
        stack
    }

    /// The sequence hash of `id`: its local hashes from the root down, chained.
    fn seq_of(&self, id: u32, path: &mut Vec<BlockHash>) -> SeqHash {
        path.clear();
        let mut n = id;
        loop {
            path.push(self.node(n).local());
            match self.node(n).parent() {
                NIL => break,
                p => n = p,
            }
        }
        path.iter()
            .rev()
            .fold(None, |parent, &l| Some(hash::chain(parent, l)))
            .expect("a path has a block")
    }

    /// Every (slot, sequence hash, engine hash) the engine maps hold for blocks
    /// their slots still hold (the tests' plain form of [`Self::engine_names`]).
    #[cfg(test)]
    fn engine_hashes(&self, out: &mut Vec<(WorkerSlot, SeqHash, EngineHash)>) {
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
    /// `slot`'s engine map that name a block the slot holds: with a dump's nodes
    /// ([`DumpedBlock::node`]), how each worker names each block it holds. The
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
                    .filter_map(|(eh, r)| Some((slot, self.resolve(slot, r)?, eh))),
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

    /// Files a block of a peer's dump (or a snapshot), parents first, as a store
    /// would. Its parent is the block the slot's `parent_engine` names, or else the
    /// block with sequence hash `parent_seq` among those this import filed (`filed`:
    /// the import's own map, dropped when it is done), or else a root standing for
    /// that sequence hash. Returns false, filing nothing, if the parent is named by
    /// an engine hash alone and it names nothing.
    pub fn seed(&mut self, b: &Seed, filed: &mut HashMap<SeqHash, u32>) -> bool {
        let Seed {
            slot,
            tier,
            engine: eh,
            local,
            parent_engine,
            parent_seq,
        } = *b;
        let by_engine = parent_engine.and_then(|p| self.named(slot, p));
        let parent = match (by_engine, parent_seq) {
            (Some(id), _) => id,
            (None, None) if parent_engine.is_none() => NIL,
            (None, Some(seq)) => match filed.get(&seq) {
                Some(&id) if self.node(id).parent() != FREE => id,
                // A parent the dump names by sequence hash alone (nobody held it): a
                // root standing for it, whose sequence hash is that one (a first
                // block's is its local hash), holding nothing. Lookups stop there, as
                // they stop at the parent in the tree the dump came from.
                _ => match self.child_or_insert(NIL, BlockHash(seq.0), EngineHash(0)) {
                    Some(id) => id,
                    None => return false,
                },
            },
            (None, None) => return false,
        };
        self.file_run(slot, tier, parent, &[(eh, local)]);
        let Some(id) = self.named(slot, eh) else {
            // A predicted tier, which a dump never carries: nothing is held.
            return false;
        };
        let seq = match (parent, parent_seq) {
            (NIL, _) => hash::chain(None, local),
            (_, Some(p)) => hash::chain(Some(p), local),
            _ => self.seq_of(id, &mut Vec::new()),
        };
        filed.insert(seq, id);
        true
    }

    fn children(&self, id: u32, out: &mut Vec<u32>) {
        match self.node(id).first_child {
            NIL => {}
            WIDE => out.extend(self.wide[&id].iter().copied()),
            c => out.push(c),
        }
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
            + self.slab.capacity_bytes()
            + self.predictions.heap_bytes()
            + self.engine_heap_bytes()
            + self.per_slot.capacity() * 4
            + self.used.capacity() * 4
    }
}

/// Takes out of a slot's engine map the `names` that still name `node`, but `keep`.
fn forget_names(
    map: &mut Names,
    names: Vec<EngineHash>,
    node: u32,
    keep: Option<EngineHash>,
    chunks: &[Vec<Node>],
) {
    for eh in names.into_iter().filter(|&eh| Some(eh) != keep) {
        map.forget(eh, node, chunks);
    }
}

#[inline]
fn at(chunks: &[Vec<Node>], id: u32) -> &Node {
    &chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
}

#[inline]
fn at_mut(chunks: &mut [Vec<Node>], id: u32) -> &mut Node {
    &mut chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::HolderLists;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet, HashMap as StdMap};

    const DEV: Tier = Tier::DEVICE;

    fn eh(x: u64) -> EngineHash {
        EngineHash(x)
    }

    fn chain(slot: u32, from: u64, locals: &[u64]) -> Vec<(EngineHash, BlockHash)> {
        locals
            .iter()
            .enumerate()
            .map(|(i, &l)| (eh(slot as u64 * 1000 + from + i as u64), BlockHash(l)))
            .collect()
    }

    /// A lookup's output with [`SAME_HOLDERS`] spelled out.
    fn spelled(out: &[u32]) -> Vec<u32> {
        HolderLists::new(out)
            .flat_map(|(hs, _)| std::iter::once(hs.len() as u32).chain(hs.iter().copied()))
            .collect()
    }

    fn lookup(t: &mut Tree, locals: &[u64]) -> Vec<u32> {
        let mut out = Vec::new();
        let locals: Vec<BlockHash> = locals.iter().map(|&l| BlockHash(l)).collect();
        t.lookup(Prompt::Locals(&locals), &mut out);
        spelled(&out)
    }

    fn held(slot: u32, tier: Tier) -> u32 {
        Holder::new(WorkerSlot(slot), tier.bit()).0
    }

    #[test]
    fn a_chain_is_filed_once_and_shared_by_its_holders() {
        let mut t = Tree::default();
        let s = |x| WorkerSlot(x);
        assert_eq!(
            t.store(s(1), DEV, None, &chain(1, 0, &[10, 11, 12])),
            Stored::Filed {
                new_holders: 3,
                confirmed: 0,
                unfiled: 0
            }
        );
        assert_eq!(
            t.store(s(2), DEV, None, &chain(2, 0, &[10, 11])),
            Stored::Filed {
                new_holders: 2,
                confirmed: 0,
                unfiled: 0
            }
        );
        assert_eq!(t.len(), 3);
        let (a, b) = (held(1, DEV), held(2, DEV));
        assert_eq!(
            lookup(&mut t, &[10, 11, 12, 13]),
            [2, a, b, 2, a, b, 1, a, 0]
        );
        // A continuation names its parent by the slot's own engine hash.
        assert_eq!(
            t.store(s(2), Tier::HOST, Some(eh(2001)), &chain(2, 2, &[12])),
            Stored::Filed {
                new_holders: 1,
                confirmed: 0,
                unfiled: 0
            }
        );
        let b_host = Holder::new(WorkerSlot(2), Tier::HOST.bit()).0;
        assert_eq!(
            lookup(&mut t, &[10, 11, 12]),
            [2, a, b, 2, a, b, 2, a, b_host]
        );
        assert_eq!(
            t.store(s(3), DEV, Some(eh(7)), &chain(3, 0, &[10])),
            Stored::UnknownParent
        );
        assert_eq!(t.per_slot(), [0, 3, 3]);
    }

    #[test]
    fn a_dump_in_steps_skips_a_root_that_went_and_whose_node_was_reused() {
        let mut t = Tree::default();
        let s1 = WorkerSlot(1);
        for r in 0..100u64 {
            t.store(s1, DEV, None, &[(eh(r), BlockHash(1000 + r))]);
        }
        let mut out = Vec::new();
        let mut walk = DumpWalk::default();
        let mut gone = BTreeSet::new();
        let mut step = 0;
        while !t.dump_step(&mut walk, 10, &mut out) {
            // A root the walk has not reached goes, and its node is filed again as
            // a new root (the free list hands the freed node out first).
            let r = 99 - step;
            assert!(t.remove(s1, eh(r), TierSet::ALL));
            gone.insert(1000 + r);
            t.store(s1, DEV, None, &[(eh(500 + r), BlockHash(5000 + r))]);
            step += 1;
        }
        let dumped: Vec<u64> = out.iter().map(|d| d.local.0).collect();
        let unique: BTreeSet<u64> = dumped.iter().copied().collect();
        assert_eq!(unique.len(), dumped.len(), "a block dumped twice");
        // Every root held throughout is dumped; one that went may have been dumped
        // before it went.
        for l in (1000..1100).filter(|l| !gone.contains(l)) {
            assert!(unique.contains(&l), "{l}");
        }
        assert!(gone.iter().any(|l| !unique.contains(l)));
        assert!(
            unique.iter().all(|&l| l < 5000),
            "a root filed during the walk"
        );
    }

    #[test]
    fn a_full_arena_files_what_fits_and_says_what_it_did_not() {
        let mut t = Tree {
            node_limit: Some(4),
            ..Tree::default()
        };
        let s1 = WorkerSlot(1);
        assert_eq!(
            t.store(s1, DEV, None, &chain(1, 0, &[10, 11, 12, 13, 14, 15])),
            Stored::Filed {
                new_holders: 4,
                confirmed: 0,
                unfiled: 2
            }
        );
        assert_eq!(lookup(&mut t, &[10, 11, 12, 13, 14]).len(), 9);
        // Space freed is used again.
        assert!(t.remove(s1, eh(1003), TierSet::ALL));
        t.predict(WorkerSlot(2), &[BlockHash(20), BlockHash(21)], 5);
        assert_eq!(t.len(), 4);
        assert_eq!(t.tier_pairs()[Tier::PREDICTED.0 as usize], 1);
    }

    #[test]
    fn a_removed_leaf_goes_and_a_held_path_stays() {
        let mut t = Tree::default();
        let s1 = WorkerSlot(1);
        t.store(s1, DEV, None, &chain(1, 0, &[10, 11, 12]));
        // The middle block goes: its node stays as the path to the last.
        assert!(t.remove(s1, eh(1001), TierSet::ALL));
        assert_eq!(t.len(), 3);
        assert_eq!(lookup(&mut t, &[10, 11, 12]), [1, held(1, DEV), 0]);
        // The last goes: it and the path above it that nobody holds are freed.
        assert!(t.remove(s1, eh(1002), TierSet::ALL));
        assert_eq!(t.len(), 1);
        assert!(!t.remove(s1, eh(1002), TierSet::ALL));
        // Freed nodes are reused.
        t.store(s1, DEV, Some(eh(1000)), &chain(1, 1, &[21, 22]));
        assert_eq!(t.len(), 3);
        assert_eq!(t.chunks[0].len(), 3);
        t.clear_slot(s1, TierSet::ALL);
        assert!(t.is_empty());
        assert_eq!(lookup(&mut t, &[10]), [0]);
    }

    #[test]
    fn a_wide_parent_keeps_its_children_in_a_table() {
        let mut t = Tree::default();
        let s = WorkerSlot(1);
        t.store(s, DEV, None, &[(eh(1), BlockHash(1))]);
        let n = 24;
        for i in 0..n {
            t.store(
                s,
                DEV,
                Some(eh(1)),
                &[
                    (eh(100 + i), BlockHash(100 + i)),
                    (eh(500 + i), BlockHash(7)),
                ],
            );
        }
        assert_eq!(t.wide.len(), 1);
        for i in 0..n {
            assert_eq!(lookup(&mut t, &[1, 100 + i, 7]).len(), 6);
            let seqs = [
                hash::chain(None, BlockHash(1)),
                hash::chain(Some(hash::chain(None, BlockHash(1))), BlockHash(100 + i)),
            ];
            let mut out = Vec::new();
            t.lookup(Prompt::Seqs(&seqs), &mut out);
            assert_eq!(spelled(&out).len(), 4);
        }
        for i in 0..n {
            assert!(t.remove(s, eh(500 + i), TierSet::ALL));
            assert!(t.remove(s, eh(100 + i), TierSet::ALL));
        }
        assert!(t.wide.is_empty());
        assert_eq!(t.len(), 1);
        assert_eq!(
            t.node(t.roots.iter().copied().next().unwrap()).first_child,
            NIL
        );
    }

    #[test]
    fn a_second_engine_hash_for_a_block_goes_with_the_first() {
        let mut t = Tree::default();
        let s = WorkerSlot(1);
        t.store(s, DEV, None, &[(eh(1), BlockHash(10))]);
        t.store(s, DEV, None, &[(eh(2), BlockHash(10))]);
        assert_eq!(t.per_slot(), [0, 1]);
        assert!(t.remove(s, eh(2), TierSet::ALL));
        assert!(t.is_empty());
        // Neither name is left to remove a block filed in the freed node.
        t.store(s, DEV, None, &[(eh(3), BlockHash(20))]);
        assert!(!t.remove(s, eh(1), TierSet::ALL));
        assert_eq!(lookup(&mut t, &[20]), [1, held(1, DEV)]);
    }

    /// Slots whose engines agree on hashes name a block by its node's own hash
    /// (4 bytes a name); a slot seeded apart names it beside (12 bytes). Either
    /// name resolves, removes and clears as before, and an evicted block's own
    /// names go with it.
    #[test]
    fn agreeing_engines_share_the_nodes_hash_and_others_name_it_beside() {
        let mut t = Tree::default();
        let (a, b, apart) = (WorkerSlot(0), WorkerSlot(1), WorkerSlot(2));
        let shared = chain(0, 0, &[1, 2, 3]);
        t.store(a, DEV, None, &shared);
        t.store(b, DEV, None, &shared);
        t.store(apart, DEV, None, &chain(2, 0, &[1, 2, 3]));
        // (own names, other names) of a slot.
        let names = |t: &Tree, s: WorkerSlot| {
            let n = &t.engine[s.0 as usize];
            (n.own.len(), n.other.len())
        };
        assert_eq!(names(&t, a), (3, 0));
        assert_eq!(names(&t, b), (3, 0));
        assert_eq!(names(&t, apart), (0, 3));
        assert!(t.remove(b, shared[2].0, TierSet::ALL));
        assert!(t.remove(apart, eh(2002), TierSet::ALL));
        assert_eq!(
            lookup(&mut t, &[1, 2, 3]),
            [
                3,
                held(0, DEV),
                held(1, DEV),
                held(2, DEV),
                3,
                held(0, DEV),
                held(1, DEV),
                held(2, DEV),
                1,
                held(0, DEV)
            ]
        );
        t.clear_slot(apart, TierSet::ALL);
        assert_eq!(names(&t, apart), (0, 0));
        t.track_use();
        while t.evict().is_some() {}
        assert!(t.is_empty());
        assert_eq!((names(&t, a), names(&t, b)), ((0, 0), (0, 0)));
    }

    /// Engines that count their block hashes (the same hash, other content on each
    /// worker) stay exact: each slot's names are its own, whichever node holds the
    /// hash as its own.
    #[test]
    fn engines_counting_their_hashes_name_other_content_by_the_same_hash() {
        let mut t = Tree::default();
        let (a, b) = (WorkerSlot(0), WorkerSlot(1));
        t.store(a, DEV, None, &[(eh(5), BlockHash(10))]);
        t.store(b, DEV, None, &[(eh(5), BlockHash(20))]);
        t.store(b, DEV, None, &[(eh(7), BlockHash(10))]);
        assert_eq!(lookup(&mut t, &[10]), [2, held(0, DEV), held(1, DEV)]);
        assert_eq!(lookup(&mut t, &[20]), [1, held(1, DEV)]);
        assert!(t.remove(b, eh(5), TierSet::ALL));
        assert_eq!(lookup(&mut t, &[20]), [0]);
        assert_eq!(lookup(&mut t, &[10]), [2, held(0, DEV), held(1, DEV)]);
        assert!(t.remove(a, eh(5), TierSet::ALL));
        assert!(!t.remove(a, eh(7), TierSet::ALL));
        assert_eq!(lookup(&mut t, &[10]), [1, held(1, DEV)]);
        assert!(t.remove(b, eh(7), TierSet::ALL));
        assert!(t.is_empty());
    }

    /// A store confirming a prediction names the block once: a predicted holder
    /// has no engine hash, so the store is no second name (which would walk the
    /// slot's engine map for the first).
    #[test]
    fn a_store_confirming_a_prediction_is_not_a_second_name() {
        let mut t = Tree::default();
        let s = WorkerSlot(1);
        t.predict(s, &[BlockHash(10), BlockHash(11)], 100);
        t.store(s, DEV, None, &chain(1, 10, &[10, 11]));
        assert!(t.aliases.is_empty());
        assert!(t.remove(s, eh(1011), TierSet::ALL));
        assert!(t.remove(s, eh(1010), TierSet::ALL));
        assert!(t.is_empty());
    }

    #[test]
    fn a_clear_walks_only_its_slot_in_steps() {
        let mut t = Tree::default();
        let locals: Vec<u64> = (1..=20_000).collect();
        t.store(WorkerSlot(1), DEV, None, &chain(1, 0, &locals));
        t.store(WorkerSlot(2), DEV, None, &chain(2, 0, &locals[..10]));
        let mut at = NamesAt::default();
        let mut steps = 1;
        while !t.clear_step(WorkerSlot(1), TierSet::ALL, &mut at, 1024) {
            steps += 1;
            // Between steps the tree answers and the other slot is untouched.
            let answer = lookup(&mut t, &locals[..10]);
            assert_eq!(answer.iter().filter(|&&h| h == held(2, DEV)).count(), 10);
        }
        assert!(steps > 10, "{steps} steps");
        assert_eq!(t.len(), 10);
        assert_eq!(t.per_slot(), [0, 0, 10]);
        assert_eq!(
            lookup(&mut t, &locals[..11]),
            [1, held(2, DEV)]
                .repeat(10)
                .into_iter()
                .chain([0])
                .collect::<Vec<_>>()
        );
    }

    impl Tree {
        /// The local hashes from the root down to `id`.
        fn path(&self, mut id: u32) -> Vec<u64> {
            let mut path = vec![self.node(id).local().0];
            while self.node(id).parent() != NIL {
                id = self.node(id).parent();
                path.push(self.node(id).local().0);
            }
            path.reverse();
            path
        }
    }

    #[test]
    fn eviction_takes_the_least_recently_used_leaf() {
        let mut t = Tree::default();
        t.track_use();
        let s1 = WorkerSlot(1);
        t.store(s1, DEV, None, &chain(1, 0, &[10, 11, 12]));
        t.store(s1, DEV, None, &chain(1, 10, &[20, 21]));
        // The older store's leaf goes first.
        let v = t.next_victim().unwrap();
        assert_eq!(t.path(v), [10, 11, 12]);
        assert_eq!(t.evict_node(v), 1);
        // A match keeps a block: 20 and 21 are matched, so 11, a leaf now, goes.
        assert_eq!(lookup(&mut t, &[20, 21]).len(), 4);
        let v = t.next_victim().unwrap();
        assert_eq!(t.path(v), [10, 11]);
        t.evict_node(v);
        assert_eq!(t.len(), 3);
        assert_eq!(lookup(&mut t, &[10, 11]), [1, held(1, DEV), 0]);
        // The evicted block's engine hash names nothing, even once its node is
        // filed again with another block.
        assert!(!t.remove(s1, eh(1001), TierSet::ALL));
        t.store(s1, DEV, Some(eh(1000)), &chain(1, 20, &[30]));
        assert_eq!(
            t.store(s1, DEV, Some(eh(1002)), &chain(1, 30, &[31])),
            Stored::UnknownParent
        );
        assert_eq!(t.per_slot(), [0, 4]);
        assert_eq!(t.tier_pairs()[0], 4);
        // An empty tree has nothing to evict.
        assert_eq!(Tree::default().evict(), None);
    }

    /// A prompt matched after every other store outlasts prompts stored after it
    /// and matched once, though it comes first in the arena; the newest store
    /// stays.
    #[test]
    fn a_hot_prompt_and_the_newest_store_outlast_older_ones() {
        let mut t = Tree::default();
        t.track_use();
        let s1 = WorkerSlot(1);
        let prompt = |p: u64| -> Vec<u64> { (0..4).map(|b| 100 * (p + 1) + b).collect() };
        let locals = |p: u64| -> Vec<BlockHash> { prompt(p).into_iter().map(BlockHash).collect() };
        for p in 0..6 {
            t.store(s1, DEV, None, &chain(1, 1000 * p, &prompt(p)));
            t.lookup(Prompt::Locals(&locals(p)), &mut Vec::new());
            t.lookup(Prompt::Locals(&locals(0)), &mut Vec::new());
        }
        t.store(s1, DEV, None, &chain(1, 9000, &prompt(6)));
        for _ in 0..8 {
            t.evict();
        }
        let held = |t: &mut Tree, p: u64| {
            let mut out = Vec::new();
            t.lookup(Prompt::Locals(&locals(p)), &mut out);
            spelled(&out).iter().filter(|&&n| n == 1).count()
        };
        assert_eq!(held(&mut t, 0), 4);
        assert_eq!(held(&mut t, 6), 4);
        assert_eq!(held(&mut t, 1) + held(&mut t, 2), 0);
    }

    /// A replica filed from a tree's dump and engine hashes: `seed` in dump order,
    /// every (block, holder) once per tier and once per engine hash naming it.
    fn replica(t: &Tree) -> Tree {
        let mut dumped = Vec::new();
        t.dump(&mut dumped);
        let mut names: BTreeMap<(u32, u64), Vec<EngineHash>> = BTreeMap::new();
        let mut ehs = Vec::new();
        t.engine_hashes(&mut ehs);
        for (slot, seq, eh) in ehs {
            names.entry((slot.0, seq.0)).or_default().push(eh);
        }
        let mut r = Tree::default();
        let mut filed = HashMap::new();
        for d in &dumped {
            let slot = d.holder.slot();
            let parent_engine = d
                .parent
                .and_then(|p| names.get(&(slot.0, p.0)))
                .map(|n| n[0]);
            for tier in d.holder.tiers().iter() {
                for &eh in &names[&(slot.0, d.seq.0)] {
                    let seed = Seed {
                        slot,
                        tier,
                        engine: eh,
                        local: d.local,
                        parent_engine,
                        parent_seq: d.parent,
                    };
                    r.seed(&seed, &mut filed);
                }
            }
        }
        r
    }

    #[test]
    fn a_replica_filed_from_a_dump_answers_as_the_tree_does() {
        let mut t = Tree::default();
        for c in 0..40u64 {
            let slot = WorkerSlot((c % 3) as u32);
            let tier = Tier((c % 2) as u8);
            // Conversations share their first two blocks, some extend another's.
            let locals: Vec<u64> = [1, 2]
                .into_iter()
                .chain((0..(c % 7 + 1)).map(|i| 100 * c + i))
                .collect();
            t.store(slot, tier, None, &chain(slot.0, 10_000 * c, &locals));
            if c % 5 == 0 {
                // A second name for the same blocks.
                t.store(
                    slot,
                    tier,
                    None,
                    &chain(slot.0, 10_000 * c + 5_000, &locals),
                );
            }
        }
        let mut r = replica(&t);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.dump(&mut a);
        r.dump(&mut b);
        assert_eq!(sorted(&a), sorted(&b));
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        t.engine_hashes(&mut ea);
        r.engine_hashes(&mut eb);
        ea.sort_by_key(|&(s, q, e)| (s.0, q.0, e.0));
        eb.sort_by_key(|&(s, q, e)| (s.0, q.0, e.0));
        assert_eq!(ea, eb);
        assert_eq!(t.per_slot(), r.per_slot());
        assert_eq!(t.tier_pairs(), r.tier_pairs());
        // The engines' later events resolve on the replica as on the tree.
        for c in [3u64, 10] {
            let slot = WorkerSlot((c % 3) as u32);
            let last = eh(slot.0 as u64 * 1000 + 10_000 * c + 2 + c % 7);
            assert!(t.remove(slot, last, TierSet::ALL));
            assert!(r.remove(slot, last, TierSet::ALL));
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.dump(&mut a);
        r.dump(&mut b);
        assert_eq!(sorted(&a), sorted(&b));
        // Seeding a block whose parent is named by an engine hash alone that names
        // nothing files nothing.
        let mut filed = HashMap::new();
        let orphan = Seed {
            slot: WorkerSlot(1),
            tier: DEV,
            engine: eh(9),
            local: BlockHash(9),
            parent_engine: Some(eh(77)),
            parent_seq: None,
        };
        assert!(!r.seed(&orphan, &mut filed));
        // One whose parent is named by a sequence hash nobody's block has hangs from
        // a root standing for it: dumped with that parent, and its later events
        // resolve.
        let orphan = Seed {
            parent_engine: None,
            parent_seq: Some(SeqHash(77)),
            ..orphan
        };
        assert!(r.seed(&orphan, &mut filed));
        let mut d = Vec::new();
        r.dump(&mut d);
        let b = d.iter().find(|b| b.local == BlockHash(9)).unwrap();
        assert_eq!(b.parent, Some(SeqHash(77)));
        assert_eq!(b.seq, hash::chain(Some(SeqHash(77)), BlockHash(9)));
        assert!(r.remove(WorkerSlot(1), eh(9), TierSet::ALL));
        let mut after = Vec::new();
        r.dump(&mut after);
        assert_eq!(after.len(), d.len() - 1);
    }

    /// The tree's rules written plainly: blocks are paths of local hashes.
    #[derive(Default)]
    struct Model {
        names: StdMap<(u32, u64), Vec<u64>>,
        holders: BTreeMap<Vec<u64>, BTreeMap<u32, u8>>,
        /// Deadlines of predicted (block, slot) pairs.
        predicted: BTreeMap<(Vec<u64>, u32), Tick>,
        now: Tick,
    }

    const PREDICTED: u8 = Tier::PREDICTED.bit().0;

    impl Model {
        fn unhold(&mut self, slot: u32, path: &[u64], tiers: u8) {
            let hs = self.holders.get_mut(path).unwrap();
            let left = hs[&slot] & !tiers;
            if left != 0 {
                hs.insert(slot, left);
                return;
            }
            hs.remove(&slot);
            if hs.is_empty() {
                self.holders.remove(path);
            }
            self.names.retain(|(s, _), p| !(*s == slot && p == path));
        }

        fn store(&mut self, slot: u32, tier: Tier, parent: Option<u64>, blocks: &[(u64, u64)]) {
            let mut path = match parent {
                None => Vec::new(),
                Some(p) => match self.names.get(&(slot, p)) {
                    Some(path) => path.clone(),
                    None => return,
                },
            };
            for &(e, l) in blocks {
                path.push(l);
                let held = self
                    .holders
                    .entry(path.clone())
                    .or_default()
                    .entry(slot)
                    .or_default();
                *held |= tier.bit().0;
                if *held & PREDICTED != 0 {
                    *held &= !PREDICTED;
                    self.predicted.remove(&(path.clone(), slot));
                }
                match self.names.insert((slot, e), path.clone()) {
                    Some(old) if old != path => {
                        self.unhold(slot, &old, 0xff);
                        self.names.insert((slot, e), path.clone());
                    }
                    _ => {}
                }
            }
        }

        fn remove(&mut self, slot: u32, e: u64, tiers: u8) {
            if let Some(path) = self.names.get(&(slot, e)).cloned() {
                self.unhold(slot, &path, tiers & !PREDICTED);
            }
        }

        fn predict(&mut self, slot: u32, path: &[u64], deadline: Tick) {
            for i in 1..=path.len() {
                let p = path[..i].to_vec();
                let held = self
                    .holders
                    .entry(p.clone())
                    .or_default()
                    .entry(slot)
                    .or_default();
                if *held & !PREDICTED != 0 {
                    continue;
                }
                *held |= PREDICTED;
                let d = self.predicted.entry((p, slot)).or_default();
                *d = (*d).max(deadline);
            }
        }

        fn evict(&mut self, path: &[u64]) {
            let slots: Vec<u32> = self.holders[path].keys().copied().collect();
            for slot in slots {
                self.unhold(slot, path, 0xff);
                self.predicted.remove(&(path.to_vec(), slot));
            }
        }

        fn expire(&mut self, now: Tick) {
            self.now = now;
            let due: Vec<(Vec<u64>, u32)> = self
                .predicted
                .iter()
                .filter(|(_, d)| **d <= now)
                .map(|(k, _)| k.clone())
                .collect();
            for (p, slot) in due {
                self.predicted.remove(&(p.clone(), slot));
                self.unhold(slot, &p, PREDICTED);
            }
        }

        fn clear(&mut self, slot: u32, tiers: u8) {
            let held: Vec<Vec<u64>> = self
                .holders
                .iter()
                .filter(|(_, hs)| hs.contains_key(&slot))
                .map(|(p, _)| p.clone())
                .collect();
            for p in held {
                self.unhold(slot, &p, tiers);
            }
            if tiers & PREDICTED != 0 {
                self.predicted.retain(|(_, s), _| *s != slot);
            }
        }

        fn lookup(&self, locals: &[u64]) -> Vec<Vec<u32>> {
            let mut out = Vec::new();
            for i in 0..locals.len() {
                let hs: Vec<u32> = self.holders.get(&locals[..=i]).map_or(Vec::new(), |hs| {
                    hs.iter()
                        .map(|(&s, &t)| Holder::new(WorkerSlot(s), TierSet(t)).as_scored().0)
                        .collect()
                });
                let stop = hs.is_empty();
                out.push(hs);
                if stop {
                    break;
                }
            }
            out
        }

        fn nodes(&self) -> usize {
            let paths: BTreeSet<&[u64]> = self
                .holders
                .keys()
                .flat_map(|p| (1..=p.len()).map(move |i| &p[..i]))
                .collect();
            paths.len()
        }
    }

    fn sorted(d: &[DumpedBlock]) -> Vec<(u64, u32)> {
        let mut v: Vec<(u64, u32)> = d.iter().map(|d| (d.seq.0, d.holder.0)).collect();
        v.sort();
        v
    }

    #[test]
    fn a_dump_in_steps_passes_every_block_held_throughout_once() {
        let mut t = Tree::default();
        let s1 = WorkerSlot(1);
        // Conversations sharing a first block, branching below it.
        for c in 0..50u64 {
            let locals: Vec<u64> = std::iter::once(1)
                .chain((0..20).map(|i| 1000 * c + 10 + i))
                .collect();
            let parent = (c > 0).then(|| eh(1000 * 1000));
            let from = if c == 0 { 0 } else { 1 };
            let blocks: Vec<_> = locals[from..]
                .iter()
                .enumerate()
                .map(|(i, &l)| {
                    (
                        eh(if from + i == 0 {
                            1000 * 1000
                        } else {
                            1000 * 1000 + 100 * c + i as u64 + 1
                        }),
                        BlockHash(l),
                    )
                })
                .collect();
            assert!(matches!(
                t.store(s1, DEV, parent, &blocks),
                Stored::Filed { .. }
            ));
        }
        let mut whole = Vec::new();
        t.dump(&mut whole);
        assert_eq!(whole.len(), 1 + 50 * 20);
        // Between steps, odd conversations lose their tails and new ones come.
        let mut out = Vec::new();
        let mut walk = DumpWalk::default();
        let mut step = 0u64;
        while !t.dump_step(&mut walk, 37, &mut out) {
            step += 1;
            let c = 2 * step + 1;
            if c < 50 {
                assert!(t.remove(s1, eh(1000 * 1000 + 100 * c + 20), TierSet::ALL));
            }
            t.store(
                s1,
                DEV,
                None,
                &[(eh(5_000_000 + step), BlockHash(7_000_000 + step))],
            );
        }
        let seqs: Vec<u64> = out.iter().map(|d| d.seq.0).collect();
        let unique: BTreeSet<u64> = seqs.iter().copied().collect();
        assert_eq!(unique.len(), seqs.len(), "a block dumped twice");
        // A block of the first dump still held at the end was held throughout.
        let mut after = Vec::new();
        t.dump(&mut after);
        assert_eq!(after.len(), whole.len() - 24 + step as usize);
        let first: BTreeSet<u64> = whole.iter().map(|d| d.seq.0).collect();
        for d in after.iter().filter(|d| first.contains(&d.seq.0)) {
            assert!(
                unique.contains(&d.seq.0),
                "a block held throughout was missed"
            );
        }
    }

    /// `[n, holder..]` per block, each block's holders sorted.
    fn blocks_of(out: &[u32]) -> Vec<Vec<u32>> {
        HolderLists::new(out)
            .map(|(hs, _)| {
                let mut hs = hs.to_vec();
                hs.sort();
                hs
            })
            .collect()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Store {
            slot: u32,
            tier: u8,
            from: Vec<u64>,
            locals: Vec<u64>,
            alias: bool,
        },
        Remove {
            slot: u32,
            path: Vec<u64>,
            alias: bool,
            tiers: u8,
        },
        Predict {
            slot: u32,
            path: Vec<u64>,
            ttl: Tick,
        },
        Expire {
            advance: Tick,
        },
        Evict,
        /// A clear walked in steps of `step` buckets (all at once if none).
        Clear {
            slot: u32,
            tiers: u8,
            step: Option<usize>,
        },
    }

    /// A slot's engine hash for a path, or a second name. Slots 0 and 1 agree on
    /// hashes (so a block has one engine hash, its node's), slot 2 is seeded apart.
    fn name(slot: u32, path: &[u64], alias: bool) -> u64 {
        let mut x = (slot / 2) as u64 * 31 + alias as u64 * 7;
        for &l in path {
            x = x.wrapping_mul(1_000_003).wrapping_add(l);
        }
        x
    }

    fn op() -> impl Strategy<Value = Op> {
        let locals = || proptest::collection::vec(1u64..3, 0..3);
        let tiers = prop_oneof![Just(0xffu8), 1u8..8];
        prop_oneof![
            6 => (0u32..3, 0u8..3, locals(), proptest::collection::vec(1u64..4, 1..4), proptest::bool::weighted(0.2))
                .prop_map(|(slot, tier, from, locals, alias)| Op::Store { slot, tier, from, locals, alias }),
            3 => (0u32..3, proptest::collection::vec(1u64..4, 1..3), proptest::bool::weighted(0.3), tiers.clone())
                .prop_map(|(slot, path, alias, tiers)| Op::Remove { slot, path, alias, tiers }),
            1 => (0u32..3, tiers, proptest::option::of(1usize..4))
                .prop_map(|(slot, tiers, step)| Op::Clear { slot, tiers, step }),
            2 => (0u32..3, proptest::collection::vec(1u64..4, 1..4), 1 as Tick..6)
                .prop_map(|(slot, path, ttl)| Op::Predict { slot, path, ttl }),
            1 => (1 as Tick..4).prop_map(|advance| Op::Expire { advance }),
            1 => Just(Op::Evict),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        #[test]
        fn prop_tree_vs_model(ops in proptest::collection::vec(op(), 1..60), dump_step in 1usize..4, track: bool) {
            let mut t = Tree::default();
            if track {
                t.track_use();
            }
            let mut m = Model::default();
            for op in &ops {
                match op {
                    Op::Store { slot, tier, from, locals, alias } => {
                        let parent = (!from.is_empty()).then(|| name(*slot, from, false));
                        let mut path = from.clone();
                        let blocks: Vec<(u64, u64)> = locals.iter().map(|&l| {
                            path.push(l);
                            (name(*slot, &path, *alias), l)
                        }).collect();
                        let tier = Tier(*tier);
                        m.store(*slot, tier, parent, &blocks);
                        let blocks: Vec<_> = blocks.iter().map(|&(e, l)| (eh(e), BlockHash(l))).collect();
                        t.store(WorkerSlot(*slot), tier, parent.map(eh), &blocks);
                    }
                    Op::Remove { slot, path, alias, tiers } => {
                        let e = name(*slot, path, *alias);
                        m.remove(*slot, e, *tiers);
                        t.remove(WorkerSlot(*slot), eh(e), TierSet(*tiers));
                    }
                    Op::Predict { slot, path, ttl } => {
                        let deadline = m.now + ttl;
                        m.predict(*slot, path, deadline);
                        let locals: Vec<BlockHash> = path.iter().map(|&l| BlockHash(l)).collect();
                        t.predict(WorkerSlot(*slot), &locals, deadline);
                    }
                    Op::Evict => {
                        if let Some(id) = t.next_victim() {
                            m.evict(&t.path(id));
                            t.evict_node(id);
                        }
                    }
                    Op::Expire { advance } => {
                        let now = m.now + advance;
                        m.expire(now);
                        t.expire(now);
                    }
                    Op::Clear { slot, tiers, step } => {
                        m.clear(*slot, *tiers);
                        let (slot, tiers) = (WorkerSlot(*slot), TierSet(*tiers));
                        match step {
                            None => t.clear_slot(slot, tiers),
                            Some(b) => {
                                let mut at = NamesAt::default();
                                while !t.clear_step(slot, tiers, &mut at, *b) {}
                            }
                        }
                    }
                }
                prop_assert_eq!(t.len(), m.nodes());
                // A 4-byte name lives exactly as long as its hold: its key is read
                // from a node that a reuse would change.
                for (i, names) in t.engine.iter().enumerate() {
                    for n in names.own.iter() {
                        prop_assert!(t.resolve(WorkerSlot(i as u32), n.0).is_some());
                    }
                }
            }
            let mut paths: Vec<Vec<u64>> = m.holders.keys().cloned().collect();
            paths.push(vec![1, 2, 3, 1]);
            for p in &paths {
                let locals: Vec<BlockHash> = p.iter().map(|&l| BlockHash(l)).collect();
                let mut out = Vec::new();
                t.lookup(Prompt::Locals(&locals), &mut out);
                prop_assert_eq!(blocks_of(&out), m.lookup(p));
                let mut seqs = Vec::new();
                hash::seq_hashes_for_locals(&locals, &mut seqs);
                out.clear();
                t.lookup(Prompt::Seqs(&seqs), &mut out);
                prop_assert_eq!(blocks_of(&out), m.lookup(p));
            }
            let mut dumped = Vec::new();
            t.dump(&mut dumped);
            // In steps, with nothing changing between them: the same blocks, parents
            // first.
            let mut stepped = Vec::new();
            let mut walk = DumpWalk::default();
            while !t.dump_step(&mut walk, dump_step, &mut stepped) {}
            let mut seen = BTreeSet::new();
            for d in &stepped {
                if let Some(p) = d.parent {
                    prop_assert!(seen.contains(&p) || !stepped.iter().any(|x| x.seq == p));
                }
                seen.insert(d.seq);
            }
            prop_assert_eq!(stepped.len(), dumped.len());
            prop_assert_eq!(sorted(&stepped), sorted(&dumped));
            // A replica carries every block held on a medium (one below a block
            // nobody holds hangs from a root standing for that block), and no
            // prediction.
            let mut copied = Vec::new();
            replica(&t).dump(&mut copied);
            prop_assert_eq!(sorted(&copied), sorted(&dumped));
            let mut got: Vec<(u64, Option<u64>, u64, u32)> =
                dumped.iter().map(|d| (d.seq.0, d.parent.map(|p| p.0), d.local.0, d.holder.0)).collect();
            got.sort();
            let mut want = Vec::new();
            for (path, hs) in &m.holders {
                let locals: Vec<BlockHash> = path.iter().map(|&l| BlockHash(l)).collect();
                let mut seqs = Vec::new();
                hash::seq_hashes_for_locals(&locals, &mut seqs);
                let parent = (seqs.len() > 1).then(|| seqs[seqs.len() - 2].0);
                for (&s, &tiers) in hs {
                    let tiers = tiers & TierSet::MEDIA.0;
                    if tiers != 0 {
                        want.push((seqs.last().unwrap().0, parent, *path.last().unwrap(), Holder::new(WorkerSlot(s), TierSet(tiers)).0));
                    }
                }
            }
            want.sort();
            prop_assert_eq!(got, want);
            let mut per_slot = vec![0u32; 3];
            for hs in m.holders.values() {
                for &s in hs.keys() {
                    per_slot[s as usize] += 1;
                }
            }
            let mut have = t.per_slot().to_vec();
            have.resize(3, 0);
            prop_assert_eq!(have, per_slot);
            let mut pairs = [0u64; Tier::COUNT];
            for hs in m.holders.values() {
                for &tiers in hs.values() {
                    for tier in TierSet(tiers).iter() {
                        pairs[tier.0 as usize] += 1;
                    }
                }
            }
            prop_assert_eq!(t.tier_pairs(), &pairs);
        }
    }
}
