//! The shards' families: queues, blocks per tier, predictions, memory.
//!
//! Owns the per-shard metric names, one sample per shard. Must never ask a shard
//! for anything: it reads the [`ShardStats`] the scrape gathered.

use super::encode::{Gathered, Value};
use super::stats::ShardStats;
use crate::shard::PredictionCounts;
use crate::types::Tier;
use prometheus_client::metrics::MetricType;

fn tier_label(t: usize) -> String {
    match Tier(t as u8) {
        Tier::DEVICE => "device".into(),
        Tier::HOST => "host_pinned".into(),
        Tier::DISK => "disk".into(),
        _ => format!("tier{t}"),
    }
}

type PerShard = (
    &'static str,
    &'static str,
    MetricType,
    fn(&ShardStats) -> Value,
);

/// Each shard's queues, size and its executor's polling.
const SHARD_QUEUES: [PerShard; 6] = [
    (
        "kvix_shard_ops_applied",
        "Ring ops applied by each shard",
        MetricType::Counter,
        |s| Value::Counter(s.applied),
    ),
    (
        "kvix_ring_pending",
        "Ops waiting on each shard's rings",
        MetricType::Gauge,
        |s| Value::Gauge(s.pending as i64),
    ),
    (
        "kvix_ops_waiting_for_clear",
        "Ops held until the clear of their worker's tier is walked (they apply, in order, once it is)",
        MetricType::Gauge,
        |s| Value::Gauge(s.waiting as i64),
    ),
    (
        "kvix_ring_full_stalls",
        "Times an ingest thread found a shard's ring full and waited",
        MetricType::Counter,
        |s| Value::Counter(s.stalls),
    ),
    (
        "kvix_executor_polling_yielded",
        "Times an executor stopped polling between queries because another thread wanted its core",
        MetricType::Counter,
        |s| Value::Counter(s.polling_yielded),
    ),
    (
        "kvix_shard_blocks",
        "Blocks held by each shard",
        MetricType::Gauge,
        |s| Value::Gauge(s.blocks as i64),
    ),
];

/// `/speculate`'s counters, one family each, in the order of [`prediction_counts`].
const PREDICTION_COUNTERS: [(&str, &str); 6] = [
    (
        "kvix_predictions_created",
        "Predicted (block, worker) pairs created by /speculate",
    ),
    (
        "kvix_predictions_refreshed",
        "Predictions given a later deadline by another /speculate",
    ),
    (
        "kvix_predictions_confirmed",
        "Predictions confirmed by the worker's BlockStored (now ordinary holders)",
    ),
    (
        "kvix_predictions_expired",
        "Predictions that reached their TTL unconfirmed",
    ),
    (
        "kvix_predictions_pruned",
        "Predictions ended early to keep an approximate index under its maximum size",
    ),
    (
        "kvix_prediction_refusals",
        "/speculate requests refused by --max-predictions (longer than it, or the index at it)",
    ),
];

/// A shard's prediction counters, in the order of [`PREDICTION_COUNTERS`].
fn prediction_counts(p: &PredictionCounts) -> [u64; PREDICTION_COUNTERS.len()] {
    [
        p.created,
        p.refreshed,
        p.confirmed,
        p.expired,
        p.pruned,
        p.refused,
    ]
}

fn per_shard(g: &mut Gathered, shards: &[ShardStats], table: &[PerShard]) {
    for &(name, help, kind, value) in table {
        g.add(name, help, kind).per_shard(shards, value);
    }
}

/// The shards' families: queues, blocks per tier, predictions, memory.
pub(super) fn shard_families(g: &mut Gathered, shards: &[ShardStats]) {
    per_shard(g, shards, &SHARD_QUEUES);
    let f = g.add(
        "kvix_shard_tier_blocks",
        "(block, worker) pairs per shard and storage tier",
        MetricType::Gauge,
    );
    for s in shards {
        for (t, n) in s.tier_blocks.iter().enumerate().take(Tier::MEDIA) {
            if t < 3 || *n > 0 {
                f.with(
                    &[("shard", s.shard.to_string()), ("tier", tier_label(t))],
                    Value::Gauge(*n as i64),
                );
            }
        }
    }
    g.add(
        "kvix_predicted_blocks",
        "Live predicted (block, worker) pairs per shard (from /speculate, not yet confirmed or expired)",
        MetricType::Gauge,
    )
    .per_shard(shards, |s| {
        Value::Gauge(s.tier_blocks[Tier::PREDICTED.0 as usize] as i64)
    });
    for (i, (name, help)) in PREDICTION_COUNTERS.into_iter().enumerate() {
        g.add(name, help, MetricType::Counter)
            .per_shard(shards, |s| {
                Value::Counter(prediction_counts(&s.predictions)[i])
            });
    }
    g.add(
        "kvix_evicted_blocks",
        "Blocks evicted (least recently stored or matched first) to keep the index within --max-blocks",
        MetricType::Counter,
    )
    .per_shard(shards, |s| Value::Counter(s.evicted));
    g.add(
        "kvix_engine_map_heap_bytes",
        "Heap bytes of the shards' engine-hash maps (one entry per live block and worker; part of kvix_shard_heap_bytes)",
        MetricType::Gauge,
    )
    .with(
        &[],
        Value::Gauge(shards.iter().map(|s| s.engine_map_bytes).sum::<u64>() as i64),
    );
    g.add(
        "kvix_shard_heap_bytes",
        "Approximate heap bytes of each shard's index",
        MetricType::Gauge,
    )
    .per_shard(shards, |s| Value::Gauge(s.heap_bytes as i64));
}
