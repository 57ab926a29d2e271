//! The blocks of one index shard, filed by sequence hash mostly without storing it.
//!
//! A block whose tokens kvix hashed has the sequence hash
//! `hash::chain(parent, local)` (a first block: its local hash), so its entry keeps
//! only parent, local hash and holders, and a probe recomputes the key (one XXH3 of
//! 16 bytes) when a candidate's tag matches: 24 bytes a block instead of 32. Blocks
//! whose hash is not that chain (an engine's standardized rolling hashes, which come
//! without local hashes; a non-first block whose parent hash equals its own local
//! hash, which the first-block rule would misread; anything a peer's dump says) are
//! filed with their key in a second table, usually empty. A block lives in one of
//! the two, never both. Owned by one shard; must never change an entry's parent or
//! local hash once filed (its key would change under the table).

use super::holders::HolderSet;
use super::table::{BlockTable, Cursor, Keyed};
use crate::hash;
use crate::types::{BlockHash, SeqHash};

/// One cached block.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    /// Parent's sequence hash. A first block's: its own local hash in the chained
    /// table, its own sequence hash in the keyed one.
    parent: SeqHash,
    local: BlockHash,
    pub holders: HolderSet,
}

impl Node {
    pub fn local(&self) -> BlockHash {
        self.local
    }
}

/// The parent a chained entry records: none for a first block, which stores its
/// own local hash as its parent.
#[inline]
fn chained_parent(parent: SeqHash, local: BlockHash) -> Option<SeqHash> {
    (parent.0 != local.0).then_some(parent)
}

/// The sequence hash a chained entry stands for.
#[inline]
fn chained_key(parent: SeqHash, local: BlockHash) -> SeqHash {
    hash::chain(chained_parent(parent, local), local)
}

/// A node filed under the chain hash of its parent and local hash.
#[derive(Clone, Copy, Debug)]
struct Chained(Node);

impl Keyed for Chained {
    type Key = SeqHash;
    #[inline]
    fn key(&self) -> SeqHash {
        chained_key(self.0.parent, self.0.local)
    }
}

/// Which of an index shard's two tables an eviction hand walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hand {
    Chained,
    Keyed,
}

impl Hand {
    pub const BOTH: [Hand; 2] = [Hand::Chained, Hand::Keyed];
}

/// An eviction looks at a quarter of one table's buckets (at least
/// `EVICT_STEPS`) before the shard passes the turn on: a table whose blocks are
/// all in use gives way to one whose blocks are not, and every hand laps in the
/// same number of turns, so a small table's blocks are as safe as a large one's.
pub const EVICT_TURNS: usize = 4;
const EVICT_STEPS: usize = 16;

/// Where a walk of both tables in steps ([`Blocks::retain_step`]) has got to; the
/// default starts one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    chained: Cursor,
    keyed: Cursor,
}

impl Walk {
    /// A walk with nothing left to visit.
    pub fn done() -> Self {
        Walk {
            chained: Cursor::done(),
            keyed: Cursor::done(),
        }
    }

    pub fn is_done(&self) -> bool {
        self.chained.is_done() && self.keyed.is_done()
    }
}

/// Sequence hash → [`Node`] for one index shard.
#[derive(Default)]
pub struct Blocks {
    chained: BlockTable<Chained>,
    keyed: BlockTable<(SeqHash, Node)>,
}

