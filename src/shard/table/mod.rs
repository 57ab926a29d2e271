//! A segmented hash table of blocks: the keyed table of an index shard (entries
//! filed by sequence hash) and each worker slot's engine-hash map in a tree (filed
//! by engine hash, [`TableKey`]).
//!
//! An entry says its own key ([`Keyed`]: stored beside the value), or says it
//! given a context the table's owner passes in ([`Filed`]: an engine map's entry
//! is a reference to a tree node, which holds the hash), so that a table need not
//! spend eight bytes a block on a hash it can read elsewhere.
//! [`BlockTable::prefetch`] loads where a key would be filed, so a caller that
//! knows its next keys overlaps their cache misses.
//!
//! One hash table of millions of entries grows by doubling in one go: the
//! executor stops for the whole copy (queries wait behind it) and the old and new
//! tables are resident together. Split into segments, chosen by the top bits of
//! the key's spread (bits that neither the partition rule nor hashbrown's probing
//! uses), each segment grows and shrinks on its own: memory grows in small steps,
//! and a segment's freed table is reused by the next segment's growth instead of
//! faulting in fresh pages. A table starts with two segments; a segment
//! that has [`SPLIT_BUCKETS`] buckets splits in two by the next bit of its keys
//! instead of doubling (extendible hashing: a directory indexed by the keys' top
//! bits names each key's segment), so a resize moves at most that many buckets'
//! entries, however large the table. A bounded shard's tables also keep a use bit
//! per bucket and pick what to evict by CLOCK ([`BlockTable::evict`]); the table
//! never decides *when* to evict. Owned by one shard or one ingest thread; never
//! shared.

mod clock;
mod key;
mod walk;

pub use key::{Filed, Keyed, SeqHasher, SeqHasherBuilder, TableKey};
pub use walk::Cursor;

use clock::{Clock, Used};
use hashbrown::HashTable;
use key::{hash, rehash};

/// Two to start with. Every segment of a table grows at about the same time (keys
/// spread evenly), so more segments would not spread growth out; they would only
/// be smaller, and a segment under the allocator's large-object size (128 KiB)
/// is rounded up to its size class: hashbrown asks for just past a class
/// boundary, which wastes a sixth of each segment. The stall of one resize is
/// bounded by [`SPLIT_BUCKETS`] either way.
const SEG_BITS: u32 = 1;
const SEGMENTS: usize = 1 << SEG_BITS;
/// A segment with this many buckets splits instead of growing: a resize then moves
/// at most seven eighths of this many entries (a few milliseconds), where doubling
/// one segment of a table of tens of millions moves over a million.
pub const SPLIT_BUCKETS: usize = 1 << 17;
/// Segments stop splitting (and double instead) once their keys share this many
/// top bits: a directory of at most a quarter million entries. Hashes spread
/// evenly never get near it; keys crafted to share their top bits would otherwise
/// double the directory with every split.
const MAX_DEPTH: u32 = 18;
/// A segment this large or larger gives memory back once three quarters empty.
const SHRINK_FROM: usize = 256;

type Segment<E> = HashTable<E>;

/// Entries `E` by their sequence hash, in independently sized hash tables.
pub struct BlockTable<E> {
    /// Empty until the first insert, so an index a shard never sees costs nothing.
    segs: Vec<Segment<E>>,
    /// Per segment, the keys it holds.
    reach: Vec<Reach>,
    /// The segment of every key whose spread's top `depth` bits are the index;
    /// empty exactly when `segs` is.
    dir: Vec<u32>,
    /// `dir` has `1 << depth` entries; never below [`SEG_BITS`].
    depth: u32,
    /// Per segment, where its buckets are, for [`Self::prefetch`].
    layout: Vec<Layout>,
    /// Per segment, how often its entries may have moved (it grew, shrank, split or
    /// rehashed in place), for walks in steps ([`Self::retain_step`]).
    moves: Vec<u32>,
    len: usize,
    /// Use bits and the eviction hand; only for a bounded table.
    clock: Option<Box<Clock>>,
    /// A segment with this many buckets splits instead of growing.
    split_at: usize,
}

