//! The one way to change a shard's blocks: [`ShardOp`], as the rings carry it from
//! the ingest threads (live events, replay, dumps and snapshots alike). An op is a
//! few words, `Copy`, and must stay within 48 bytes: the rings' chunks hold ops by
//! value.

use super::hybrid::GroupSpec;
use crate::types::{BlockHash, EngineHash, IndexId, SeqHash, Tier, TierSet, WorkerSlot};

/// The one way to change a shard's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardOp {
    /// `slot` holds the block it names `block` (local hash `local`) on `tier`, a
    /// child of the block it names `parent` (`None`: a first block). Consecutive
    /// stores of one slot and tier, each the child of the one before, are filed as
    /// one run; `event_start` marks an event's first block, where a run ends even if
    /// it chains on (an event that changes nothing is counted as a duplicate). With `by_seq` the publisher names blocks by standardized sequence
    /// hashes: a parent the slot does not name (another of its streams named it
    /// otherwise) is taken as the sequence hash it is, and the run is filed in the
    /// keyed table under the sequence hashes its tokens chain to.
    Store {
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        parent: Option<EngineHash>,
        block: EngineHash,
        local: BlockHash,
        by_seq: bool,
        event_start: bool,
    },
    /// `slot` holds the block with rolling sequence hash `seq` on `tier` (a
    /// publisher of standardized hashes that sends no tokens).
    StoreKeyed {
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        seq: SeqHash,
        parent: Option<SeqHash>,
    },
    /// A block of a dump or snapshot, parents first (see [`tree::Tree::seed`]).
    Seed {
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        block: EngineHash,
        local: BlockHash,
        parent: SeedParent,
    },
    /// An import's blocks are all applied: the sequence hashes it filed are forgotten.
    SeedDone { index: IndexId },
    /// `slot` no longer holds the block it names `block` on the tiers in `tiers`
    /// (a block stored by rolling hash alone is named by that hash).
    Remove {
        index: IndexId,
        slot: WorkerSlot,
        block: EngineHash,
        tiers: TierSet,
    },
    /// `slot` holds nothing any more on the tiers in `tiers` (AllBlocksCleared, unregister).
    ClearSlot {
        index: IndexId,
        slot: WorkerSlot,
        tiers: TierSet,
    },
    /// `slot`'s KV-cache group `group` (not full attention) is described by
    /// `spec`; `align` is the hit alignment in tokens when set (0: not set).
    GroupSpec {
        index: IndexId,
        slot: WorkerSlot,
        group: u8,
        spec: GroupSpec,
        align: u32,
        /// The index's block size, in which the tree counts blocks.
        base: u32,
    },
    /// `slot`'s KV-cache group `group` holds (`held`) or no longer holds the
    /// block the slot names `block` (a block it holds in full attention).
    GroupHold {
        index: IndexId,
        slot: WorkerSlot,
        group: u8,
        block: EngineHash,
        held: bool,
    },
}

// A ring chunk holds CHUNK ops; a larger op would cost every op more cache lines.
const _: () = assert!(std::mem::size_of::<ShardOp>() <= 48);

/// How a seeded block names its parent: by the slot's engine hash, by sequence
/// hash (among the blocks the import filed), both, or neither (a first block).
/// Two bare words and flags, packed to 4-byte alignment so that a seed is no
/// larger than a store on the rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, packed(4))]
pub struct SeedParent {
    engine: u64,
    seq: u64,
    known: u8,
}

impl SeedParent {
    const ENGINE: u8 = 1;
    const SEQ: u8 = 2;

    pub fn new(engine: Option<EngineHash>, seq: Option<SeqHash>) -> Self {
        SeedParent {
            engine: engine.map_or(0, |e| e.0),
            seq: seq.map_or(0, |s| s.0),
            known: engine.map_or(0, |_| Self::ENGINE) | seq.map_or(0, |_| Self::SEQ),
        }
    }

    pub fn engine(&self) -> Option<EngineHash> {
        (self.known & Self::ENGINE != 0).then_some(EngineHash(self.engine))
    }

    pub fn seq(&self) -> Option<SeqHash> {
        (self.known & Self::SEQ != 0).then_some(SeqHash(self.seq))
    }
}

impl ShardOp {
    /// The index an op changes.
    pub fn index(&self) -> IndexId {
        match *self {
            ShardOp::Store { index, .. }
            | ShardOp::StoreKeyed { index, .. }
            | ShardOp::Seed { index, .. }
            | ShardOp::SeedDone { index }
            | ShardOp::Remove { index, .. }
            | ShardOp::ClearSlot { index, .. }
            | ShardOp::GroupSpec { index, .. }
            | ShardOp::GroupHold { index, .. } => index,
        }
    }

    /// The worker slot an op changes (its shard's key); `None` for the end of an
    /// import, which goes to every shard.
    pub fn slot(&self) -> Option<WorkerSlot> {
        match *self {
            ShardOp::Store { slot, .. }
            | ShardOp::StoreKeyed { slot, .. }
            | ShardOp::Seed { slot, .. }
            | ShardOp::Remove { slot, .. }
            | ShardOp::ClearSlot { slot, .. }
            | ShardOp::GroupSpec { slot, .. }
            | ShardOp::GroupHold { slot, .. } => Some(slot),
            ShardOp::SeedDone { .. } => None,
        }
    }

    /// The ops that store `seqs` by sequence hash alone, each block the child of
    /// the one before and the first the child of `parent`: a chain a publisher
    /// named by standardized hashes, or a run whose parent only its hash names.
    pub fn keyed_chain(
        index: IndexId,
        slot: WorkerSlot,
        tier: Tier,
        parent: Option<SeqHash>,
        seqs: impl IntoIterator<Item = SeqHash>,
    ) -> impl Iterator<Item = ShardOp> {
        seqs.into_iter().scan(parent, move |parent, seq| {
            let op = ShardOp::StoreKeyed {
                index,
                slot,
                tier,
                seq,
                parent: *parent,
            };
            *parent = Some(seq);
            Some(op)
        })
    }
}
