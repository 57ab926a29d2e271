//! A query's walk down the tree: each block's holders in the shard's reply
//! encoding ([`SAME_HOLDERS`] for a repeated list). Changes nothing but the
//! use marks a bounded index evicts by.

use super::Tree;
use super::arena::{Kids, NodeId};
use crate::hash;
use crate::shard::holders::Holder;
use crate::shard::{Prompt, SAME_HOLDERS};
use crate::types::{BlockHash, SeqHash};

impl Tree {
    /// Holders of the prompt's blocks (in prefix order) as `[n, holder..]` per
    /// block, or [`SAME_HOLDERS`] for a block held exactly as the block before it
    /// (a shared prefix: the gather passes it in one step), up to and including
    /// the first block nobody holds. Blocks named by sequence hash are found by
    /// computing each candidate child's chain link. A match counts as a use of
    /// the block for a bounded index's eviction. A hybrid tree keeps the walk's
    /// nodes for [`Tree::effective`].
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
        find: impl Fn(&Self, Option<NodeId>, usize) -> Option<NodeId>,
        out: &mut Vec<u32>,
    ) {
        self.tick();
        // Kept for `effective`, which reads the same path.
        let hybrid = self.is_hybrid();
        self.walked.clear();
        let mut p = None;
        // Where the last holder list written is in `out`, and the run of the
        // last block passed.
        let mut last = 0..0;
        let mut last_run = None;
        for i in 0..n {
            let Some(id) = find(self, p, i) else {
                out.push(0);
                return;
            };
            self.mark(id);
            if hybrid {
                self.walked.push(id);
            }
            let (set, run) = self.holders_in_run(id);
            let hs = set.as_slice(&self.slab);
            let in_last_run = last_run.replace(run) == Some(run);
            if hs.len() > 1
                && self.predictions.is_empty()
                && (in_last_run || out.get(last.clone()) == Some(hs))
            {
                out.push(SAME_HOLDERS);
                p = Some(id);
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
            p = Some(id);
        }
    }

    /// The child of `p` (whose sequence hash is `parent`) with sequence hash `seq`:
    /// every candidate's chain link is computed, since a node keeps only its local
    /// hash.
    pub(super) fn child_by_seq(
        &self,
        p: Option<NodeId>,
        parent: Option<SeqHash>,
        seq: SeqHash,
    ) -> Option<NodeId> {
        let Some(p) = p else {
            // A first block's sequence hash is its local hash.
            return self.child(None, BlockHash(seq.0));
        };
        let is = |c: &NodeId| hash::chain(parent, self.node(*c).local()) == seq;
        match self.kids(p) {
            Kids::None => None,
            Kids::Wide => self.wide[&p].iter().find(|c| is(c)).copied(),
            Kids::One(c) => is(&c).then_some(c),
        }
    }
}