/// The keys one segment holds: those whose spread's top `depth` bits are
/// `prefix`'s (the rest of `prefix` is zero).
#[derive(Clone, Copy, Debug)]
struct Reach {
    prefix: u64,
    depth: u32,
}

/// Where a segment's buckets lie in memory, learnt from the last insert: hashbrown
/// keeps bucket `i` at `ctrl - (i + 1) * size_of::<E>()` and its control byte at
/// `ctrl + i`, and starts a probe at bucket `hash & (buckets - 1)`. Only ever used
/// for prefetch hints, which never dereference: a stale or wrong layout costs a
/// useless prefetch, never a wrong answer.
#[derive(Clone, Copy, Default)]
struct Layout {
    ctrl: usize,
    /// The bucket count `ctrl` was learnt at; another count means it is stale.
    buckets: usize,
}

impl<E> Default for BlockTable<E> {
    fn default() -> Self {
        BlockTable {
            segs: Vec::new(),
            reach: Vec::new(),
            dir: Vec::new(),
            depth: SEG_BITS,
            layout: Vec::new(),
            moves: Vec::new(),
            len: 0,
            clock: None,
            split_at: SPLIT_BUCKETS,
        }
    }
}

impl<E: Filed + Copy> BlockTable<E> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A table whose segments split from `buckets` on, so tests see splits
    /// without filing a million entries.
    #[cfg(test)]
    fn splitting_at(buckets: usize) -> Self {
        BlockTable {
            split_at: buckets,
            ..Self::default()
        }
    }

    /// From now on, note which entries are stored or matched, so that
    /// [`Self::evict`] can pick one that was not lately.
    pub fn track_use(&mut self) {
        if self.clock.is_none() {
            self.clock = Some(Box::default());
        }
    }

    /// The segment that holds `key` if it is filed; `None` while nothing is.
    #[inline]
    fn segment(&self, key: E::Key) -> Option<usize> {
        self.segment_at(key.spread())
    }

    /// The segment whose keys include the spread `at`; `None` while nothing is filed.
    #[inline]
    fn segment_at(&self, at: u64) -> Option<usize> {
        let i = at >> (64 - self.depth);
        self.dir.get(i as usize).map(|&s| s as usize)
    }

    #[inline]
    pub fn get_in(&self, seq: &E::Key, ctx: &E::Ctx) -> Option<&E> {
        let seq = *seq;
        self.segs
            .get(self.segment(seq)?)?
            .find(hash(seq), |e| e.key_in(ctx) == seq)
    }

    /// Files `e` under `seq` (a use, like a store); returns the entry it replaces.
    /// `e`'s key must be `seq`.
    #[inline]
    pub fn insert_in(&mut self, seq: E::Key, ctx: &E::Ctx, e: E) -> Option<E> {
        let mut new = false;
        let slot = self.get_or_insert_with_in(seq, ctx, || {
            new = true;
            e
        });
        (!new).then(|| std::mem::replace(slot, e))
    }

    /// The entry of `seq`, inserted by `make` if absent; a use either way. `make`
    /// must give an entry whose key is `seq`.
    #[inline]
    pub fn get_or_insert_with_in(
        &mut self,
        seq: E::Key,
        ctx: &E::Ctx,
        make: impl FnOnce() -> E,
    ) -> &mut E {
        match self.get_or_try_insert_in(seq, ctx, || Ok::<E, std::convert::Infallible>(make())) {
            Ok(e) => e,
            Err(never) => match never {},
        }
    }

    /// The entry of `seq`, or if absent the one `make` gives (filed, and a use like
    /// a store), or `make`'s error (nothing filed). `make` must give an entry whose
    /// key is `seq`.
    #[inline]
    pub fn get_or_try_insert_in<R>(
        &mut self,
        seq: E::Key,
        ctx: &E::Ctx,
        make: impl FnOnce() -> Result<E, R>,
    ) -> Result<&mut E, R> {
        if self.segs.is_empty() {
            self.segs.resize_with(SEGMENTS, Segment::default);
            self.reach = (0..SEGMENTS as u64)
                .map(|i| Reach {
                    prefix: i << (64 - SEG_BITS),
                    depth: SEG_BITS,
                })
                .collect();
            self.dir = (0..SEGMENTS as u32).collect();
            self.depth = SEG_BITS;
            self.layout.resize(SEGMENTS, Layout::default());
            self.moves.resize(SEGMENTS, 0);
        }
        let mut s = self
            .segment(seq)
            .expect("a directory once a segment exists");
        let seg = &self.segs[s];
        if seg.capacity() == seg.len() {
            // No room left: finding the entry makes room first, by growing, splitting
            // or rehashing in place, each of which moves entries. hashbrown grows a
            // table once it is over seven sixteenths full, else rehashes in place.
            if seg.num_buckets() >= self.split_at
                && seg.len() >= seg.num_buckets() / 16 * 7
                && self.reach[s].depth < MAX_DEPTH
            {
                self.split(s, ctx);
                s = self
                    .segment(seq)
                    .expect("a directory once a segment exists");
            } else {
                // Grow (or, if deleted entries fill it, rehash at the same size) as
                // hashbrown would, but moving the entries here, their keys loaded
                // ahead.
                let cap = match seg.len() < seg.capacity() / 2 {
                    true => seg.capacity(),
                    false => seg.capacity() + 1,
                };
                self.segs[s] = refile(&self.segs[s], cap, ctx);
                self.layout[s] = Layout::default();
                moved(&mut self.moves[s]);
                if let Some(clock) = self.clock.as_deref_mut() {
                    clock.forget(s);
                }
            }
        }
        let seg = &mut self.segs[s];
        let buckets = seg.num_buckets();
        let entry = match seg.entry(hash(seq), |e| e.key_in(ctx) == seq, rehash(ctx)) {
            hashbrown::hash_table::Entry::Occupied(e) => e,
            hashbrown::hash_table::Entry::Vacant(e) => {
                let new = make()?;
                debug_assert_eq!(new.key_in(ctx), seq, "an entry filed under another key");
                self.len += 1;
                e.insert(new)
            }
        };
        let i = entry.bucket_index();
        if let Some(clock) = self.clock.as_deref_mut() {
            clock.note(s, i);
        }
        let at = std::ptr::from_ref(entry.get()) as usize;
        let seg = &mut self.segs[s];
        let now = seg.num_buckets();
        if self.layout[s].buckets != now || buckets != now {
            // The segment may have moved (it grew): learn where it is now.
            self.layout[s] = Layout {
                ctrl: at + (i + 1) * std::mem::size_of::<E>(),
                buckets: now,
            };
        }
        Ok(seg.get_bucket_mut(i).expect("the bucket just filed"))
    }

    /// Split segment `s` in two by the next bit of its keys: the keys with that bit
    /// clear stay at `s`, the others go to a new segment at the end. Each half gets
    /// as many buckets as `s` had, so the pair is as full as `s` would have been
    /// doubled, and the copy moves only `s`'s entries (a half that got none gives
    /// its buckets back; one that got all, from keys sharing their top bits, is
    /// full and splits again at its next insert, until [`MAX_DEPTH`]).
    fn split(&mut self, s: usize, ctx: &E::Ctx) {
        let Reach { prefix, depth } = self.reach[s];
        if depth == self.depth {
            self.dir = self.dir.iter().flat_map(|&d| [d, d]).collect();
            self.depth += 1;
        }
        let bit = 1u64 << (63 - depth);
        let new = self.segs.len();
        let old = std::mem::take(&mut self.segs[s]);
        let (mut low, mut high) = (
            Segment::with_capacity(old.len()),
            Segment::with_capacity(old.len()),
        );
        // One key per entry: an entry filed by context reads its key from there.
        for (e, k) in keyed(&old, ctx) {
            let half = if k.spread() & bit == 0 {
                &mut low
            } else {
                &mut high
            };
            half.insert_unique(hash(k), e, rehash(ctx));
        }
        for half in [&mut low, &mut high] {
            if half.is_empty() {
                *half = Segment::default();
            }
        }
        self.segs[s] = low;
        self.segs.push(high);
        self.reach[s].depth = depth + 1;
        self.reach.push(Reach {
            prefix: prefix | bit,
            depth: depth + 1,
        });
        let shift = 64 - self.depth;
        for (i, d) in self.dir.iter_mut().enumerate() {
            if *d as usize == s && ((i as u64) << shift) & bit != 0 {
                *d = new as u32;
            }
        }
        self.layout[s] = Layout::default();
        self.layout.push(Layout::default());
        moved(&mut self.moves[s]);
        self.moves.push(0);
        if let Some(clock) = self.clock.as_deref_mut() {
            clock.forget(s);
        }
    }

    /// Hint the CPU to load the buckets where `seq` would be, so that a lookup or
    /// insert a few ops later does not wait on memory. Does nothing else.
    #[inline]
    pub fn prefetch(&self, seq: E::Key) {
        if let Some((ctrl, entry)) = self.home(seq) {
            prefetch(ctrl);
            prefetch(entry);
        }
    }

    /// Where the probe for `seq` starts, as addresses of its control byte and its
    /// entry, if this segment's layout is known.
    #[inline]
    fn home(&self, seq: E::Key) -> Option<(usize, usize)> {
        let s = self.segment(seq)?;
        let (seg, l) = (self.segs.get(s)?, self.layout.get(s)?);
        let buckets = seg.num_buckets();
        if l.buckets != buckets || buckets == 0 {
            return None;
        }
        let i = hash(seq) as usize & (buckets - 1);
        let entry = l.ctrl.wrapping_sub((i + 1) * std::mem::size_of::<E>());
        Some((l.ctrl.wrapping_add(i), entry))
    }

    /// Remove `seq`; its segment gives memory back if it became sparse.
    pub fn remove_in(&mut self, seq: &E::Key, ctx: &E::Ctx) -> Option<E> {
        let seq = *seq;
        let s = self.segment(seq)?;
        let seg = self.segs.get_mut(s)?;
        let (e, _) = seg
            .find_entry(hash(seq), |e| e.key_in(ctx) == seq)
            .ok()?
            .remove();
        self.len -= 1;
        shrink_if_sparse(seg, &mut self.moves[s], ctx);
        Some(e)
    }

    /// Buckets over all segments (what a lap of the eviction hand visits).
    pub fn buckets(&self) -> usize {
        self.segs.iter().map(|s| s.num_buckets()).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = &E> {
        self.segs.iter().flat_map(|s| s.iter())
    }

    /// Heap bytes of the segments' tables and the use bits.
    pub fn allocation_size(&self) -> usize {
        self.segs.capacity() * std::mem::size_of::<Segment<E>>()
            + self.reach.capacity() * std::mem::size_of::<Reach>()
            + self.dir.capacity() * std::mem::size_of::<u32>()
            + self.segs.iter().map(|s| s.allocation_size()).sum::<usize>()
            + self.clock.as_ref().map_or(0, |c| {
                std::mem::size_of::<Clock>()
                    + c.used.capacity() * std::mem::size_of::<Used>()
                    + c.used.iter().map(|u| u.bits.capacity() * 8).sum::<usize>()
            })
    }
}

