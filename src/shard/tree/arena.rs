//! The node arena of a [`Tree`]: nodes in chunks that never move, runs of them
//! that share their links and holders, a free list through the freed nodes,
//! each node's generation, and each parent's children (one named in its run,
//! more in a child table found by local hash).
//!
//! A node is its two hashes and one word: its generation and its run (20 bytes).
//! A run is nodes `start..start + len` in the arena, each but the first the only
//! child of the one before it, all with the same holders: it keeps the first
//! one's parent, the last one's children and the holders once. A prompt's blocks
//! are filed together and stored and evicted by the same workers, so a run spans
//! hundreds of blocks, and a block costs its hashes and little more. A change to
//! one node's holders takes it out of its run first (the smaller side of each
//! cut moves to a new run), and a run joins its neighbour again once their
//! holders are the same set. A new node is filed right after its parent when
//! that place is free, so that a chain stays one run.
//!
//! Owns what a node id ([`NodeId`]) and a reference ([`NodeRef`]: an id and a
//! generation) mean, and the packed words a node and a run keep them in. Never
//! decides what a node holds or which names point at it: a node is released only
//! once its caller has emptied it, and a release ends every reference taken to it.

use super::Tree;
use crate::shard::holders::{HolderSet, HolderSlab};
use crate::types::{BlockHash, EngineHash, TierSet, WorkerSlot};
use hashbrown::HashTable;

/// In a run's `kids`: no child (in a free node's links: none).
const NIL: u32 = u32::MAX;
/// In a run's `kids`: the children (two or more) are in the parent's child
/// table.
const WIDE: u32 = u32::MAX - 1;
/// Node and run ids fit in 28 bits (268M nodes an index shard); the top 4 bits
/// of a reference to a node, and of the node's `meta` word, are its generation,
/// which changes each time the node stops holding anything: a reference taken
/// before names nothing once it does.
const ID_BITS: u32 = 28;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
/// In a run's `up`: the first node is a root.
const NIL_UP: u32 = ID_MASK;
/// In a node's `meta`: the node is on the free list.
const FREE_RUN: u32 = ID_MASK;
/// The most nodes an arena files (every id below [`NIL_UP`]).
const MAX_NODES: u32 = ID_MASK - 1;

/// The most nodes in one run. A change to one node's holders moves at most half
/// a run's nodes to another, so this bounds the work one event can cost however
/// long a chain an engine stores; a run this long costs its nodes a byte each in
/// 1/50 of one.
const RUN_MAX: u32 = 1 << 10;

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
/// generation moves on ([`named_by`]).
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

/// A node's children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kids {
    None,
    One(NodeId),
    /// Two or more, in the parent's child table.
    Wide,
}

impl Kids {
    fn word(self) -> u32 {
        match self {
            Kids::None => NIL,
            Kids::Wide => WIDE,
            Kids::One(c) => c.0,
        }
    }

    fn of(w: u32) -> Kids {
        match w {
            NIL => Kids::None,
            WIDE => Kids::Wide,
            c => Kids::One(NodeId(c)),
        }
    }
}

/// One block. The hashes are two halves each so that a node is 4-byte aligned:
/// 20 bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    /// The local hash; on the free list, the previous and next free node (or NIL).
    local: [u32; 2],
    /// The engine hash the block was stored under while no slot held it on a
    /// medium: the key of the slots' 4-byte names for it.
    pub(super) engine: [u32; 2],
    /// Generation (top 4 bits) and run (FREE_RUN: on the free list).
    meta: u32,
}

const _: () = assert!(std::mem::size_of::<Node>() == 20);

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

    /// On the free list: its words other than `meta` are links, or stale.
    #[inline]
    pub(super) fn is_free(&self) -> bool {
        self.meta & ID_MASK == FREE_RUN
    }

    #[inline]
    fn run(&self) -> usize {
        (self.meta & ID_MASK) as usize
    }

    fn set_run(&mut self, run: u32) {
        self.meta = (self.meta & !ID_MASK) | run;
    }

    /// References taken so far name nothing any more.
    pub(super) fn next_generation(&mut self) {
        self.meta = self.meta.wrapping_add(1 << ID_BITS);
    }

    /// A reference to this node, which is `id`, as it is now.
    #[inline]
    pub(super) fn reference(&self, id: NodeId) -> NodeRef {
        NodeRef((self.meta & !ID_MASK) | id.0)
    }
}

