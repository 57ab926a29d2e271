//! A prompt's lookup in one shard: the holders of its blocks, the tree's and
//! the keyed table's merged, answered as if every clear under way were done.
//!
//! Owns the per-block answer the gather reads ([`super::reply`] encodes it).
//! Must never change a holder: a lookup only marks its matches as used, for a
//! bounded shard's eviction.

use super::holders::Holder;
use super::{HolderLists, Prompt, Shard};
use crate::hash;
use crate::types::{IndexId, WorkerSlot};

impl Shard {
    /// Per slot of `index` in this shard with KV-cache groups besides full
    /// attention, the blocks of the prompt the last [`Self::lookup`] of `index`
    /// walked that it would reuse under their rules.
    pub fn effective(&mut self, index: IndexId, out: &mut Vec<(WorkerSlot, u32)>) {
        if let Some(ix) = self.indexes.get_mut(index.0 as usize) {
            ix.tree.effective(out);
        }
    }

    /// Holders of the prompt's blocks (in prefix order) among this shard's slots as
    /// `[n, holder..]` per block, or [`SAME_HOLDERS`] for a block held exactly as
    /// the block before it, up to and including the first block none of them
    /// holds: no worker's prefix reaches past it, so the blocks after it are not
    /// looked up. A match counts as a use of the block for a bounded shard's
    /// eviction; a predicted holder reads as the device tier it stands for.
    pub fn lookup(&mut self, index: IndexId, prompt: Prompt<'_>, out: &mut Vec<u32>) {
        let Some(ix) = self.indexes.get_mut(index.0 as usize) else {
            out.extend((!prompt.is_empty()).then_some(0));
            return;
        };
        let at = out.len();
        ix.tree.lookup(prompt, out);
        if ix.keyed.is_empty() && ix.clearing.is_none() {
            return;
        }
        let mut tree_out = std::mem::take(&mut self.merge);
        tree_out.clear();
        tree_out.extend_from_slice(&out[at..]);
        out.truncate(at);
        let seqs = match prompt {
            Prompt::Seqs(s) => s,
            Prompt::Locals(l) if !ix.keyed.is_empty() => {
                hash::seq_hashes_for_locals(l, &mut self.seqs);
                &self.seqs[..]
            }
            Prompt::Locals(_) => &[],
        };
        let clearing = ix.clearing.as_deref();
        let keep = |h: u32| match clearing {
            None => Some(h),
            // Answer as if the clears were done: without the cleared tiers.
            Some(d) => d.after(Holder(h)).map(|h| h.0),
        };
        // Per block, the tree's holders (until its answer ends) and the keyed
        // table's (a keyed block may follow one the tree holds).
        let mut tree_lists = HolderLists::new(&tree_out);
        for i in 0..prompt.len() {
            let head = out.len();
            out.push(0);
            if let Some((hs, _)) = tree_lists.next() {
                out.extend(hs.iter().filter_map(|&h| keep(h)));
            }
            if let Some(hs) = seqs.get(i).and_then(|s| ix.keyed.matched(s)) {
                out.extend(hs.iter().filter_map(|&h| keep(h)));
            }
            let n = out.len() - head - 1;
            out[head] = n as u32;
            if n == 0 {
                break;
            }
        }
        self.merge = tree_out;
    }
}