/// The same calls for entries that say their own key.
impl<E: Filed<Ctx = ()> + Copy> BlockTable<E> {
    #[inline]
    pub fn get(&self, seq: &E::Key) -> Option<&E> {
        self.get_in(seq, &())
    }

    /// [`Self::get`] for a query: a match counts as a use.
    #[inline]
    pub fn get_matched(&mut self, seq: &E::Key) -> Option<&E> {
        if self.clock.is_none() {
            return self.get(seq);
        }
        let seq = *seq;
        let s = self.segment(seq)?;
        let clock = self.clock.as_deref_mut()?;
        let seg = self.segs.get(s)?;
        let i = seg.find_bucket_index(hash(seq), |e| e.key_in(&()) == seq)?;
        clock.note(s, i);
        seg.get_bucket(i)
    }

    #[inline]
    pub fn get_mut(&mut self, seq: &E::Key) -> Option<&mut E> {
        let seq = *seq;
        let s = self.segment(seq)?;
        self.segs
            .get_mut(s)?
            .find_mut(hash(seq), |e| e.key_in(&()) == seq)
    }

    /// See [`Self::get_or_insert_with_in`].
    #[inline]
    pub fn get_or_insert_with(&mut self, seq: E::Key, make: impl FnOnce() -> E) -> &mut E {
        self.get_or_insert_with_in(seq, &(), make)
    }

