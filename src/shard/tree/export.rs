//! The tree read out in steps (every block held, parents first, its sequence
//! hash computed on the way down) and filed back from such a read-out
//! ([`Tree::seed`]). An export step never changes the tree; between steps it keeps
//! where it got to by local hash, since nodes come and go meanwhile.

use super::Tree;
use super::arena::NodeId;
use crate::hash;
use crate::shard::ExportedBlock;
use crate::shard::holders::Holder;
use crate::types::{BlockHash, EngineHash, SeqHash, Tier, TierSet, WorkerSlot};
use hashbrown::HashMap;

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

/// Where an export in steps ([`Tree::export_step`]) has got to; the default starts one.
#[derive(Clone, Debug, Default)]
pub struct ExportWalk {
    /// Per level of the depth-first walk (children in local-hash order), the last
    /// block passed, if any: local hashes stay valid while nodes come and go.
    at: Vec<Option<BlockHash>>,
    /// The roots as the walk found them, sorted by local hash once (a tree may have
    /// a root per conversation): each is checked to be that root still when its
    /// turn comes, and a root filed since is not seen.
    roots: Vec<NodeId>,
    root_locals: Vec<BlockHash>,
    started: bool,
    done: bool,
}

/// One level of an export's walk: the children of a block (sorted by local hash, in
/// `Walking::kids[start..end]`), the next to visit, and their parent's sequence
/// hash.
struct Frame {
    seq: Option<SeqHash>,
    start: usize,
    end: usize,
    next: usize,
}

/// An export step's depth-first stack: the levels' children in one buffer, each
/// level's above the next's (a level ends by truncating the buffer to its start).
#[derive(Default)]
struct Walking {
    frames: Vec<Frame>,
    kids: Vec<NodeId>,
}

impl Walking {
    /// Pushes a level below the roots: `id`'s children, sorted by local hash.
    fn push(&mut self, tree: &Tree, id: NodeId, seq: Option<SeqHash>) {
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

impl Tree {
    /// Every (block, holder) with the block's sequence and parent hashes, in one go.
    pub fn export(&self, out: &mut Vec<ExportedBlock>) {
        let mut walk = ExportWalk::default();
        while !self.export_step(&mut walk, usize::MAX, out) {}
    }

    /// A step of an export: at most `budget` blocks from where `walk` got to, each
    /// block's holders (device, host and disk; predictions are not the engines'
    /// state) with its sequence and parent hashes, computed from the roots down.
    /// Blocks come parents first, so a tree can be filed from the output in order.
    /// Other changes may come between steps: every block held from the walk's start
    /// to its end is exported, once; one filed or dropped meanwhile may or may not be.
    /// Returns whether the walk is done.
    pub fn export_step(
        &self,
        walk: &mut ExportWalk,
        budget: usize,
        out: &mut Vec<ExportedBlock>,
    ) -> bool {
        if walk.done {
            return true;
        }
        if !walk.started {
            let mut roots: Vec<(BlockHash, NodeId)> = self
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
                if !self.is_root(id) || self.node(id).local() != walk.root_locals[i] {
                    // A root that went since the walk began.
                    continue;
                }
            }
            left -= 1;
            let parent = stack.frames.last().expect("a level is being walked").seq;
            let n = self.node(id);
            let (local, seq) = (n.local(), hash::chain(parent, n.local()));
            for &h in self.holders(id).as_slice(&self.slab) {
                let h = Holder(h);
                let tiers = h.tiers() & TierSet::MEDIA;
                if !tiers.is_empty() {
                    out.push(ExportedBlock {
                        seq,
                        parent,
                        local,
                        holder: Holder::new(h.slot(), tiers),
                        node: id.index(),
                        groups: self.groups_of(h.slot(), id),
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
            *walk = ExportWalk {
                done: true,
                ..ExportWalk::default()
            };
        }
        walk.done
    }

    /// The walk's frames rebuilt from the local hashes it saved: at each level, the
    /// children after the last one passed; below it, that child's, if it is still
    /// there (a node goes only with its subtree).
    fn resume(&self, walk: &mut ExportWalk) -> Walking {
        let mut stack = Walking::default();
        let (mut parent, mut seq) = (None, None);
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
                    .filter(|&r| self.is_root(r) && Some(self.node(r).local()) == last);
                (next, into)
            } else {
                let parent = parent.expect("a level below the roots has its parent");
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
                    parent = Some(c);
                }
                _ => break,
            }
        }
        stack
    }

    /// The sequence hash of `id`: its local hashes from the root down, chained.
    pub(super) fn seq_of(&self, id: NodeId, path: &mut Vec<BlockHash>) -> SeqHash {
        path.clear();
        let mut n = id;
        loop {
            path.push(self.node(n).local());
            match self.parent(n) {
                None => break,
                Some(p) => n = p,
            }
        }
        path.iter()
            .rev()
            .fold(None, |parent, &l| Some(hash::chain(parent, l)))
            .expect("a path has a block")
    }

    /// Files a block of a peer's dump (or a snapshot), parents first, as a store
    /// would. Its parent is the block the slot's `parent_engine` names, or else the
    /// block with sequence hash `parent_seq` among those this import filed (`filed`:
    /// the import's own map, dropped when it is done), or else a root standing for
    /// that sequence hash. Returns false, filing nothing, if the parent is named by
    /// an engine hash alone and it names nothing.
    pub fn seed(&mut self, b: &Seed, filed: &mut HashMap<SeqHash, NodeId>) -> bool {
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
            (Some(id), _) => Some(id),
            (None, None) if parent_engine.is_none() => None,
            (None, Some(seq)) => match filed.get(&seq) {
                Some(&id) if !self.node(id).is_free() => Some(id),
                // A parent the dump names by sequence hash alone (nobody held it): a
                // root standing for it, whose sequence hash is that one (a first
                // block's is its local hash), holding nothing. Lookups stop there, as
                // they stop at the parent in the tree the dump came from.
                _ => match self.child_or_insert(None, BlockHash(seq.0), EngineHash(0)) {
                    Some(id) => Some(id),
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
            (None, _) => hash::chain(None, local),
            (_, Some(p)) => hash::chain(Some(p), local),
            _ => self.seq_of(id, &mut Vec::new()),
        };
        filed.insert(seq, id);
        true
    }
}
