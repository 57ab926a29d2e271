//! The node arena of a [`Tree`]: nodes in chunks that never move, a free list
//! through the freed ones, each node's generation, and each parent's children
//! (one named in the node, more in a child table found by local hash).
//!
//! Owns what a node id ([`NodeId`]) and a reference ([`NodeRef`]: an id and a
//! generation) mean, and the packed words a node keeps them in. Never decides
//! what a node holds or which names point at it: a node is released only once
//! its caller has emptied it, and a release ends every reference taken to it.

use super::Tree;
use crate::shard::holders::{HolderSet, HolderSlab};
use crate::types::{BlockHash, EngineHash, WorkerSlot};
use hashbrown::HashTable;

/// In a node's `first_child`: no child (on the free list: the end of it).
const NIL: u32 = u32::MAX;
/// In a node's `first_child`: the children (two or more) are in the parent's
/// child table.
const WIDE: u32 = u32::MAX - 1;
/// Node ids fit in 28 bits (268M nodes an index shard); the top 4 bits of a
/// reference to a node, and of the node's `up` word, are its generation, which
/// changes each time the node stops holding anything: a reference taken before
/// names nothing once it does.
const ID_BITS: u32 = 28;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
/// In a node's `up` word: a root (no parent), or a node on the free list.
const NIL_UP: u32 = ID_MASK;
const FREE_UP: u32 = ID_MASK - 1;

/// Nodes per arena chunk: the arena grows a chunk at a time, never copying.
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A node's place in the arena. A freed node's id is reused: what keeps an id
/// across changes to the tree keeps a [`NodeRef`] instead, or checks the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct NodeId(u32);

impl NodeId {
    /// The id as a number (an export's [`crate::shard::ExportedBlock::node`]).
    pub fn index(self) -> u32 {
        self.0
    }

    /// The node at arena position `i`.
    pub(super) fn at_index(i: u32) -> Self {
        NodeId(i)
    }
}

/// A reference to a node as it was when taken: its id and its generation then,
/// in one word, as slotmap's keys are. It names nothing once the node's
/// generation moves on ([`Node::named_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(super) struct NodeRef(u32);

impl NodeRef {
    /// The node it was taken to (which may have been freed or reused since).
    #[inline]
    pub(super) fn id(self) -> NodeId {
        NodeId(self.0 & ID_MASK)
    }
}

/// A node's children, as its `first_child` word says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kids {
    None,
    One(NodeId),
    /// Two or more, in the parent's child table.
    Wide,
}

/// One block. The hashes are two halves each so that a node is 4-byte aligned:
/// 28 bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    local: [u32; 2],
    /// The engine hash the block was stored under while no slot held it on a
    /// medium: the key of the slots' 4-byte names for it.
    pub(super) engine: [u32; 2],
    /// Generation (top 4 bits) and parent (NIL_UP: a root, FREE_UP: on the free
    /// list).
    up: u32,
    /// NIL, the one child, or WIDE; on the free list, the next free node (or NIL).
    first_child: u32,
    pub(super) holders: HolderSet,
}

const _: () = assert!(std::mem::size_of::<Node>() == 28);

impl Node {
    #[inline]
    pub(super) fn local(&self) -> BlockHash {
        BlockHash(self.local[0] as u64 | (self.local[1] as u64) << 32)
    }

    /// The low half of the local hash: what a prediction checks its node by.
    #[inline]
    pub(super) fn check(&self) -> u32 {
        self.local[0]
    }

    #[inline]
    pub(super) fn engine(&self) -> EngineHash {
        EngineHash(self.engine[0] as u64 | (self.engine[1] as u64) << 32)
    }

    pub(super) fn set_engine(&mut self, eh: EngineHash) {
        self.engine = [eh.0 as u32, (eh.0 >> 32) as u32];
    }

    /// On the free list: its words other than `up` and `first_child` are stale.
    #[inline]
    pub(super) fn is_free(&self) -> bool {
        self.up & ID_MASK == FREE_UP
    }

    /// A live first block.
    #[inline]
    pub(super) fn is_root(&self) -> bool {
        self.up & ID_MASK == NIL_UP
    }