    pub fn remove(&mut self, seq: &E::Key) -> Option<E> {
        self.remove_in(seq, &())
    }
}

/// A prefetch hint for the cache line holding `addr`.
#[inline(always)]
pub(super) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never dereferences its address and cannot fault, whatever
    // the address; it only hints the cache.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Count a move of a segment's entries (see [`Cursor`]).
#[inline]
fn moved(moves: &mut u32) {
    *moves = moves.wrapping_add(1);
}

/// Give memory back if `seg` is three quarters empty, keeping room to double
/// (removals and clears must not pin peak memory), counting the move of its
/// entries in `moves`.
fn shrink_if_sparse<E: Filed + Copy>(seg: &mut Segment<E>, moves: &mut u32, ctx: &E::Ctx) {
    let cap = seg.capacity();
    if cap >= SHRINK_FROM && seg.len() < cap / 4 {
        *seg = refile(seg, seg.len() * 2, ctx);
        moved(moves);
    }
}

/// Entries [`keyed`] reads ahead of the one it yields.
const KEYS_AHEAD: usize = 8;

/// `seg`'s entries with their keys, for moving them. A key read from the context
/// is a cache miss each, so keys are loaded [`KEYS_AHEAD`] entries ahead
/// (hashbrown's own resize reads them one by one).
fn keyed<'a, E: Filed + Copy>(
    seg: &'a Segment<E>,
    ctx: &'a E::Ctx,
) -> impl Iterator<Item = (E, E::Key)> + 'a {
    let mut ahead = seg.iter();
    for e in ahead.by_ref().take(KEYS_AHEAD) {
        e.prefetch_key(ctx);
    }
    seg.iter().map(move |e| {
        if let Some(a) = ahead.next() {
            a.prefetch_key(ctx);
        }
        (*e, e.key_in(ctx))
    })
}

