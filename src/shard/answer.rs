//! What one shard answers for one query ([`answer`]): its slots' holders of the
//! prompt's blocks, each slot's tree size and its hybrid-attention prefix. Runs on
//! the shard's own executor and changes no holder (a match only counts as a use
//! for a bounded shard's eviction); merging the shards' answers and scoring them
//! is `score.rs`'s.

use super::{Prompt, Shard};
use crate::types::{BlockHash, IndexId, SeqHash, WorkerSlot};

/// What one shard answers for a query: its slots' holders of the prompt's blocks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ShardReply {
    /// Per block, in order: `[n, holder_1 .. holder_n]`, or
    /// [`SAME_HOLDERS`](crate::shard::SAME_HOLDERS) for a block held exactly as the
    /// one before it, ending at the first block none of the shard's slots holds (the
    /// prefix ends there for each of them).
    pub holders: Vec<u32>,
    /// Blocks held per slot in this shard (for `tree_sizes`).
    pub per_slot: Vec<u32>,
    /// Per slot with KV-cache groups besides full attention, the blocks it would
    /// reuse under their rules (its `effective` prefix).
    pub effective: Vec<(WorkerSlot, u32)>,
}

/// A query's blocks, as the shards are sent them (see [`Prompt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptBlocks {
    Locals(Vec<BlockHash>),
    Seqs(Vec<SeqHash>),
}

impl PromptBlocks {
    pub fn as_prompt(&self) -> Prompt<'_> {
        match self {
            PromptBlocks::Locals(l) => Prompt::Locals(l),
            PromptBlocks::Seqs(s) => Prompt::Seqs(s),
        }
    }

    pub fn len(&self) -> usize {
        self.as_prompt().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What `shard` answers for a query on `index`.
pub fn answer(shard: &mut Shard, index: IndexId, prompt: Prompt<'_>) -> ShardReply {
    let mut reply = ShardReply {
        holders: Vec::with_capacity(prompt.len() * 3),
        per_slot: Vec::new(),
        effective: Vec::new(),
    };
    shard.lookup(index, prompt, &mut reply.holders);
    shard.effective(index, &mut reply.effective);
    if let Some(ix) = shard.index(index) {
        ix.tree_sizes_into(&mut reply.per_slot);
    }
    reply
}
