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
    /// Slots are packed with an 8-bit tier mask into a `u32` holder word.
    pub const MAX: u32 = (1 << 24) - 2;
}

/// Storage tier of a cached block. 0..=2 are the well-known ones; other media
/// are interned into the remaining ids and kept as tiers of their own.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Tier(pub u8);

impl Tier {
    pub const DEVICE: Tier = Tier(0);
    pub const HOST: Tier = Tier(1);
    pub const DISK: Tier = Tier(2);
    /// Tiers fit in an 8-bit mask per holder.
    pub const COUNT: usize = 8;

    /// Map an engine's `medium` string to a tier; `None` (vLLM's default) is the device.
    /// Returns `None` for unknown media, which the caller interns.
    pub fn well_known(medium: Option<&str>) -> Option<Tier> {
        let Some(m) = medium else {
            return Some(Tier::DEVICE);
        };
        let known: [(&str, Tier); 12] = [
            ("GPU", Tier::DEVICE),
            ("NPU", Tier::DEVICE),
            ("HBM", Tier::DEVICE),
            ("DEVICE", Tier::DEVICE),
            ("CUDA", Tier::DEVICE),
            ("XPU", Tier::DEVICE),
            ("CPU", Tier::HOST),
            ("HOST", Tier::HOST),
            ("DRAM", Tier::HOST),
            ("DISK", Tier::DISK),
            ("SSD", Tier::DISK),
            ("NVME", Tier::DISK),
        ];
        known
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(m))
            .map(|&(_, t)| t)
    }

    pub const fn bit(self) -> u8 {
        1 << self.0
    }
}

/// Index of one executor's shard of the block-hash space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ShardId(pub usize);

/// Dense id of one (model, tenant) index.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct IndexId(pub u32);

/// Router-facing worker instance id (Dynamo: integer).
pub type InstanceId = u64;
/// Data-parallel rank within an instance.
pub type DpRank = u32;