/// Nodes `start..start + len` of the arena: each but the first the only child
/// of the one before, all with `holders`. 20 bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Run {
    /// The first node; on the free list, the next free run (or NIL).
    start: u32,
    len: u32,
    /// The first node's parent (NIL_UP: a root).
    up: u32,
    /// The last node's children, as [`Kids::word`] writes them.
    kids: u32,
    holders: HolderSet,
}

impl Run {
    #[inline]
    fn last(&self) -> u32 {
        self.start + self.len - 1
    }
}

/// A tree's runs, by the number a node's `meta` names, with a free list.
#[derive(Default)]
pub(super) struct Runs {
    v: Vec<Run>,
    free: Option<u32>,
}

impl Runs {
    fn alloc(&mut self, run: Run) -> u32 {
        if let Some(r) = self.free {
            let next = self.v[r as usize].start;
            self.free = (next != NIL).then_some(next);
            self.v[r as usize] = run;
            return r;
        }
        self.v.push(run);
        (self.v.len() - 1) as u32
    }

    fn release(&mut self, r: usize) {
        self.v[r].start = self.free.unwrap_or(NIL);
        self.v[r].holders = HolderSet::default();
        self.free = Some(r as u32);
    }

    #[inline]
    fn of(&self, chunks: &[Vec<Node>], id: NodeId) -> &Run {
        &self.v[at(chunks, id).run()]
    }

    /// Runs in use (a tree's test checks them).
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        let mut free = 0;
        let mut r = self.free;
        while let Some(i) = r {
            free += 1;
            let next = self.v[i as usize].start;
            r = (next != NIL).then_some(next);
        }
        self.v.len() - free
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.v.capacity() * std::mem::size_of::<Run>()
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

/// The holders of live node `id`.
#[inline]
pub(super) fn holders_at<'r>(chunks: &[Vec<Node>], runs: &'r Runs, id: NodeId) -> &'r HolderSet {
    &runs.of(chunks, id).holders
}

/// Whether `reference` (taken by `slot`) still names its node: the same
/// generation, not freed, and the slot holds it.
#[inline]
pub(super) fn named_by(
    chunks: &[Vec<Node>],
    runs: &Runs,
    slab: &HolderSlab,
    reference: NodeRef,
    slot: WorkerSlot,
) -> bool {
    let id = reference.id();
    let n = at(chunks, id);
    n.reference(id) == reference
        && !n.is_free()
        && !runs.v[n.run()].holders.tiers_of(slot, slab).is_empty()
}

/// Changes the holders of live node `id` by `change`: the node leaves its run
/// for one of its own (the cuts' smaller sides move), takes the change, and
/// joins the runs beside it that have the same holders now.
pub(super) fn change_holders<R>(
    chunks: &mut [Vec<Node>],
    runs: &mut Runs,
    slab: &mut HolderSlab,
    id: NodeId,
    change: impl FnOnce(&mut HolderSet, &mut HolderSlab) -> R,
) -> R {
    isolate(chunks, runs, slab, id);
    let r = at(chunks, id).run();
    let out = change(&mut runs.v[r].holders, slab);
    join_around(chunks, runs, slab, id);
    out
}

/// Takes `tiers` off `slot`'s hold of live node `id` ([`HolderSet::remove`]'s
/// answer); a node the slot holds on none of them keeps its run.
pub(super) fn remove_tiers(
    chunks: &mut [Vec<Node>],
    runs: &mut Runs,
    slab: &mut HolderSlab,
    id: NodeId,
    slot: WorkerSlot,
    tiers: TierSet,
) -> (TierSet, bool) {
    if (holders_at(chunks, runs, id).tiers_of(slot, slab) & tiers).is_empty() {
        return (TierSet::NONE, false);
    }
    change_holders(chunks, runs, slab, id, |h, slab| {
        h.remove(slot, tiers, slab)
    })
}