    /// The parent of a live node; `None` for a root.
    #[inline]
    pub(super) fn parent(&self) -> Option<NodeId> {
        debug_assert!(!self.is_free(), "a free node has no parent");
        match self.up & ID_MASK {
            NIL_UP => None,
            p => Some(NodeId(p)),
        }
    }

    fn set_parent(&mut self, parent: Option<NodeId>) {
        let p = parent.map_or(NIL_UP, |p| p.0);
        self.up = (self.up & !ID_MASK) | p;
    }

    /// The children of a live node.
    #[inline]
    pub(super) fn kids(&self) -> Kids {
        match self.first_child {
            NIL => Kids::None,
            WIDE => Kids::Wide,
            c => Kids::One(NodeId(c)),
        }
    }

    /// A live node with no children.
    #[inline]
    pub(super) fn is_leaf(&self) -> bool {
        self.first_child == NIL
    }

    fn set_kids(&mut self, kids: Kids) {
        self.first_child = match kids {
            Kids::None => NIL,
            Kids::Wide => WIDE,
            Kids::One(c) => c.0,
        };
    }

    /// The free node after this one on the free list.
    fn next_free(&self) -> Option<NodeId> {
        (self.first_child != NIL).then_some(NodeId(self.first_child))
    }

    /// References taken so far name nothing any more.
    pub(super) fn next_generation(&mut self) {
        self.up = self.up.wrapping_add(1 << ID_BITS);
    }

    /// A reference to this node, which is `id`, as it is now.
    #[inline]
    pub(super) fn reference(&self, id: NodeId) -> NodeRef {
        NodeRef((self.up & !ID_MASK) | id.0)
    }

    /// Whether `reference` (taken by `slot`) still names this node: the same
    /// generation, not freed, and the slot holds it.
    #[inline]
    pub(super) fn named_by(&self, reference: NodeRef, slot: WorkerSlot, slab: &HolderSlab) -> bool {
        self.reference(reference.id()) == reference
            && !self.is_free()
            && !self.holders.tiers_of(slot, slab).is_empty()
    }
}

/// The table hash of a child by its local hash: XXH3 output already, so one
/// multiply spreads it over hashbrown's control bits.
#[inline]
fn child_hash(local: BlockHash) -> u64 {
    local.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline]
pub(super) fn at(chunks: &[Vec<Node>], id: NodeId) -> &Node {
    &chunks[(id.0 >> CHUNK_BITS) as usize][id.0 as usize & (CHUNK - 1)]
}

#[inline]
pub(super) fn at_mut(chunks: &mut [Vec<Node>], id: NodeId) -> &mut Node {
    &mut chunks[(id.0 >> CHUNK_BITS) as usize][id.0 as usize & (CHUNK - 1)]
}

/// The node `id` names, if the arena has handed it out (free or not).
#[inline]
pub(super) fn get(chunks: &[Vec<Node>], id: NodeId) -> Option<&Node> {
    chunks
        .get((id.0 >> CHUNK_BITS) as usize)?
        .get(id.0 as usize & (CHUNK - 1))
}

impl Tree {
    #[inline]
    pub(super) fn node(&self, id: NodeId) -> &Node {
        at(&self.chunks, id)
    }

    #[inline]
    pub(super) fn node_mut(&mut self, id: NodeId) -> &mut Node {
        at_mut(&mut self.chunks, id)
    }

