//! The figures each core keeps for a scrape: its HTTP routes' counts and
//! latencies, and its shard's [`ShardStats`].
//!
//! Owns what is counted, not how it is shown. Plain fields, no atomics: each
//! executor writes only its own, and a scrape copies them over the mesh. Must
//! never name a metric (that is the families' job).

use crate::types::Tier;
use std::collections::BTreeMap;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
pub const BUCKETS: [f64; 16] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 5.0,
];

/// One latency histogram: per-bucket (not cumulative) counts, the last for +Inf.
#[derive(Clone, Debug, Default)]
pub struct Hist {
    pub counts: [u64; BUCKETS.len() + 1],
    pub sum: f64,
    pub count: u64,
}

impl Hist {
    pub fn observe(&mut self, secs: f64) {
        let i = BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len());
        self.counts[i] += 1;
        self.sum += secs;
        self.count += 1;
    }

    pub(super) fn merge(&mut self, o: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.sum += o.sum;
        self.count += o.count;
    }
}

/// Figures of one (endpoint, method) on one core.
#[derive(Clone, Debug, Default)]
pub struct RouteStats {
    pub requests: u64,
    pub errors_4xx: u64,
    pub errors_5xx: u64,
    pub latency: Hist,
}

/// One executor's HTTP figures, keyed by (endpoint, method).
#[derive(Clone, Debug, Default)]
pub struct HttpStats {
    pub routes: BTreeMap<(&'static str, &'static str), RouteStats>,
    /// Requests failed (503) because a shard did not answer its part.
    pub shard_failures: u64,
    /// Slot-tracker bodies refused (413) for their size.
    pub slot_bodies_refused: u64,
}

/// The routes kvix serves; anything else is counted as "other" (bounded label values).
const ROUTES: [&str; 12] = [
    "/health",
    "/ready",
    "/metrics",
    "/workers",
    "/dump",
    "/peers",
    "/register",
    "/unregister",
    "/query",
    "/query_by_hash",
    "/register_peer",
    "/deregister_peer",
];

const CONDUCTOR_ROUTES: [&str; 6] = [
    "/conductor/health",
    "/conductor/workers",
    "/conductor/register",
    "/conductor/unregister",
    "/conductor/query",
    "/conductor/query_by_hash",
];

impl HttpStats {
    pub fn record(&mut self, path: &str, method: &hyper::Method, status: u16, took: Duration) {
        // Mooncake's conductor routes (`/conductor/...`) are labelled as such.
        let endpoint = ROUTES
            .iter()
            .find(|r| **r == path)
            .or_else(|| CONDUCTOR_ROUTES.iter().find(|r| **r == path))
            .copied()
            .unwrap_or("other");
        let method = match *method {
            hyper::Method::GET => "GET",
            hyper::Method::POST => "POST",
            hyper::Method::PUT => "PUT",
            hyper::Method::DELETE => "DELETE",
            _ => "OTHER",
        };
        let r = self.routes.entry((endpoint, method)).or_default();
        r.requests += 1;
        match status {
            400..=499 => r.errors_4xx += 1,
            500..=599 => r.errors_5xx += 1,
            _ => {}
        }
        r.latency.observe(took.as_secs_f64());
    }
}

/// One shard's figures at scrape time.
#[derive(Clone, Debug, Default)]
pub struct ShardStats {
    pub shard: usize,
    /// Ops applied since start.
    pub applied: u64,
    /// Ops waiting on this shard's rings.
    pub pending: u64,
    /// Ops applied from the rings but held until a clear of their slot is walked.
    pub waiting: u64,
    /// Times a producer found one of this shard's rings full.
    pub stalls: u64,
    /// Times the executor stopped polling between queries because another thread
    /// wanted its core.
    pub polling_yielded: u64,
    pub blocks: u64,
    /// (block, holder) pairs per tier.
    pub tier_blocks: [u64; Tier::COUNT],
    /// What `/speculate`'s predictions did in this shard.
    pub predictions: crate::shard::PredictionCounts,
    /// Blocks evicted to stay within `--max-blocks`.
    pub evicted: u64,
    /// Stores skipped for a parent their worker does not name, removals of blocks
    /// their worker does not hold.
    pub unknown_parent: u64,
    pub unknown_removed: u64,
    /// Stores that changed nothing (their worker held every block already).
    pub duplicate_stores: u64,
    /// Blocks of a KV-cache group other than full attention that their worker
    /// does not hold in full attention (not kept).
    pub group_unheld: u64,
    /// Heap bytes of the engine-hash maps (part of `heap_bytes`).
    pub engine_map_bytes: u64,
    pub heap_bytes: u64,
    pub http: HttpStats,
    /// The slot trackers this shard owns.
    pub slots: crate::slot_tracker::SlotStats,
}