/// `id` alone in its run.
fn isolate(chunks: &mut [Vec<Node>], runs: &mut Runs, slab: &mut HolderSlab, id: NodeId) {
    let run = *runs.of(chunks, id);
    if run.len == 1 {
        return;
    }
    if id.0 > run.start {
        cut_after(chunks, runs, slab, NodeId(id.0 - 1));
    }
    if id.0 < runs.of(chunks, id).last() {
        cut_after(chunks, runs, slab, id);
    }
}

/// Ends `p`'s run at `p` (it must not be the run's last): the nodes after it
/// become a run of their own with the same holders. The smaller side takes the
/// new run, so a cut moves at most half the run's nodes.
fn cut_after(chunks: &mut [Vec<Node>], runs: &mut Runs, slab: &mut HolderSlab, p: NodeId) {
    let r = at(chunks, p).run();
    let run = runs.v[r];
    debug_assert!(p.0 >= run.start && p.0 < run.last(), "a cut inside the run");
    let left = Run {
        len: p.0 - run.start + 1,
        kids: p.0 + 1,
        ..run
    };
    let right = Run {
        start: p.0 + 1,
        len: run.last() - p.0,
        up: p.0,
        kids: run.kids,
        holders: run.holders.share(slab),
    };
    let (keep, moved) = if left.len >= right.len {
        (left, right)
    } else {
        (right, left)
    };
    runs.v[r] = keep;
    let m = runs.alloc(moved);
    repoint(chunks, moved.start..moved.start + moved.len, m);
}

/// `id`'s run joins the run before it and the one after, where one is the
/// other's continuation and their holders are the same set.
fn join_around(chunks: &mut [Vec<Node>], runs: &mut Runs, slab: &mut HolderSlab, id: NodeId) {
    let r = at(chunks, id).run();
    let run = runs.v[r];
    if run.start == id.0 && run.up == id.0.wrapping_sub(1) {
        let q = at(chunks, NodeId(run.up)).run();
        let prev = runs.v[q];
        if prev.kids == id.0 && prev.holders.same_as(&run.holders) && prev.len + run.len <= RUN_MAX
        {
            join(chunks, runs, slab, q, r);
        }
    }
    let r = at(chunks, id).run();
    let run = runs.v[r];
    if run.kids == run.last() + 1 {
        let q = at(chunks, NodeId(run.kids)).run();
        let next = runs.v[q];
        if next.holders.same_as(&run.holders) && run.len + next.len <= RUN_MAX {
            join(chunks, runs, slab, r, q);
        }
    }
}

/// Run `b` continues run `a` (its first node the only child of `a`'s last) with
/// the same holders: one run now. The shorter one's nodes move.
fn join(chunks: &mut [Vec<Node>], runs: &mut Runs, slab: &mut HolderSlab, a: usize, b: usize) {
    let (ra, mut rb) = (runs.v[a], runs.v[b]);
    debug_assert!(ra.kids == rb.start && rb.up == ra.last() && ra.last() + 1 == rb.start);
    rb.holders.free(slab);
    let joined = Run {
        len: ra.len + rb.len,
        kids: rb.kids,
        ..ra
    };
    let (keep, gone, moved) = if ra.len >= rb.len {
        (a, b, rb.start..rb.start + rb.len)
    } else {
        (b, a, ra.start..ra.start + ra.len)
    };
    runs.v[keep] = joined;
    runs.release(gone);
    repoint(chunks, moved, keep as u32);
}