    /// Files `node` (whose generation is ignored) and returns its id; `None` once
    /// the arena holds as many nodes as ids can name.
    fn alloc(&mut self, mut node: Node) -> Option<NodeId> {
        if let Some(id) = self.free {
            self.live += 1;
            let old = self.node(id);
            node.up = (old.up & !ID_MASK) | (node.up & ID_MASK);
            self.free = old.next_free();
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
        let id = NodeId(filed as u32);
        node.up &= ID_MASK;
        self.chunks.last_mut()?.push(node);
        self.live += 1;
        Some(id)
    }

    /// Nodes the arena has handed out (free or not): every chunk but the last is
    /// full.
    pub(super) fn filed(&self) -> usize {
        self.chunks
            .last()
            .map_or(0, |c| ((self.chunks.len() - 1) << CHUNK_BITS) + c.len())
    }

    /// The child of `parent` (`None`: a first block) with local hash `local`.
    #[inline]
    pub(super) fn child(&self, parent: Option<NodeId>, local: BlockHash) -> Option<NodeId> {
        let Some(parent) = parent else {
            return self
                .roots
                .find(child_hash(local), |&c| self.node(c).local() == local)
                .copied();
        };
        match self.node(parent).kids() {
            Kids::None => None,
            Kids::Wide => self.wide[&parent]
                .find(child_hash(local), |&c| self.node(c).local() == local)
                .copied(),
            Kids::One(c) => (self.node(c).local() == local).then_some(c),
        }
    }

    /// The child of `parent` with local hash `local`, filed if new with `engine` as
    /// its engine hash (`None`: new, and the arena is full).
    pub(super) fn child_or_insert(
        &mut self,
        parent: Option<NodeId>,
        local: BlockHash,
        engine: EngineHash,
    ) -> Option<NodeId> {
        if let Some(c) = self.child(parent, local) {
            return Some(c);
        }
        let mut node = Node {
            local: [local.0 as u32, (local.0 >> 32) as u32],
            engine: [engine.0 as u32, (engine.0 >> 32) as u32],
            up: 0,
            first_child: NIL,
            holders: HolderSet::default(),
        };
        node.set_parent(parent);
        let id = self.alloc(node)?;
        let Some(parent) = parent else {
            let Tree { roots, chunks, .. } = self;
            roots.insert_unique(child_hash(local), id, |&c| {
                child_hash(at(chunks, c).local())
            });
            self.filed_leaf(id, None);
            return Some(id);
        };
        match self.node(parent).kids() {
            Kids::None => {
                self.node_mut(parent).set_kids(Kids::One(id));
                self.filed_leaf(id, Some(parent));
                return Some(id);
            }
            kids => {
                if kids != Kids::Wide {
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
        }
        self.filed_leaf(id, None);
        Some(id)
    }

    /// Moves `parent`'s one child into a child table, for a second to join.
    fn widen(&mut self, parent: NodeId) {
        let Kids::One(c) = self.node(parent).kids() else {
            unreachable!("only a parent of one child widens");
        };
        let mut table = HashTable::with_capacity(2);
        let chunks = &self.chunks;
        table.insert_unique(child_hash(at(chunks, c).local()), c, |&x| {
            child_hash(at(chunks, x).local())
        });
        self.node_mut(parent).set_kids(Kids::Wide);
        self.wide.insert(parent, table);
    }

    /// Takes `id` out of its parent's children and frees it; then its parent too if
    /// that held nothing and has no children left.
    pub(super) fn release(&mut self, mut id: NodeId) {
        loop {
            let n = *self.node(id);
            debug_assert!(n.holders.is_empty() && n.is_leaf());
            let parent = n.parent();
            let h = child_hash(n.local());
            match parent {
                None => {
                    let found = self.roots.find_entry(h, |&c| c == id);
                    found.expect("a root is in the root table").remove();
                }
                Some(parent) => match self.node(parent).kids() {
                    Kids::Wide => {
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
                            self.node_mut(parent).set_kids(Kids::None);
                        }
                    }
                    kids => {
                        debug_assert_eq!(kids, Kids::One(id), "a parent of one child names it");
                        self.node_mut(parent).set_kids(Kids::None);
                    }
                },
            }
            let next = self.free;
            let node = self.node_mut(id);
            node.up = (node.up & !ID_MASK) | FREE_UP;
            node.next_generation();
            node.first_child = next.map_or(NIL, |n| n.0);
            self.free = Some(id);
            self.live -= 1;
            let Some(parent) = parent else {
                return;
            };
            let p = self.node(parent);
            if !p.is_leaf() {
                return;
            }
            if !p.holders.is_empty() {
                self.leaf_again(parent);
                return;
            }
            id = parent;
        }
    }

    pub(super) fn children(&self, id: NodeId, out: &mut Vec<NodeId>) {
        match self.node(id).kids() {
            Kids::None => {}
            Kids::Wide => out.extend(self.wide[&id].iter().copied()),
            Kids::One(c) => out.push(c),
        }
    }
}
