//! The block table of one index shard: sequence hash → node, kept in segments.
//!
//! One hash table of millions of entries grows by doubling in one go: the
//! executor stops for the whole copy (queries wait behind it) and the old and new
//! tables are resident together. Split into [`SEGMENTS`] tables, chosen by hash
//! bits that neither the partition rule nor hashbrown's probing uses, each
//! segment grows and shrinks on its own: a resize moves a sixteenth of the
//! entries, memory grows in small steps, and a segment's freed table is reused
//! by the next segment's growth instead of faulting in fresh pages. Owned by one
//! shard; never shared.

use crate::types::SeqHash;
use hashbrown::HashMap;
use hashbrown::hash_map::Entry;
use std::hash::{BuildHasher, Hasher};

/// Sixteen: more segments would shorten the stall further, but each table is then
/// small enough that the allocator's rounding of large blocks (64 KiB steps) costs
/// memory in every index.
const SEG_BITS: u32 = 4;
pub const SEGMENTS: usize = 1 << SEG_BITS;
/// A segment this large or larger gives memory back once three quarters empty.
const SHRINK_FROM: usize = 256;

/// Sequence hashes are XXH3 output already; one multiply spreads them over
/// hashbrown's control bits even though the partition and the segment fixed
/// some bits of the key.
#[derive(Clone, Copy, Default)]
pub struct SeqHasherBuilder;

#[derive(Default)]
pub struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl BuildHasher for SeqHasherBuilder {
    type Hasher = SeqHasher;
    fn build_hasher(&self) -> SeqHasher {
        SeqHasher(0)
    }
}

type Segment<V> = HashMap<SeqHash, V, SeqHasherBuilder>;

/// Sequence hash → `V`, in [`SEGMENTS`] independently sized hash tables.
pub struct BlockTable<V> {
    /// Empty until the first insert, so an index a shard never sees costs nothing.
    segs: Vec<Segment<V>>,
    len: usize,
}

impl<V> Default for BlockTable<V> {
    fn default() -> Self {
        BlockTable {
            segs: Vec::new(),
            len: 0,
        }
    }
}

/// The segment of `seq`: its top bits. The partition rule reads the low 32 bits
/// and hashbrown indexes buckets by the low bits of `seq` times an odd constant.
#[inline]
fn segment(seq: SeqHash) -> usize {
    (seq.0 >> (64 - SEG_BITS)) as usize
}

impl<V> BlockTable<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, seq: &SeqHash) -> Option<&V> {
        self.segs.get(segment(*seq))?.get(seq)
    }

    #[inline]
    pub fn get_mut(&mut self, seq: &SeqHash) -> Option<&mut V> {
        self.segs.get_mut(segment(*seq))?.get_mut(seq)
    }

    /// The value of `seq`, inserted by `make` if absent.
    #[inline]
    pub fn get_or_insert_with(&mut self, seq: SeqHash, make: impl FnOnce() -> V) -> &mut V {
        if self.segs.is_empty() {
            self.segs.resize_with(SEGMENTS, Segment::default);
        }
        match self.segs[segment(seq)].entry(seq) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                self.len += 1;
                e.insert(make())
            }
        }
    }

    /// Remove `seq`; its segment gives memory back if it became sparse.
    pub fn remove(&mut self, seq: &SeqHash) -> Option<V> {
        let seg = self.segs.get_mut(segment(*seq))?;
        let v = seg.remove(seq)?;
        self.len -= 1;
        shrink_if_sparse(seg);
        Some(v)
    }

    /// Keep the entries for which `keep` is true, segment by segment.
    pub fn retain(&mut self, mut keep: impl FnMut(&SeqHash, &mut V) -> bool) {
        let mut len = 0;
        for seg in &mut self.segs {
            seg.retain(|k, v| keep(k, v));
            shrink_if_sparse(seg);
            len += seg.len();
        }
        self.len = len;
        if len == 0 {
            self.segs = Vec::new();
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&SeqHash, &V)> {
        self.segs.iter().flat_map(|s| s.iter())
    }

    /// The entries of segments `part * SEGMENTS / parts ..` up to the next part's: an
    /// export walks the table in `parts` steps and the executor serves between them.
    pub fn iter_part(&self, part: usize, parts: usize) -> impl Iterator<Item = (&SeqHash, &V)> {
        let parts = parts.clamp(1, SEGMENTS);
        let (from, to) = (part * SEGMENTS / parts, (part + 1) * SEGMENTS / parts);
        self.segs
            .get(from.min(self.segs.len())..to.min(self.segs.len()))
            .unwrap_or_default()
            .iter()
            .flat_map(|s| s.iter())
    }

    /// Entries in the segments of [`Self::iter_part`]'s `part`.
    pub fn len_part(&self, part: usize, parts: usize) -> usize {
        let parts = parts.clamp(1, SEGMENTS);
        let (from, to) = (part * SEGMENTS / parts, (part + 1) * SEGMENTS / parts);
        self.segs
            .get(from.min(self.segs.len())..to.min(self.segs.len()))
            .unwrap_or_default()
            .iter()
            .map(|s| s.len())
            .sum()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.segs.iter().flat_map(|s| s.values())
    }

    /// Heap bytes of the segments' tables.
    pub fn allocation_size(&self) -> usize {
        self.segs.capacity() * std::mem::size_of::<Segment<V>>()
            + self.segs.iter().map(|s| s.allocation_size()).sum::<usize>()
    }
}

