//! Domain newtypes shared by every layer.
//!
//! Owns the vocabulary (hashes, slots, tiers, shard and index ids) so that no
//! bare `u64` travels between modules with its meaning lost. Holds no state.

use std::fmt;

/// kvix/Dynamo local block hash: XXH3-64 of one block's tokens (seeded).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockHash(pub u64);

/// kvix/Dynamo rolling sequence (prefix) hash; identifies a block *and* its prefix.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SeqHash(pub u64);

/// A block hash as the engine published it (vLLM/SGLang); only comparable within one worker.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EngineHash(pub u64);

macro_rules! hex_debug {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#018x})", stringify!($t), self.0)
            }
        }
    )*};
}
hex_debug!(BlockHash, SeqHash, EngineHash);

/// Dense id of one (instance, dp rank) inside one (model, tenant) index.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct WorkerSlot(pub u32);

impl WorkerSlot {
    /// Slots are packed with an 8-bit tier mask and four group lanes into a `u32`
    /// holder word whose top bit stays clear (a holder set marks a spilled set
    /// with it): 19 bits, less one slot to spare.
    pub const MAX: u32 = (1 << 19) - 2;
}

/// Storage tier of a cached block. 0..=2 are the well-known ones; other media
/// are interned into the remaining ids and kept as tiers of their own.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Tier(pub u8);

impl Tier {
    pub const DEVICE: Tier = Tier(0);
    pub const HOST: Tier = Tier(1);
    pub const DISK: Tier = Tier(2);
    /// Not a medium: the worker is predicted to hold the block soon (`/speculate`).
    /// Scored as the device; never dumped, snapshotted or named as a tier.
    pub const PREDICTED: Tier = Tier(7);
    /// Tiers fit in an 8-bit mask per holder.
    pub const COUNT: usize = 8;
    /// Tiers an engine's medium can map to (all but [`Tier::PREDICTED`]).
    pub const MEDIA: usize = Tier::COUNT - 1;

    /// Map an engine's `medium` string (any case) to a tier; `None` (vLLM's
    /// default) is the device. Device: GPU/NPU/HBM and other accelerators; host:
    /// CPU, SGLang's `CPU_PINNED`, Mooncake replica type `memory`; disk: DISK,
    /// SSD, NVMe, Mooncake `local_disk`, shared file systems (3FS, DFS, NFS).
    /// Returns `None` for unknown media (e.g. SGLang `EXTERNAL`), which the
    /// registry interns as tiers of their own.
    pub fn well_known(medium: Option<&str>) -> Option<Tier> {
        let Some(m) = medium else {
            return Some(Tier::DEVICE);
        };
        const KNOWN: [(&str, Tier); 21] = [
            ("GPU", Tier::DEVICE),
            ("NPU", Tier::DEVICE),
            ("HBM", Tier::DEVICE),
            ("DEVICE", Tier::DEVICE),
            ("CUDA", Tier::DEVICE),
            ("XPU", Tier::DEVICE),
            ("TPU", Tier::DEVICE),
            ("CPU", Tier::HOST),
            ("CPU_PINNED", Tier::HOST),
            ("PINNED", Tier::HOST),
            ("HOST", Tier::HOST),
            ("HOST_PINNED", Tier::HOST),
            ("DRAM", Tier::HOST),
            ("MEMORY", Tier::HOST),
            ("DISK", Tier::DISK),
            ("LOCAL_DISK", Tier::DISK),
            ("SSD", Tier::DISK),
            ("NVME", Tier::DISK),
            ("3FS", Tier::DISK),
            ("DFS", Tier::DISK),
            ("NFS", Tier::DISK),
        ];
        KNOWN
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(m))
            .map(|&(_, t)| t)
    }

    /// The set holding just this tier.
    pub const fn bit(self) -> TierSet {
        TierSet(1 << self.0)
    }
}

/// A set of tiers, one bit per [`Tier`]: where a holder keeps a block, or which tiers
/// a removal or clear applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct TierSet(pub u8);

impl TierSet {
    pub const NONE: TierSet = TierSet(0);
    pub const ALL: TierSet = TierSet(0xff);
    /// Every tier a medium can name: what an engine's removal or clear can reach.
    pub const MEDIA: TierSet = TierSet(0x7f);

    pub const fn contains(self, t: Tier) -> bool {
        self.0 & (1 << t.0) != 0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The tiers of `self` not in `other`.
    pub const fn without(self, other: TierSet) -> TierSet {
        TierSet(self.0 & !other.0)
    }

    /// The tiers in the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = Tier> {
        (0..Tier::COUNT as u8)
            .filter(move |t| self.0 >> t & 1 == 1)
            .map(Tier)
    }
}

impl std::ops::BitOr for TierSet {
    type Output = TierSet;
    fn bitor(self, o: TierSet) -> TierSet {
        TierSet(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for TierSet {
    fn bitor_assign(&mut self, o: TierSet) {
        self.0 |= o.0;
    }
}

impl std::ops::BitAnd for TierSet {
    type Output = TierSet;
    fn bitand(self, o: TierSet) -> TierSet {
        TierSet(self.0 & o.0)
    }
}

/// Index of one executor's shard: the blocks of the worker slots it owns.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ShardId(pub usize);

/// Dense id of one (model, tenant) index.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct IndexId(pub u32);

/// A worker instance inside kvix. Below 2^64 it is the router's integer id itself
/// (Dynamo's `instance_id`, the whole u64 range); from 2^64 up it stands for an
/// instance registered by a string name (Mooncake's), whose name the registry keeps.
/// The two ranges cannot meet, so no integer id is ever mistaken for a name.
pub type InstanceId = u128;
/// Data-parallel rank within an instance.
pub type DpRank = u32;
