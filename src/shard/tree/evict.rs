//! A bounded index's eviction: a use clock per node and a sampled LRU over the
//! arena's leaves. Decides which block goes, never when (the shard's block
//! budget does), and takes only leaves, so that what it evicts is freed.

use super::Tree;
use super::arena::{NodeId, at_mut};
use crate::shard::holders::Holder;
use crate::types::Tier;

/// Leaves an eviction compares, the least recently used of which goes.
const EVICT_SAMPLE: usize = 16;

impl Tree {
    /// From now on, note which blocks are stored, predicted or matched, so that
    /// [`Self::evict`] can pick one that was not lately.
    pub fn track_use(&mut self) {
        self.tracking = true;
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
    pub(super) fn next_victim(&mut self) -> Option<NodeId> {
        let end = self.filed() as u32;
        if end == 0 {
            return None;
        }
        let (mut best, mut best_age, mut seen) = (None, 0u32, 0);
        let mut id = self.hand.min(end - 1);
        for _ in 0..end {
            let n = self.node(NodeId::at_index(id));
            if !n.is_free() && n.is_leaf() {
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
        Some(NodeId::at_index(victim))
    }

    pub(super) fn evict_node(&mut self, id: NodeId) -> usize {
        let mut holders = std::mem::take(&mut self.scratch);
        holders.clear();
        holders.extend_from_slice(self.node(id).holders.as_slice(&self.slab));
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
        }
        let Tree { chunks, slab, .. } = self;
        at_mut(chunks, id).holders.free(slab);
        self.emptied(id);
        let n = holders.len();
        self.scratch = holders;
        n
    }
}