fn repoint(chunks: &mut [Vec<Node>], ids: std::ops::Range<u32>, run: u32) {
    for i in ids {
        at_mut(chunks, NodeId(i)).set_run(run);
    }
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

    /// The holders of live node `id`.
    #[inline]
    pub(super) fn holders(&self, id: NodeId) -> &HolderSet {
        holders_at(&self.chunks, &self.runs, id)
    }

    /// The holders of live node `id` and the run it is in: nodes of one run have
    /// the same holders.
    #[inline]
    pub(super) fn holders_in_run(&self, id: NodeId) -> (&HolderSet, usize) {
        let r = self.node(id).run();
        (&self.runs.v[r].holders, r)
    }

    /// Changes the holders of live node `id` (see [`change_holders`]).
    pub(super) fn with_holders<R>(
        &mut self,
        id: NodeId,
        change: impl FnOnce(&mut HolderSet, &mut HolderSlab) -> R,
    ) -> R {
        let Tree {
            chunks, runs, slab, ..
        } = self;
        change_holders(chunks, runs, slab, id, change)
    }

    /// The parent of live node `id`; `None` for a root.
    #[inline]
    pub(super) fn parent(&self, id: NodeId) -> Option<NodeId> {
        debug_assert!(!self.node(id).is_free(), "a free node has no parent");
        let run = self.runs.of(&self.chunks, id);
        if id.0 != run.start {
            return Some(NodeId(id.0 - 1));
        }
        (run.up != NIL_UP).then_some(NodeId(run.up))
    }

    /// A live first block.
    #[inline]
    pub(super) fn is_root(&self, id: NodeId) -> bool {
        !self.node(id).is_free() && self.parent(id).is_none()
    }

    /// The children of live node `id`.
    #[inline]
    pub(super) fn kids(&self, id: NodeId) -> Kids {
        let run = self.runs.of(&self.chunks, id);
        if id.0 == run.last() {
            Kids::of(run.kids)
        } else {
            Kids::One(NodeId(id.0 + 1))
        }
    }

    /// Live node `id` has no children.
    #[inline]
    pub(super) fn is_leaf(&self, id: NodeId) -> bool {
        self.kids(id) == Kids::None
    }

    /// The children of `p`, the last node of its run, are `kids` now.
    fn set_kids(&mut self, p: NodeId, kids: Kids) {
        let r = self.node(p).run();
        debug_assert_eq!(
            self.runs.v[r].last(),
            p.0,
            "only a run's last node names children"
        );
        self.runs.v[r].kids = kids.word();
    }

    /// Takes free node `q` off the free list.
    fn unlink(&mut self, q: NodeId) {
        self.free_len -= 1;
        let [prev, next] = self.node(q).local;
        match prev {
            NIL => self.free = (next != NIL).then_some(NodeId(next)),
            p => self.node_mut(NodeId(p)).local[1] = next,
        }
        if next != NIL {
            self.node_mut(NodeId(next)).local[0] = prev;
        }
    }

    /// A free node for a child of `parent`: the place right after the parent if
    /// that is free, or the arena's end (the chain then stays one run) while at
    /// most an eighth of the arena is free; else the free list's first, else the
    /// arena's end. `None` once the arena holds as many nodes as ids can name.
    fn place(&mut self, parent: Option<NodeId>) -> Option<NodeId> {
        let filed = self.filed();
        if let Some(p) = parent {
            let q = NodeId(p.0 + 1);
            if get(&self.chunks, q).is_some_and(Node::is_free) {
                self.unlink(q);
                return Some(q);
            }
        }
        // A chain growing at the end would otherwise grow the arena past its
        // freed nodes for as long as it is extended.
        let at_end =
            parent.is_some_and(|p| p.0 as usize + 1 == filed) && self.free_len * 8 <= filed;
        if let Some(h) = self.free.filter(|_| !at_end) {
            self.unlink(h);
            return Some(h);
        }
        if filed >= self.node_limit.unwrap_or(MAX_NODES) as usize {
            return self.free.inspect(|&h| self.unlink(h));
        }
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut()?.push(Node {
            local: [NIL; 2],
            engine: [0; 2],
            meta: FREE_RUN,
        });
        Some(NodeId(filed as u32))
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
        match self.kids(parent) {
            Kids::None => None,
            Kids::Wide => self.wide[&parent]
                .find(child_hash(local), |&c| self.node(c).local() == local)
                .copied(),
            Kids::One(c) => (self.node(c).local() == local).then_some(c),
        }
    }

    /// The child of `parent` with local hash `local`, filed if new with `engine` as
    /// its engine hash and no holders (`None`: new, and the arena is full).
    pub(super) fn child_or_insert(
        &mut self,
        parent: Option<NodeId>,
        local: BlockHash,
        engine: EngineHash,
    ) -> Option<NodeId> {
        if let Some(c) = self.child(parent, local) {
            return Some(c);
        }
        self.file_node(parent, local, engine, HolderSet::default())
    }

    /// Files a new child of `parent` (`None`: a root) of `local` and `engine`,
    /// held by `holders` (none, or one: a set that needs no slab), and returns
    /// its id; `None` once the arena holds as many nodes as ids can name. A node
    /// filed right after a parent that ends its run with the same holders
    /// continues that run.
    pub(super) fn file_node(
        &mut self,
        parent: Option<NodeId>,
        local: BlockHash,
        engine: EngineHash,
        holders: HolderSet,
    ) -> Option<NodeId> {
        let id = self.place(parent)?;
        self.live += 1;
        let n = self.node_mut(id);
        n.local = [local.0 as u32, (local.0 >> 32) as u32];
        n.set_engine(engine);
        if let Some(parent) = parent {
            let r = self.node(parent).run();
            let up = self.runs.v[r];
            if up.last() == parent.0
                && up.kids == NIL
                && up.len < RUN_MAX
                && id.0 == parent.0 + 1
                && up.holders.same_as(&holders)
            {
                self.runs.v[r].len += 1;
                self.node_mut(id).set_run(r as u32);
                self.filed_leaf(id, Some(parent));
                return Some(id);
            }
        }
        let run = self.runs.alloc(Run {
            start: id.0,
            len: 1,
            up: parent.map_or(NIL_UP, |p| p.0),
            kids: NIL,
            holders,
        });
        self.node_mut(id).set_run(run);
        let Some(parent) = parent else {
            let Tree { roots, chunks, .. } = self;
            roots.insert_unique(child_hash(local), id, |&c| {
                child_hash(at(chunks, c).local())
            });
            self.filed_leaf(id, None);
            return Some(id);
        };
        match self.kids(parent) {
            Kids::None => {
                self.set_kids(parent, Kids::One(id));
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

    /// Moves `parent`'s one child into a child table, for a second to join; the
    /// parent ends its run first.
    fn widen(&mut self, parent: NodeId) {
        if self.runs.of(&self.chunks, parent).last() != parent.0 {
            let Tree {
                chunks, runs, slab, ..
            } = self;
            cut_after(chunks, runs, slab, parent);
        }
        let Kids::One(c) = self.kids(parent) else {
            unreachable!("only a parent of one child widens");
        };
        let mut table = HashTable::with_capacity(2);
        let chunks = &self.chunks;
        table.insert_unique(child_hash(at(chunks, c).local()), c, |&x| {
            child_hash(at(chunks, x).local())
        });
        self.set_kids(parent, Kids::Wide);
        self.wide.insert(parent, table);
    }

    /// Takes `id` out of its parent's children and frees it; then its parent too if
    /// that held nothing and has no children left.
    pub(super) fn release(&mut self, mut id: NodeId) {
        loop {
            let r = self.node(id).run();
            let run = self.runs.v[r];
            debug_assert!(run.holders.is_empty() && run.last() == id.0 && run.kids == NIL);
            let parent = self.parent(id);
            if run.len > 1 {
                // Its parent is the node before it, which ends the run now.
                self.runs.v[r].len -= 1;
                self.runs.v[r].kids = NIL;
            } else {
                self.runs.release(r);
                let h = child_hash(self.node(id).local());
                match parent {
                    None => {
                        let found = self.roots.find_entry(h, |&c| c == id);
                        found.expect("a root is in the root table").remove();
                    }
                    Some(parent) => match self.kids(parent) {
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
                                self.set_kids(parent, Kids::None);
                            }
                        }
                        kids => {
                            debug_assert_eq!(kids, Kids::One(id), "a parent of one child names it");
                            self.set_kids(parent, Kids::None);
                        }
                    },
                }
            }
            self.free_node(id);
            let Some(parent) = parent else {
                return;
            };
            if !self.is_leaf(parent) {
                return;
            }
            if !self.holders(parent).is_empty() {
                self.leaf_again(parent);
                return;
            }
            id = parent;
        }
    }

    /// Frees leaf `id` with its hold (an eviction, whose caller has ended every
    /// holder's names and counts): the last node of a longer run leaves the run
    /// to its parent, which holds alike and is a leaf now; a node alone in its
    /// run gives its holder set back and goes as any released node does.
    pub(super) fn evict_leaf(&mut self, id: NodeId) {
        let r = self.node(id).run();
        let run = self.runs.v[r];
        debug_assert!(run.last() == id.0 && run.kids == NIL, "a leaf ends its run");
        if run.len == 1 {
            let Tree { runs, slab, .. } = self;
            runs.v[r].holders.free(slab);
            self.release(id);
            return;
        }
        self.runs.v[r].len -= 1;
        self.free_node(id);
        let parent = NodeId(id.0 - 1);
        if !run.holders.is_empty() {
            self.leaf_again(parent);
        } else {
            self.release(parent);
        }
    }

    /// Puts `id`, out of every run and child table, on the free list: references
    /// taken to it end.
    fn free_node(&mut self, id: NodeId) {
        let next = self.free;
        let node = self.node_mut(id);
        node.meta = (node.meta & !ID_MASK) | FREE_RUN;
        node.next_generation();
        node.local = [NIL, next.map_or(NIL, |n| n.0)];
        if let Some(n) = next {
            self.node_mut(n).local[0] = id.0;
        }
        self.free = Some(id);
        self.free_len += 1;
        self.live -= 1;
    }

    pub(super) fn children(&self, id: NodeId, out: &mut Vec<NodeId>) {
        match self.kids(id) {
            Kids::None => {}
            Kids::Wide => out.extend(self.wide[&id].iter().copied()),
            Kids::One(c) => out.push(c),
        }
    }
}

#[cfg(test)]
impl Tree {
    /// Whether the runs describe the tree: every live node is in the run its
    /// word names, a run's nodes are live and chained, its first names its
    /// parent's run as continued by it or not, and the runs in use are as many
    /// as the runs the nodes name.
    pub(super) fn runs_hold(&self) -> bool {
        let mut named = hashbrown::HashSet::new();
        for i in 0..self.filed() as u32 {
            let id = NodeId(i);
            let n = self.node(id);
            if n.is_free() {
                continue;
            }
            let run = self.runs.v[n.run()];
            if i < run.start || i > run.last() || run.len > RUN_MAX {
                return false;
            }
            named.insert(n.run());
        }
        for &r in &named {
            let run = self.runs.v[r];
            let inside = (run.start..=run.last()).all(|i| {
                let n = self.node(NodeId(i));
                !n.is_free() && n.run() == r
            });
            let linked = match run.up {
                NIL_UP => self.roots.iter().any(|&c| c.0 == run.start),
                p => match self.kids(NodeId(p)) {
                    Kids::One(c) => c.0 == run.start,
                    Kids::Wide => self.wide[&NodeId(p)].iter().any(|&c| c.0 == run.start),
                    Kids::None => false,
                },
            };
            if !inside || !linked {
                return false;
            }
        }
        let free = (0..self.filed() as u32)
            .filter(|&i| self.node(NodeId(i)).is_free())
            .count();
        named.len() == self.runs.live() && free == self.free_len
    }
}
