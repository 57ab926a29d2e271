//! The process-wide counters: ingest, replay, refusals, recovery.
//!
//! Owns their names and where each is read from ([`Scrape`]). Must never write
//! a counter: the ingest threads, the replayer and recovery own theirs.

use super::encode::{Gathered, Value};
use super::stats::ShardStats;
use crate::app::{App, RecoveryStats};
use crate::ingest::feed::FeedStats;
use crate::ingest::{ListenerStats, ReplayStats};
use crate::registry::Snapshot;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the process-wide totals are read from.
pub(super) struct Scrape<'a> {
    pub(super) app: &'a App,
    pub(super) shards: &'a [ShardStats],
    pub(super) listeners: Vec<ListenerStats>,
}

impl Scrape<'_> {
    /// One ingest counter summed over every listener.
    pub(super) fn feed(&self, counter: fn(&FeedStats) -> &AtomicU64) -> u64 {
        self.listeners
            .iter()
            .map(|l| counter(&l.3).load(Ordering::Relaxed))
            .fold(0u64, u64::saturating_add)
    }

    /// A counter of the bound sockets (`--zmq-bind`).
    pub(super) fn bound(&self, counter: fn(&crate::ingest::bind::BindStats) -> &AtomicU64) -> u64 {
        counter(&self.app.ingest().bind_stats).load(Ordering::Relaxed)
    }

    /// One shard figure summed over the shards.
    pub(super) fn shards(&self, figure: fn(&ShardStats) -> u64) -> u64 {
        self.shards.iter().map(figure).sum()
    }

    pub(super) fn replay(&self, counter: fn(&ReplayStats) -> &AtomicU64) -> u64 {
        counter(&self.app.ingest().replay_stats).load(Ordering::Relaxed)
    }

    pub(super) fn recovery(&self, counter: fn(&RecoveryStats) -> &AtomicU64) -> u64 {
        counter(self.app.recovery_stats()).load(Ordering::Relaxed)
    }

    /// Per engine stream: the last batch sequence applied (compare with the engine's).
    pub(super) fn last_sequences(&self, g: &mut Gathered, snap: &Snapshot) {
        let mut last: BTreeMap<(String, u32), u64> = BTreeMap::new();
        for l in &self.listeners {
            let seq = l.3.last_seq.load(Ordering::Relaxed);
            let e = last
                .entry((snap.instance_key(l.1).to_string(), l.2))
                .or_default();
            *e = (*e).max(seq);
        }
        let f = g.add(
            "kvix_listener_last_sequence",
            "Last batch sequence number applied per (instance, dp rank); no series above \
             --metrics-max-workers streams",
            MetricType::Gauge,
        );
        if last.len() > self.app.metrics_max_workers() {
            return;
        }
        for ((instance, dp), seq) in last {
            f.with(
                &[("instance", instance), ("dp", dp.to_string())],
                Value::Gauge(seq as i64),
            );
        }
    }
}

pub(super) type Total = (&'static str, &'static str, fn(&Scrape) -> u64);

/// The process-wide counters: ingest, replay, refusals, recovery.
pub(super) const TOTALS: [Total; 25] = [
    (
        "kvix_batches_received",
        "Event batches received from engines",
        |s| s.feed(|f| &f.batches),
    ),
    (
        "kvix_events_applied",
        "KV events applied (live and replayed)",
        |s| s.feed(|f| &f.events),
    ),
    (
        "kvix_blocks_stored",
        "Blocks stored by BlockStored events",
        |s| s.feed(|f| &f.blocks_stored),
    ),
    (
        "kvix_blocks_removed",
        "Blocks named by BlockRemoved events",
        |s| s.feed(|f| &f.blocks_removed),
    ),
    (
        "kvix_malformed_frames",
        "Frames that failed to decode and were skipped",
        |s| s.feed(|f| &f.malformed) + s.bound(|b| &b.malformed_frames),
    ),
    (
        "kvix_malformed_topics",
        "Frames on a --zmq-bind socket whose topic is not kv@<pod>@<model> (skipped)",
        |s| s.bound(|b| &b.malformed_topics),
    ),
    (
        "kvix_unknown_parent_blocks",
        "Stores (runs of blocks) skipped because their worker names no such parent",
        |s| s.shards(|s| s.unknown_parent),
    ),
    (
        "kvix_unknown_removed_blocks",
        "Removals of blocks their worker does not hold",
        |s| s.shards(|s| s.unknown_removed),
    ),
    (
        "kvix_ignored_events",
        "Well-formed events with nothing to index (a KV-cache group kvix has no rule for, Mooncake replica updates, object-key-only events)",
        |s| s.feed(|f| &f.ignored_events),
    ),
    (
        "kvix_group_blocks_unheld",
        "Stores and removals of a sliding-window, chunked or Mamba group's blocks that their worker does not hold in full attention (not kept)",
        |s| s.shards(|s| s.group_unheld),
    ),
    (
        "kvix_block_size_mismatch",
        "Stores skipped because their block size is not the registration's",
        |s| s.feed(|f| &f.block_size_mismatch),
    ),
    (
        "kvix_sequence_gaps",
        "Sequence gaps detected (seq > last + 1)",
        |s| s.feed(|f| &f.gaps),
    ),
    (
        "kvix_sequence_gap_batches",
        "Batches the sequence gaps left out, before replay",
        |s| s.feed(|f| &f.gap_batches),
    ),
    (
        "kvix_sequence_restarts",
        "Frames numbered at or below their stream's last (the engine restarted; its stream starts over)",
        |s| s.feed(|f| &f.restarts),
    ),
    (
        "kvix_replay_cold_starts",
        "Streams whose first frame was above 0, replayed from the engine's buffer from 0",
        |s| s.replay(|r| &r.cold_starts),
    ),
    (
        "kvix_replay_requests",
        "Replay requests sent to engines",
        |s| s.replay(|r| &r.requests),
    ),
    (
        "kvix_replay_failures",
        "Replay requests that got no (valid) answer; the gap stays unrecovered",
        |s| s.replay(|r| &r.failures),
    ),
    (
        "kvix_replayed_batches",
        "Batches applied from replays",
        |s| s.replay(|r| &r.batches),
    ),
    (
        "kvix_replay_unrecovered_batches",
        "Missing batches a replay could not return (gone from the engine's buffer)",
        |s| s.replay(|r| &r.unrecovered),
    ),
    (
        "kvix_replay_duplicates",
        "Live batches skipped because a replay already applied them",
        |s| s.replay(|r| &r.duplicates),
    ),
    (
        "kvix_event_refusals",
        "Indexes or worker slots that event data asked for beyond --max-event-indexes / --max-event-slots",
        |s| s.app.registry().event_refusals.load(Ordering::Relaxed),
    ),
    ("kvix_snapshots_written", "Local snapshots written", |s| {
        s.recovery(|r| &r.snapshots_written)
    }),
    (
        "kvix_snapshot_failures",
        "Local snapshots that could not be written",
        |s| s.recovery(|r| &r.snapshot_failures),
    ),
    (
        "kvix_snapshots_rejected",
        "Snapshots refused at start (version, checksum, truncation, i/o), moved aside as <path>.rejected-<unix time>",
        |s| s.recovery(|r| &r.snapshots_rejected),
    ),
    (
        "kvix_bootstrap_blocks",
        "Blocks seeded from a snapshot or a peer's dump",
        |s| s.recovery(|r| &r.seeded_blocks),
    ),
];