/// `old`'s entries in a new table with room for `cap` of them.
fn refile<E: Filed + Copy>(old: &Segment<E>, cap: usize, ctx: &E::Ctx) -> Segment<E> {
    let mut new = Segment::with_capacity(cap.max(old.len()));
    for (e, k) in keyed(old, ctx) {
        new.insert_unique(hash(k), e, rehash(ctx));
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EngineHash, SeqHash};

    /// A walk in steps, with the table growing, shrinking and rehashing in place
    /// between steps, still passes every entry that stays in the table to `keep`.
    #[test]
    fn a_walk_in_steps_sees_every_entry_that_stays() {
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15);
        let key = |x: u64| SeqHash(x.wrapping_mul(0x2545_F491_4F6C_DD1D));
        // (stores, removals) per step: growth; emptying (shrinks); churn (tombstones,
        // so rehashes in place).
        let rounds = [(60, 0), (0, 30), (30, 30)].into_iter();
        for (round, ((stores, removals), split_at)) in rounds
            .flat_map(|r| [(r, SPLIT_BUCKETS), (r, 64)])
            .enumerate()
        {
            let mut t = BlockTable::<(SeqHash, u64)>::splitting_at(split_at);
            let mut model = std::collections::HashMap::new();
            let mut live = Vec::new();
            for k in 0..20_000u64 {
                let v = rng.below(3);
                t.get_or_insert_with(key(k), || (key(k), v));
                model.insert(key(k), v);
                live.push(key(k));
            }
            let mut next_key = 20_000u64;
            let mut at = Cursor::default();
            let moves_before: u32 = t.moves.iter().sum();
            while !at.is_done() {
                t.retain_step(&mut at, 1 + rng.below(40) as usize, |e| e.1 != 0);
                // Stores are never dropped: the walk may or may not see them.
                for _ in 0..rng.below(stores + 1) {
                    let k = key(next_key);
                    next_key += 1;
                    t.get_or_insert_with(k, || (k, 1));
                    model.insert(k, 1);
                    live.push(k);
                }
                for _ in 0..rng.below(removals + 1) {
                    if live.is_empty() {
                        break;
                    }
                    let k = live.swap_remove(rng.below(live.len() as u64) as usize);
                    t.remove(&k);
                    model.remove(&k);
                }
            }
            // Segments that split early are too small to shrink.
            if removals == 0 || (stores == 0 && split_at == SPLIT_BUCKETS) {
                assert!(
                    t.moves.iter().sum::<u32>() > moves_before,
                    "round {round}: no moves"
                );
            }
            model.retain(|_, v| *v != 0);
            assert_eq!(t.len(), model.len(), "round {round}");
            for (k, v) in &model {
                assert_eq!(t.get(k).map(|e| e.1), Some(*v), "round {round}");
            }
        }
    }

    /// Engine hashes that vary only in their high bits, or count up from zero, still
    /// spread over every segment and are all found.
    #[test]
    fn engine_hashes_of_any_shape_spread_over_the_segments() {
        let shapes: [fn(u64) -> EngineHash; 3] = [
            |i| EngineHash(i << 40),
            |i| EngineHash(i),
            |i| EngineHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        ];
        for (n, shape) in shapes.into_iter().enumerate() {
            let mut t = BlockTable::<(EngineHash, u64)>::default();
            for i in 0..40_000 {
                t.get_or_insert_with(shape(i), || (shape(i), i));
            }
            for i in 0..40_000 {
                assert_eq!(t.get(&shape(i)).map(|e| e.1), Some(i), "shape {n}");
            }
            let share = 40_000 / SEGMENTS;
            for seg in &t.segs {
                assert!(
                    seg.len() < 2 * share,
                    "shape {n}: a segment of {}",
                    seg.len()
                );
            }
        }
    }

    #[test]
    fn behaves_as_one_map() {
        for split_at in [SPLIT_BUCKETS, 64] {
            behaves_as_one_map_splitting_at(split_at);
        }
    }

    fn behaves_as_one_map_splitting_at(split_at: usize) {
        let mut t = BlockTable::<(SeqHash, u64)>::splitting_at(split_at);
        let mut model = std::collections::HashMap::new();
        let mut rng = crate::testing::Xorshift::new(0x2545_F491_4F6C_DD1D);
        for i in 0..50_000u64 {
            let x = rng.next_u64();
            let k = SeqHash((x % 20_000) | (x & (0xFF << 56)));
            if i % 3 == 2 {
                assert_eq!(t.remove(&k).map(|e| e.1), model.remove(&k));
            } else {
                t.get_or_insert_with(k, || (k, 0)).1 += 1;
                *model.entry(k).or_insert(0) += 1;
            }
            assert_eq!(t.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(t.get(k).map(|e| &e.1), Some(v));
        }
        assert_eq!(t.iter().count(), model.len());
        for bits in [0, 1, 3, 4, 6, 9] {
            let parts = 1 << bits;
            let mut seen: Vec<_> = (0..parts).flat_map(|p| t.iter_part(p, bits)).collect();
            assert_eq!(seen.len(), model.len(), "bits={bits}");
            seen.sort_by_key(|e| e.0);
            seen.dedup_by_key(|e| e.0);
            assert_eq!(seen.len(), model.len());
        }
        t.retain(|e| e.1 % 2 == 0);
        model.retain(|_, v| *v % 2 == 0);
        assert_eq!(t.len(), model.len());
        for (k, v) in &model {
            assert_eq!(t.get(k).map(|e| &e.1), Some(v));
        }
        t.retain(|_| false);
        assert!(t.is_empty());
        assert_eq!(t.allocation_size(), 0);
    }

    /// Holds the layout [`BlockTable::prefetch`] assumes of hashbrown: most entries
    /// sit in the 16 buckets from their probe's start, and the learnt address of that
    /// start is where the entry is then.
    #[test]
    fn prefetch_points_at_the_entry() {
        let mut t = BlockTable::<(SeqHash, u64)>::default();
        let keys: Vec<_> = (0..40_000u64)
            .map(|i| SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes())))
            .collect();
        for k in &keys[..20_000] {
            t.get_or_insert_with(*k, || (*k, 0));
        }
        // Removals shrink the segments (their layout is unknown until an insert
        // learns it again), then inserts grow them back.
        for k in &keys[..15_000] {
            t.remove(k);
        }
        for k in &keys[20_000..] {
            t.get_or_insert_with(*k, || (*k, 0));
        }
        let (mut home, mut known) = (0, 0);
        for k in &keys[15_000..] {
            let Some((_, at)) = t.home(*k) else { continue };
            known += 1;
            let entry = std::ptr::from_ref(t.get(k).unwrap()) as usize;
            let size = std::mem::size_of::<(SeqHash, u64)>();
            if entry <= at && at - entry < 16 * size {
                assert_eq!((at - entry) % size, 0);
                home += 1;
            }
        }
        assert_eq!(known, 25_000, "every segment grew since it shrank");
        assert!(
            home * 10 > known * 9,
            "{home} of {known} near their probe start"
        );
    }

    #[test]
    fn uses_every_segment_for_xxh3_keys() {
        let mut t = BlockTable::<(SeqHash, ())>::default();
        for i in 0..10_000u64 {
            let k = SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
            t.get_or_insert_with(k, || (k, ()));
        }
        assert!(t.segs.iter().all(|s| s.len() > 400));
    }

    #[test]
    fn evicts_what_was_not_used_since_the_hand_passed() {
        for split_at in [SPLIT_BUCKETS, 64] {
            evicts_what_was_not_used_splitting_at(split_at);
        }
    }

    fn evicts_what_was_not_used_splitting_at(split_at: usize) {
        let key = |i: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
        let mut t = BlockTable::<(SeqHash, u64)>::splitting_at(split_at);
        for i in 0..4000 {
            t.get_or_insert_with(key(i), || (key(i), i));
        }
        assert_eq!(t.evict(usize::MAX), None, "not tracking use");
        t.track_use();
        // Keep the table at 4000 entries while new ones arrive and the first 100
        // are matched between arrivals: those are never chosen.
        let mut evicted = Vec::new();
        for i in 4000..12_000 {
            for h in 0..100 {
                assert!(t.get_matched(&key(h)).is_some(), "hot entry {h} evicted");
            }
            t.get_or_insert_with(key(i), || (key(i), i));
            let (k, v) = t.evict(usize::MAX).expect("an entry to evict");
            assert_eq!(k, key(v));
            evicted.push(v);
        }
        assert_eq!(t.len(), 4000);
        assert_eq!(t.iter().count(), 4000);
        evicted.sort();
        evicted.dedup();
        assert_eq!(evicted.len(), 8000);
        // The newest entries were stored after the hand last passed: all still there.
        assert!((11_900..12_000).all(|i| t.get(&key(i)).is_some()));
        // A bounded number of steps may come back empty-handed; later calls go on.
        let mut steps = 0;
        while t.evict(8).is_none() {
            steps += 8;
            assert!(steps < 1 << 20);
        }
    }

    /// Past the split size a segment splits instead of growing; every segment holds
    /// exactly the keys its directory entries send it, and all are found.
    #[test]
    fn segments_split_instead_of_growing_past_the_split_size() {
        let key = |i: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
        let mut t = BlockTable::<(SeqHash, u64)>::splitting_at(64);
        for i in 0..20_000 {
            t.get_or_insert_with(key(i), || (key(i), i));
        }
        assert!(t.segs.len() > 8 * SEGMENTS, "{} segments", t.segs.len());
        assert!(t.segs.iter().all(|s| s.num_buckets() <= 64));
        assert_eq!(t.dir.len(), 1 << t.depth);
        for (i, &d) in t.dir.iter().enumerate() {
            let r = t.reach[d as usize];
            let top = (i as u64) << (64 - t.depth);
            assert_eq!(top >> (64 - r.depth), r.prefix >> (64 - r.depth));
        }
        for (seg, r) in t.segs.iter().zip(&t.reach) {
            for e in seg.iter() {
                assert_eq!(e.0.spread() >> (64 - r.depth), r.prefix >> (64 - r.depth));
            }
        }
        for i in 0..20_000 {
            assert_eq!(t.get(&key(i)).map(|e| e.1), Some(i));
        }
        // An emptied table starts again from its first segments.
        t.retain(|_| false);
        assert_eq!(t.allocation_size(), 0);
        t.get_or_insert_with(key(1), || (key(1), 1));
        assert_eq!((t.segs.len(), t.dir.len()), (SEGMENTS, SEGMENTS));
    }

    /// An export's parts, read one by one while stores split segments between them,
    /// pass every entry filed throughout exactly once, also at more bits than the
    /// table's shallowest segment.
    #[test]
    fn parts_read_between_splits_pass_every_entry_once() {
        let key = |i: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
        for extra in [0, 2] {
            let mut t = BlockTable::<(SeqHash, u64)>::splitting_at(64);
            for i in 0..5_000 {
                t.get_or_insert_with(key(i), || (key(i), i));
            }
            let bits = t.part_bits().expect("filed") + extra;
            let mut seen = Vec::new();
            let mut next = 5_000;
            for part in 0..1 << bits {
                seen.extend(t.iter_part(part, bits).map(|e| e.1));
                for _ in 0..40 {
                    t.get_or_insert_with(key(next), || (key(next), next));
                    next += 1;
                }
            }
            assert!(
                t.part_bits().unwrap() > bits - extra,
                "no split during the walk"
            );
            seen.sort_unstable();
            let dups = seen.windows(2).filter(|w| w[0] == w[1]).count();
            assert_eq!(dups, 0, "extra={extra}");
            assert!(
                (0..5_000).all(|i| seen.binary_search(&i).is_ok()),
                "extra={extra}"
            );
        }
    }

    /// Keys that share their top bits (crafted ones) still split, up to a bounded
    /// directory, and then grow as before.
    #[test]
    fn keys_sharing_their_top_bits_do_not_blow_up_the_directory() {
        // Spreads sharing their top 40 bits.
        let crafted = |i: u64| SeqHash(0x00AB_CDEF_1234 << 24 | i);
        let mut t = BlockTable::<(SeqHash, u64)>::splitting_at(64);
        for i in 0..5_000u64 {
            let k = crafted(i);
            t.get_or_insert_with(k, || (k, i));
        }
        assert!(t.depth <= MAX_DEPTH);
        assert_eq!(t.len(), 5_000);
        for i in 0..5_000u64 {
            assert_eq!(t.get(&crafted(i)).map(|e| e.1), Some(i));
        }
    }

    /// The longest single insert while growing to `KVIX_STALL_ENTRIES` (default 8M)
    /// entries, as one table, as segments that only double, and as this
    /// table (segments that split): the stall a query behind a resize waits. A
    /// figure, not a check:
    /// `cargo test --release --lib growth_stall -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn growth_stall() {
        use std::time::{Duration, Instant};
        let n = crate::testing::env_u64("KVIX_STALL_ENTRIES", 8 << 20);
        let key = |i: u64| SeqHash(xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()));
        let mut worst = Duration::ZERO;
        let mut m: hashbrown::HashMap<SeqHash, [u64; 3], SeqHasherBuilder> = Default::default();
        let t0 = Instant::now();
        for i in 0..n {
            let s = Instant::now();
            m.entry(key(i)).or_insert([i; 3]);
            worst = worst.max(s.elapsed());
        }
        println!("{n} entries");
        println!(
            "one table: total {:?}, worst insert {:?}",
            t0.elapsed(),
            worst
        );
        drop(m);
        for (name, split_at) in [
            ("doubling segments", usize::MAX),
            ("splitting segments", SPLIT_BUCKETS),
        ] {
            let mut worst = Duration::ZERO;
            let mut t = BlockTable::<(SeqHash, [u64; 3])>::splitting_at(split_at);
            let t0 = Instant::now();
            for i in 0..n {
                let s = Instant::now();
                t.get_or_insert_with(key(i), || (key(i), [i; 3]));
                worst = worst.max(s.elapsed());
            }
            println!("{name}: total {:?}, worst insert {:?}", t0.elapsed(), worst);
        }
    }
}
