//! A bounded index's eviction: a use clock per node and a sampled LRU over a
//! queue of the tree's leaves. Decides which block goes, never when (the
//! shard's block budget does), and takes only leaves, so that what it evicts
//! is freed.
//!
//! Every live leaf is in the queue ([`Leaves`]): a node is queued at the back
//! when it is filed (a new node has no children) and at the front when it
//! becomes a leaf again (its last child went, usually a block as old as the
//! child, so a prompt is evicted from its end while it is the oldest). A node
//! that gains a child stays queued and is dropped when the queue reaches it
//! (the one just queued, a chain's previous block, is dropped at once). So a
//! victim costs a bounded number of queue steps, each paid for by the change
//! that queued it, never a walk of the arena: a chain of a million blocks has
//! one leaf, found at once.

use super::Tree;
use super::arena::{NodeId, get};
use crate::shard::holders::Holder;
use crate::types::Tier;
use std::collections::VecDeque;

/// Leaves an eviction compares, the least recently used of which goes.
const EVICT_SAMPLE: usize = 16;

/// The leaves eviction picks from, by node id, each at most once: every live
/// leaf, and nodes that stopped being one (or were freed) since they were
/// queued. Empty unless the tree tracks use.
#[derive(Default)]
pub(super) struct Leaves {
    queue: VecDeque<u32>,
    /// One bit per node id: the id is in `queue`.
    queued: Vec<u64>,
}

impl Leaves {
    fn is_queued(&self, i: u32) -> bool {
        self.queued
            .get(i as usize / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn flag(&mut self, i: u32, on: bool) {
        let w = i as usize / 64;
        if self.queued.len() <= w {
            self.queued.resize((w + 1).next_power_of_two(), 0);
        }
        if on {
            self.queued[w] |= 1 << (i % 64);
        } else {
            self.queued[w] &= !(1 << (i % 64));
        }
    }

    fn push_back(&mut self, i: u32) {
        if !self.is_queued(i) {
            self.flag(i, true);
            self.queue.push_back(i);
        }
    }

    fn push_front(&mut self, i: u32) {
        if !self.is_queued(i) {
            self.flag(i, true);
            self.queue.push_front(i);
        }
    }

    /// Takes `i` off the back, if it is there.
    fn drop_back(&mut self, i: u32) {
        if self.queue.back() == Some(&i) {
            self.queue.pop_back();
            self.flag(i, false);
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.queue.capacity() * 4 + self.queued.capacity() * 8
    }
}

impl Tree {
    /// From now on, note which blocks are stored, predicted or matched, so that
    /// [`Self::evict`] can pick one that was not lately.
    pub fn track_use(&mut self) {
        if self.tracking {
            return;
        }
        self.tracking = true;
        // Leaves filed before: one walk, once.
        for i in 0..self.filed() as u32 {
            let id = NodeId::at_index(i);
            if !self.node(id).is_free() && self.is_leaf(id) {
                self.leaves.push_back(i);
            }
        }
    }

    /// A store, prediction or match of `id` now.
    #[inline]
    pub(super) fn mark(&mut self, id: NodeId) {
        if self.tracking {
            let i = id.index() as usize;
            if self.used.len() <= i {
                self.used.resize((i + 1).next_power_of_two(), 0);
            }
            self.used[i] = self.clock;
        }
    }

    /// A new store run, prediction or lookup: what it touches is newer than
    /// anything before.
    #[inline]
    pub(super) fn tick(&mut self) {
        if self.tracking {
            self.clock = self.clock.wrapping_add(1);
        }
    }

    /// `id` was just filed (a leaf); `parent` stopped being one with it.
    #[inline]
    pub(super) fn filed_leaf(&mut self, id: NodeId, parent: Option<NodeId>) {
        if self.tracking {
            if let Some(p) = parent {
                self.leaves.drop_back(p.index());
            }
            self.leaves.push_back(id.index());
        }
    }

    /// `id`, which holds something, lost its last child.
    #[inline]
    pub(super) fn leaf_again(&mut self, id: NodeId) {
        if self.tracking {
            self.leaves.push_front(id.index());
        }
    }

    /// Evicts the block least recently stored, predicted or matched among the
    /// next [`EVICT_SAMPLE`] leaves of the queue, with every holder: only blocks
    /// nothing hangs from, so the memory is freed (a parent becomes one once
    /// its children go). Its engine hashes are left to name nothing (their
    /// references are of an older generation). Returns the (block, holder)
    /// pairs evicted, or `None` if nothing can be.
    pub fn evict(&mut self) -> Option<usize> {
        let id = self.next_victim()?;
        Some(self.evict_node(id))
    }

    /// The oldest of the next [`EVICT_SAMPLE`] leaves of the queue (the first
    /// of equals), dropping the queued nodes that are leaves no more. The
    /// leaves sampled before it go to the back (passed over until the queue
    /// comes round); it and those after it stay in front, so they are sampled
    /// again by the next eviction (the victim's entry is dropped then).
    pub(super) fn next_victim(&mut self) -> Option<NodeId> {
        let mut sample = [0u32; EVICT_SAMPLE];
        let mut n = 0;
        while n < EVICT_SAMPLE {
            let Some(i) = self.leaves.queue.pop_front() else {
                break;
            };
            let id = NodeId::at_index(i);
            if get(&self.chunks, id).is_some_and(|x| !x.is_free()) && self.is_leaf(id) {
                sample[n] = i;
                n += 1;
            } else {
                self.leaves.flag(i, false);
            }
        }
        let age = |i: u32| {
            let last = self.used.get(i as usize).copied().unwrap_or(0);
            self.clock.wrapping_sub(last)
        };
        let mut victim = 0;
        for k in 1..n {
            if age(sample[k]) > age(sample[victim]) {
                victim = k;
            }
        }
        for &i in sample[victim..n].iter().rev() {
            self.leaves.queue.push_front(i);
        }
        for &i in &sample[..victim] {
            self.leaves.queue.push_back(i);
        }
        (n > 0).then(|| NodeId::at_index(sample[victim]))
    }

    pub(super) fn evict_node(&mut self, id: NodeId) -> usize {
        let mut holders = std::mem::take(&mut self.scratch);
        holders.clear();
        holders.extend_from_slice(self.holders(id).as_slice(&self.slab));
        for &h in &holders {
            let h = Holder(h);
            self.held.slot(h.slot(), -1);
            self.held.remove(h.tiers());
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
            self.aliases.remove(&(h.slot(), id));
            self.drop_groups(h.slot(), id);
        }
        self.evict_leaf(id);
        let n = holders.len();
        self.scratch = holders;
        n
    }

    /// Whether every live leaf is queued for eviction (when tracking): the
    /// invariant that lets an eviction find a victim without a walk.
    #[cfg(test)]
    pub(super) fn leaves_queued(&self) -> bool {
        !self.tracking
            || (0..self.filed() as u32).all(|i| {
                let id = NodeId::at_index(i);
                self.node(id).is_free() || !self.is_leaf(id) || self.leaves.is_queued(i)
            })
    }
}