impl Blocks {
    pub fn len(&self) -> usize {
        self.chained.len() + self.keyed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Note stores and matches from now on, for [`Self::evict`].
    pub fn track_use(&mut self) {
        self.chained.track_use();
        self.keyed.track_use();
    }

    pub fn allocation_size(&self) -> usize {
        self.chained.allocation_size() + self.keyed.allocation_size()
    }

    pub fn get(&self, seq: &SeqHash) -> Option<&Node> {
        match self.chained.get(seq) {
            Some(c) => Some(&c.0),
            None if self.keyed.is_empty() => None,
            None => self.keyed.get(seq).map(|e| &e.1),
        }
    }

    pub fn get_mut(&mut self, seq: &SeqHash) -> Option<&mut Node> {
        match self.chained.get_mut(seq) {
            Some(c) => Some(&mut c.0),
            None if self.keyed.is_empty() => None,
            None => self.keyed.get_mut(seq).map(|e| &mut e.1),
        }
    }

    /// Hint the CPU to load where `seq` would be filed (see [`BlockTable::prefetch`]).
    #[inline]
    pub fn prefetch(&self, seq: SeqHash) {
        self.chained.prefetch(seq);
        if !self.keyed.is_empty() {
            self.keyed.prefetch(seq);
        }
    }

    /// [`Self::get`] for a query: a match counts as a use.
    #[inline]
    pub fn get_matched(&mut self, seq: &SeqHash) -> Option<&Node> {
        match self.chained.get_matched(seq) {
            Some(c) => Some(&c.0),
            None if self.keyed.is_empty() => None,
            None => self.keyed.get_matched(seq).map(|e| &e.1),
        }
    }

    /// The node of `seq`, filed with `parent`, `local` and `holders` if new (then the
    /// flag is true); a use either way. A new node is written whole, so the caller
    /// never reads back a bucket whose cache line the insert has only begun to fetch.
    pub fn get_or_insert(
        &mut self,
        seq: SeqHash,
        parent: Option<SeqHash>,
        local: BlockHash,
        holders: HolderSet,
    ) -> (&mut Node, bool) {
        let mut grew = false;
        if self.keyed.is_empty() || self.keyed.get(&seq).is_none() {
            let chained_parent = parent.unwrap_or(SeqHash(local.0));
            // A stored block is found with one key computation; only a new one is
            // checked against its chain.
            let found = self.chained.get_or_try_insert(seq, || {
                grew = true;
                if chained_key(chained_parent, local) != seq {
                    return Err(());
                }
                Ok(Chained(Node {
                    parent: chained_parent,
                    local,
                    holders,
                }))
            });
            if let Ok(c) = found {
                return (&mut c.0, grew);
            }
        }
        let e = self.keyed.get_or_insert_with(seq, || {
            grew = true;
            let node = Node {
                parent: parent.unwrap_or(seq),
                local,
                holders,
            };
            (seq, node)
        });
        (&mut e.1, grew)
    }

    pub fn remove(&mut self, seq: &SeqHash) -> Option<Node> {
        match self.chained.remove(seq) {
            Some(c) => Some(c.0),
            None if self.keyed.is_empty() => None,
            None => self.keyed.remove(seq).map(|e| e.1),
        }
    }

    /// Buckets the hand of `hand` walks in one lap.
    fn buckets(&self, hand: Hand) -> usize {
        match hand {
            Hand::Chained => self.chained.buckets(),
            Hand::Keyed => self.keyed.buckets(),
        }
    }

    /// One turn of `hand`: remove and return a block not stored or matched since the
    /// hand last passed it, within a quarter of its table (see
    /// [`BlockTable::evict`]); `None` if the turn found none.
    pub fn evict(&mut self, hand: Hand) -> Option<(SeqHash, Node)> {
        let steps = (self.buckets(hand) / EVICT_TURNS).max(EVICT_STEPS);
        match hand {
            Hand::Chained => self.chained.evict(steps).map(|c| (c.key(), c.0)),
            Hand::Keyed => self.keyed.evict(steps),
        }
    }

    /// Keep the nodes for which `keep` is true.
    /// Keep the blocks for which `keep` is true among at most `budget` buckets from
    /// `at` (see [`BlockTable::retain_step`]); `keep` must give the same answer for
    /// a block it has seen.
    pub fn retain_step(
        &mut self,
        at: &mut Walk,
        budget: usize,
        mut keep: impl FnMut(&mut Node) -> bool,
    ) {
        if !at.chained.is_done() {
            self.chained
                .retain_step(&mut at.chained, budget, |c| keep(&mut c.0));
        }
        if at.chained.is_done() {
            self.keyed
                .retain_step(&mut at.keyed, budget, |e| keep(&mut e.1));
        }
    }

    /// `(seq, parent, node)` of part `part` of `1 << bits` that together cover
    /// every block once (an export walks them one by one, serving between; see
    /// [`BlockTable::iter_part`]).
    pub fn iter_part(
        &self,
        part: usize,
        bits: u32,
    ) -> impl Iterator<Item = (SeqHash, Option<SeqHash>, &Node)> {
        let chained = self.chained.iter_part(part, bits).map(|c| {
            let n = &c.0;
            (c.key(), chained_parent(n.parent, n.local), n)
        });
        let keyed = self
            .keyed
            .iter_part(part, bits)
            .map(|(seq, n)| (*seq, (n.parent != *seq).then_some(n.parent), n));
        chained.chain(keyed)
    }

    /// Blocks in [`Self::iter_part`]'s `part`.
    pub fn len_part(&self, part: usize, bits: u32) -> usize {
        self.chained.len_part(part, bits) + self.keyed.len_part(part, bits)
    }

    /// The bits an export splits these blocks by: the larger table's
    /// [`BlockTable::part_bits`] (the other, usually small or empty, is read once
    /// per part and filtered), at most `max`; `None` when there are none.
    pub fn part_bits(&self, max: u32) -> Option<u32> {
        let bits = if self.keyed.len() > self.chained.len() {
            self.keyed.part_bits()
        } else {
            self.chained.part_bits()
        };
        bits.map(|b| b.min(max))
    }

    pub fn values(&self) -> impl Iterator<Item = &Node> {
        let chained = self.chained.iter().map(|c| &c.0);
        chained.chain(self.keyed.iter().map(|e| &e.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain_of(n: u64) -> Vec<(SeqHash, Option<SeqHash>, BlockHash)> {
        let mut parent = None;
        (0..n)
            .map(|i| {
                let local = BlockHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
                let seq = hash::chain(parent, local);
                let b = (seq, parent, local);
                parent = Some(seq);
                b
            })
            .collect()
    }

    #[test]
    fn blocks_kvix_hashed_cost_no_key() {
        assert_eq!(std::mem::size_of::<Chained>(), 24);
        let mut b = Blocks::default();
        for (seq, parent, local) in chain_of(1000) {
            assert!(b.get_or_insert(seq, parent, local, HolderSet::default()).1);
            assert!(
                !b.get_or_insert(seq, parent, local, HolderSet::default()).1,
                "filed twice"
            );
        }
        assert_eq!((b.chained.len(), b.keyed.len()), (1000, 0));
        let mut seen: Vec<_> = (0..4).flat_map(|p| b.iter_part(p, 2)).collect();
        seen.sort_by_key(|(seq, ..)| *seq);
        let mut want = chain_of(1000);
        want.sort_by_key(|(seq, ..)| *seq);
        assert_eq!(seen.len(), want.len());
        for ((s, p, n), (ws, wp, wl)) in seen.into_iter().zip(want) {
            assert_eq!((s, p, n.local()), (ws, wp, wl));
        }
    }

    #[test]
    fn blocks_that_are_not_their_chain_keep_their_key() {
        let mut b = Blocks::default();
        let first = chain_of(1)[0];
        b.get_or_insert(first.0, None, first.2, HolderSet::default());
        // A second block with the same tokens: its parent hash is its local hash.
        let repeat = hash::chain(Some(first.0), first.2);
        b.get_or_insert(repeat, Some(first.0), first.2, HolderSet::default());
        // Standardized rolling hashes come without local hashes.
        let rolled = SeqHash(42);
        b.get_or_insert(rolled, Some(repeat), BlockHash(0), HolderSet::default());
        let rolled_root = SeqHash(7);
        b.get_or_insert(rolled_root, None, BlockHash(0), HolderSet::default());
        assert_eq!((b.chained.len(), b.keyed.len()), (1, 3));
        let mut seen: Vec<_> = b
            .iter_part(0, 0)
            .map(|(s, p, n)| (s, p, n.local()))
            .collect();
        seen.sort_by_key(|(s, ..)| *s);
        let mut want = vec![
            (first.0, None, first.2),
            (repeat, Some(first.0), first.2),
            (rolled, Some(repeat), BlockHash(0)),
            (rolled_root, None, BlockHash(0)),
        ];
        want.sort_by_key(|(s, ..)| *s);
        assert_eq!(seen, want);
        for (s, ..) in &want {
            assert!(b.get(s).is_some());
            assert!(b.get_matched(s).is_some());
        }
        // A block filed under one table is found there, whatever a later store says.
        assert!(
            !b.get_or_insert(rolled, None, BlockHash(9), HolderSet::default())
                .1
        );
        assert!(
            !b.get_or_insert(first.0, Some(SeqHash(1)), first.2, HolderSet::default())
                .1
        );
        assert_eq!(b.len(), 4);
        for (s, ..) in &want {
            assert!(b.remove(s).is_some());
            assert!(b.get(s).is_none());
        }
        assert!(b.is_empty());
    }

    #[test]
    fn both_hands_evict() {
        let mut b = Blocks::default();
        b.track_use();
        for (seq, parent, local) in chain_of(100) {
            b.get_or_insert(seq, parent, local, HolderSet::default());
        }
        for i in 0..100 {
            b.get_or_insert(SeqHash(i), None, BlockHash(0), HolderSet::default());
        }
        let mut n = 0;
        while !b.is_empty() {
            for hand in Hand::BOTH {
                if let Some((seq, _)) = b.evict(hand) {
                    assert!(b.get(&seq).is_none());
                    n += 1;
                }
            }
        }
        assert_eq!(n, 200);
    }
}
