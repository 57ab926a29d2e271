//! A listener's counters, as its ingest thread writes them and metrics read them.
//!
//! Owns what is counted per listener. Must never hold anything but atomics read
//! relaxed: only its ingest thread writes them, so nothing orders on them.

use crate::ingest::sequence::{Cursor, Step};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one listener; written only by its ingest thread, read by metrics.
#[derive(Default, Debug)]
pub struct FeedStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub blocks_stored: AtomicU64,
    /// Events by kind that reached a worker slot (Dynamo counts per event); a store
    /// once it passed its checks and went to the shard.
    pub stored_events: AtomicU64,
    pub removed_events: AtomicU64,
    pub cleared_events: AtomicU64,
    pub blocks_removed: AtomicU64,
    pub malformed: AtomicU64,
    pub block_size_mismatch: AtomicU64,
    /// Well-formed events with nothing kvix can index (Mooncake replica
    /// updates, object-key-only events, auxiliary KV-cache groups).
    pub ignored_events: AtomicU64,
    pub gaps: AtomicU64,
    /// Batches the gaps left out (before any replay); saturates, never wraps.
    pub gap_batches: AtomicU64,
    /// Frames numbered at or below the stream's last: the engine restarted.
    pub restarts: AtomicU64,
    pub last_seq: AtomicU64,
}

impl FeedStats {
    #[inline]
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Add `n` to a counter that a hostile sequence number could otherwise wrap (a
    /// jump near `u64::MAX`): it stops at the top, so it never goes down.
    pub fn bump_saturating(c: &AtomicU64, n: u64) {
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_add(n))
        });
    }

    /// Count what `step` says about the stream: a gap and its missing batches, or a
    /// restart.
    pub fn count(&self, step: Step) {
        match step {
            Step::Gap { missing, .. } => {
                Self::bump(&self.gaps, 1);
                Self::bump_saturating(&self.gap_batches, missing);
            }
            Step::Restart { .. } => Self::bump(&self.restarts, 1),
            Step::First | Step::Next => {}
        }
    }

    /// The stream (its cursor) received the frame with sequence `seq`.
    pub fn received(&self, cursor: &mut Cursor, seq: u64) {
        cursor.advance(seq);
        self.last_seq.store(seq, Ordering::Relaxed);
    }
}
