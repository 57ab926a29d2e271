//! The node arena of a [`Tree`]: nodes in chunks that never move, a free list
//! through the freed ones, each node's generation, and each parent's children
//! (one named in the node, more in a child table found by local hash).
//!
//! Owns what a node id and a reference's generation mean. Never decides what a
//! node holds or which names point at it: a node is released only once its
//! caller has emptied it, and a release ends every reference taken to it.

use super::Tree;
use crate::shard::holders::{HolderSet, HolderSlab};
use crate::types::{BlockHash, EngineHash, WorkerSlot};
use hashbrown::HashTable;

/// No node: a root's parent, a leaf's child, the end of the free list.
pub(super) const NIL: u32 = u32::MAX;
/// In `first_child`: the children (two or more) are in the parent's child table.
pub(super) const WIDE: u32 = u32::MAX - 1;
/// A parent, for a node on the free list.
pub(super) const FREE: u32 = u32::MAX - 1;
/// Node ids fit in 28 bits (268M nodes an index shard); the top 4 bits of a
/// reference to a node, and of the node's `up` word, are its generation, which
/// changes each time the node stops holding anything: a reference taken before
/// names nothing once it does.
const ID_BITS: u32 = 28;
pub(super) const ID_MASK: u32 = (1 << ID_BITS) - 1;
const NIL_UP: u32 = ID_MASK;
const FREE_UP: u32 = ID_MASK - 1;

/// Nodes per arena chunk: the arena grows a chunk at a time, never copying.
pub(super) const CHUNK_BITS: u32 = 14;
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;

/// One block. The hashes are two halves each so that a node is 4-byte aligned:
/// 28 bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    pub(super) local: [u32; 2],
    /// The engine hash the block was stored under while no slot held it on a
    /// medium: the key of the slots' 4-byte names for it.
    pub(super) engine: [u32; 2],
    /// Generation (top 4 bits) and parent (NIL_UP: a root, FREE_UP: on the free
    /// list).
    up: u32,
    /// NIL, the one child, or WIDE; on the free list, the next free node.
    pub(super) first_child: u32,
    pub(super) holders: HolderSet,
}

const _: () = assert!(std::mem::size_of::<Node>() == 28);

impl Node {
    #[inline]
    pub(super) fn local(&self) -> BlockHash {
        BlockHash(self.local[0] as u64 | (self.local[1] as u64) << 32)
    }

    #[inline]
    pub(super) fn engine(&self) -> EngineHash {
        EngineHash(self.engine[0] as u64 | (self.engine[1] as u64) << 32)
    }

    pub(super) fn set_engine(&mut self, eh: EngineHash) {
        self.engine = [eh.0 as u32, (eh.0 >> 32) as u32];
    }

    /// The parent's id: NIL for a root, FREE for a node on the free list.
    #[inline]
    pub(super) fn parent(&self) -> u32 {
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
    pub(super) fn next_generation(&mut self) {
        self.up = self.up.wrapping_add(1 << ID_BITS);
    }

    /// A reference to this node, which is `id`, as it is now.
    pub(super) fn reference(&self, id: u32) -> u32 {
        (self.up & !ID_MASK) | id
    }

    /// Whether `reference` (taken by `slot`) still names this node: the same
    /// generation, not freed, and the slot holds it.
    pub(super) fn named_by(&self, reference: u32, slot: WorkerSlot, slab: &HolderSlab) -> bool {
        self.reference(reference & ID_MASK) == reference
            && self.parent() != FREE
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
pub(super) fn at(chunks: &[Vec<Node>], id: u32) -> &Node {
    &chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
}

#[inline]
pub(super) fn at_mut(chunks: &mut [Vec<Node>], id: u32) -> &mut Node {
    &mut chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
}

impl Tree {
    #[inline]
    pub(super) fn node(&self, id: u32) -> &Node {
        at(&self.chunks, id)
    }

    #[inline]
    pub(super) fn node_mut(&mut self, id: u32) -> &mut Node {
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
    pub(super) fn filed(&self) -> usize {
        self.chunks
            .last()
            .map_or(0, |c| ((self.chunks.len() - 1) << CHUNK_BITS) + c.len())
    }

    /// The child of `parent` (NIL: a first block) with local hash `local`.
    #[inline]
    pub(super) fn child(&self, parent: u32, local: BlockHash) -> Option<u32> {
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
    pub(super) fn child_or_insert(
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
    pub(super) fn release(&mut self, mut id: u32) {
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

    pub(super) fn children(&self, id: u32, out: &mut Vec<u32>) {
        match self.node(id).first_child {
            NIL => {}
            WIDE => out.extend(self.wide[&id].iter().copied()),
            c => out.push(c),
        }
    }
}