/// Give memory back once a segment is a quarter full or less, keeping room to
/// double: removals and clears must not pin peak memory.
fn shrink_if_sparse<V>(seg: &mut Segment<V>) {
    let cap = seg.capacity();
    if cap >= SHRINK_FROM && seg.len() < cap / 4 {
        seg.shrink_to(seg.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_one_map() {
        let mut t = BlockTable::<u64>::default();
        let mut model = std::collections::HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for i in 0..50_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = SeqHash((x % 20_000) | (x & (0xFF << 56)));
            if i % 3 == 2 {
                assert_eq!(t.remove(&k), model.remove(&k));
            } else {
                *t.get_or_insert_with(k, || 0) += 1;
                *model.entry(k).or_insert(0) += 1;
            }
            assert_eq!(t.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(t.get(k), Some(v));
        }
        assert_eq!(t.iter().count(), model.len());
        for parts in [1, 3, 8, 64, 100] {
            let mut seen: Vec<_> = (0..parts).flat_map(|p| t.iter_part(p, parts)).collect();
            assert_eq!(seen.len(), model.len(), "parts={parts}");
            assert_eq!(
                (0..parts).map(|p| t.len_part(p, parts)).sum::<usize>(),
                model.len()
            );
            seen.sort_by_key(|(k, _)| **k);
            seen.dedup_by_key(|(k, _)| **k);
            assert_eq!(seen.len(), model.len());
        }
        t.retain(|_, v| *v % 2 == 0);
        model.retain(|_, v| *v % 2 == 0);
        assert_eq!(t.len(), model.len());
        assert_eq!(t.values().count(), model.len());
        t.retain(|_, _| false);
        assert!(t.is_empty());
        assert_eq!(t.allocation_size(), 0);
    }

    #[test]
    fn uses_every_segment_for_xxh3_keys() {
        let mut t = BlockTable::<()>::default();
        for i in 0..10_000u64 {
            t.get_or_insert_with(SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes())), || ());
        }
        assert!(t.segs.iter().all(|s| s.len() > 400));
    }

    /// The longest single insert while growing to 8M entries, segmented and as
    /// one table: the stall a query behind a resize waits. A figure, not a check:
    /// `cargo test --release --lib growth_stall -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn growth_stall() {
        use std::time::{Duration, Instant};
        let n = 8u64 << 20;
        let key = |i: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
        let mut worst = Duration::ZERO;
        let mut m: Segment<[u64; 3]> = Default::default();
        let t0 = Instant::now();
        for i in 0..n {
            let s = Instant::now();
            m.entry(key(i)).or_insert([i; 3]);
            worst = worst.max(s.elapsed());
        }
        println!(
            "one table: total {:?}, worst insert {:?}",
            t0.elapsed(),
            worst
        );
        drop(m);
        let mut worst = Duration::ZERO;
        let mut t = BlockTable::<[u64; 3]>::default();
        let t0 = Instant::now();
        for i in 0..n {
            let s = Instant::now();
            t.get_or_insert_with(key(i), || [i; 3]);
            worst = worst.max(s.elapsed());
        }
        println!(
            "segmented: total {:?}, worst insert {:?}",
            t0.elapsed(),
            worst
        );
    }
}
