//! A feed's KV-cache groups other than full attention: which group an event is
//! of, what its stores say of the group, and the holds its blocks become.
//!
//! Owns the groups each slot feed has told its shard. Must never file a
//! full-attention block: those are the feed's stores.

use super::{FeedStats, WorkerFeed};
use crate::ring::OpSink;
use crate::shard::ShardOp;
use crate::shard::hybrid::{GroupRule, GroupSpec};
use crate::shard::tree::MAX_GROUPS;
use crate::wire::{Event, EventOp, GroupKind};

impl WorkerFeed {
    /// The KV-cache group (other than full attention) an event is of, if any. A
    /// removal naming a group is of the kind that group's stores said; a removal
    /// naming a full-attention group, or group 0 when no store described it, is
    /// the index's; one naming another group no store described is dropped
    /// (later, counted), as Dynamo drops it.
    pub(super) fn group_of(&self, i: usize, ev: &Event<'_>) -> Option<u32> {
        match ev.group_kind {
            GroupKind::Full => None,
            GroupKind::Named => {
                let g = ev.group_idx?;
                let sf = &self.slots[i];
                let other = sf.groups.iter().any(|&(x, _)| x == g);
                (other || (g != 0 && !sf.full_groups.contains(&g))).then_some(g)
            }
            _ => Some(ev.group_idx.unwrap_or(0)),
        }
    }

    /// An event of a KV-cache group other than full attention: its blocks'
    /// holds in that group, which the shard keeps beside the full-attention ones.
    /// Its stores were described to the shard in the batch's first pass
    /// ([`Self::learn_group`]), so a removal later in the batch finds its group.
    pub(super) fn group_event(
        &mut self,
        i: usize,
        group: u32,
        ev: &Event<'_>,
        sink: &mut impl OpSink,
    ) {
        let stats = self.stats.clone();
        if !self.slots[i].groups.iter().any(|&(g, _)| g == group) {
            // A group no store described has no rule to score by (a store that
            // could not describe it was counted then).
            if ev.op == EventOp::Removed {
                FeedStats::bump(&stats.ignored_events, 1);
            }
            return;
        }
        if !matches!(ev.op, EventOp::Stored | EventOp::Removed) {
            return;
        }
        let sf = &self.slots[i];
        let held = ev.op == EventOp::Stored;
        for &block in ev.hashes {
            sink.push(ShardOp::GroupHold {
                index: sf.index,
                slot: sf.slot,
                group: group as u8,
                block,
                held,
            });
        }
        let counter = if held {
            &stats.blocks_stored
        } else {
            &stats.blocks_removed
        };
        FeedStats::bump(counter, ev.hashes.len() as u64);
    }

    /// What a group's store says of the group, told to the shard when it is new
    /// or changed. A store kvix cannot place is counted: a `group_idx` past
    /// [`MAX_GROUPS`], a block size that is not a multiple of the registration's.
    pub(super) fn learn_group(
        &mut self,
        i: usize,
        group: u32,
        ev: &Event<'_>,
        sink: &mut impl OpSink,
    ) {
        if group >= MAX_GROUPS {
            FeedStats::bump(&self.stats.ignored_events, 1);
            return;
        }
        let base = self.block_size as u32;
        let block_size = ev.block_size.unwrap_or(base);
        if block_size == 0 || !block_size.is_multiple_of(base) {
            FeedStats::bump(&self.stats.block_size_mismatch, 1);
            crate::warn_throttled!(
                instance = self.instance,
                group,
                block_size,
                base,
                "a KV-cache group's block size is not a multiple of the registration's; skipped"
            );
            return;
        }
        let rule = match ev.group_kind {
            GroupKind::SlidingWindow => GroupRule::SlidingWindow(ev.group_window.unwrap_or(0)),
            GroupKind::ChunkedLocal => {
                GroupRule::ChunkedLocal(self.opts.attention_chunk_size.unwrap_or(0))
            }
            _ => GroupRule::Mamba,
        };
        let spec = GroupSpec { rule, block_size };
        let sf = &mut self.slots[i];
        match sf.groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, s)) if *s == spec => return,
            Some((_, s)) => *s = spec,
            None => sf.groups.push((group, spec)),
        }
        sink.push(ShardOp::GroupSpec {
            index: sf.index,
            slot: sf.slot,
            group: group as u8,
            spec,
            align: self.opts.hybrid_align_tokens.unwrap_or(0),
            base,
        });
    }
}
