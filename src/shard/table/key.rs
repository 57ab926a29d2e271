//! What a table files its entries by: the keys ([`TableKey`]), how an entry
//! says its key ([`Keyed`], [`Filed`]), and the table hash of a key.
//!
//! Owns the hashing of keys. Must never hold an entry: the segments do.

use crate::types::{EngineHash, SeqHash};
use std::hash::{BuildHasher, Hasher};

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

/// What a [`BlockTable`] files entries by: a 64-bit block hash.
pub trait TableKey: Copy + Eq + std::fmt::Debug {
    /// The key's bits, spread so that every bit depends on all of them: the table
    /// picks segments by the top bits and buckets by the low bits of a multiple.
    fn spread(self) -> u64;
}

/// XXH3 output already.
impl TableKey for SeqHash {
    #[inline]
    fn spread(self) -> u64 {
        self.0
    }
}

/// Whatever an engine chose (a hash truncated to 64 bits, or an integer counting
/// up): the high half folded into the low one, multiplied, and the product's high
/// half folded back, so that the top bits and the low bits both depend on every
/// bit (a bijection).
impl TableKey for EngineHash {
    #[inline]
    fn spread(self) -> u64 {
        let k = (self.0 ^ (self.0 >> 32)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        k ^ (k >> 32)
    }
}

/// An entry of a [`BlockTable`]: the key it is filed under, read from the entry
/// and `ctx` (which the table's owner passes to every call that files, finds or
/// moves entries). The key of an entry never changes while the entry is in a
/// table (the table files it by it): what `ctx` says of it must not change
/// either.
pub trait Filed {
    type Key: TableKey;
    type Ctx: ?Sized;
    fn key_in(&self, ctx: &Self::Ctx) -> Self::Key;
    /// Hint the CPU to load what [`Self::key_in`] will read of `ctx`, so that a
    /// table moving many entries overlaps their misses. Does nothing else.
    #[inline]
    fn prefetch_key(&self, _ctx: &Self::Ctx) {}
}

/// An entry that says its own key (a [`Filed`] entry with no context).
pub trait Keyed {
    type Key: TableKey;
    fn key(&self) -> Self::Key;
}

impl<E: Keyed> Filed for E {
    type Key = E::Key;
    type Ctx = ();
    #[inline]
    fn key_in(&self, _: &()) -> E::Key {
        self.key()
    }
}

/// The plain entry: the key stored beside the value.
impl<K: TableKey, V> Keyed for (K, V) {
    type Key = K;
    #[inline]
    fn key(&self) -> K {
        self.0
    }
}

/// The table hash of `key`: for a `SeqHash`, what [`SeqHasherBuilder`] gives it.
#[inline]
pub(super) fn hash(key: impl TableKey) -> u64 {
    key.spread().wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The table hash of an entry, to move it.
#[inline]
pub(super) fn rehash<E: Filed>(ctx: &E::Ctx) -> impl Fn(&E) -> u64 + '_ {
    move |e| hash(e.key_in(ctx))
}
