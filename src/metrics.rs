//! `/metrics`: Prometheus text with Dynamo's indexer metric names plus kvix's own.
//!
//! Owns the metric names and their rendering. Nothing here is shared on the hot path:
//! HTTP figures are kept per executor in plain fields ([`HttpStats`], no atomics),
//! shard figures live in each shard; a scrape asks every core for its [`ShardStats`]
//! over the mesh, adds the ingest threads' counters, and encodes the lot with
//! `prometheus-client` through a one-shot collector.

use crate::service::App;
use crate::types::Tier;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
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

    fn merge(&mut self, o: &Hist) {
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
    /// Heap bytes of the engine-hash maps (part of `heap_bytes`).
    pub engine_map_bytes: u64,
    pub heap_bytes: u64,
    pub http: HttpStats,
}

type Labels = Vec<(String, String)>;

enum Value {
    Counter(u64),
    Gauge(i64),
    Hist(Hist),
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// Everything one scrape shows, gathered before encoding.
#[derive(Default)]
struct Gathered {
    families: Vec<Family>,
}

impl std::fmt::Debug for Gathered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gathered({} families)", self.families.len())
    }
}

impl Gathered {
    fn add(&mut self, name: &'static str, help: &'static str, kind: MetricType) -> &mut Family {
        self.families.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }
}

impl Family {
    /// One sample per shard, labelled with the shard's number.
    fn per_shard(&mut self, shards: &[ShardStats], value: impl Fn(&ShardStats) -> Value) {
        for s in shards {
            self.with(&[("shard", s.shard.to_string())], value(s));
        }
    }

    fn with(&mut self, labels: &[(&str, String)], v: Value) -> &mut Self {
        self.samples.push((
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            v,
        ));
        self
    }
}

impl Collector for Gathered {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let mut me = enc.encode_descriptor(f.name, f.help, None, f.kind)?;
            // A single unlabelled sample is written bare (`name 1`, not `name{} 1`).
            if let [(labels, v)] = f.samples.as_slice()
                && labels.is_empty()
            {
                encode_value(v, me)?;
                continue;
            }
            for (labels, v) in &f.samples {
                encode_value(v, me.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

fn encode_value(
    v: &Value,
    mut enc: prometheus_client::encoding::MetricEncoder,
) -> Result<(), std::fmt::Error> {
    match v {
        Value::Counter(n) => ConstCounter::new(*n).encode(enc),
        Value::Gauge(n) => ConstGauge::new(*n).encode(enc),
        Value::Hist(h) => {
            let buckets: Vec<(f64, u64)> = BUCKETS
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .zip(h.counts.iter().copied())
                .collect();
            enc.encode_histogram::<Vec<(String, String)>>(h.sum, h.count, &buckets, None)
        }
    }
}

fn tier_label(t: usize) -> String {
    match Tier(t as u8) {
        Tier::DEVICE => "device".into(),
        Tier::HOST => "host_pinned".into(),
        Tier::DISK => "disk".into(),
        _ => format!("tier{t}"),
    }
}

/// Render the Prometheus text for `app` and the shards' figures.
pub fn render(app: &App, shards: &[ShardStats]) -> String {
    let mut g = Gathered::default();
    // HTTP, merged over cores.
    let mut routes: BTreeMap<(&str, &str), RouteStats> = BTreeMap::new();
    for s in shards {
        for (k, r) in &s.http.routes {
            let m = routes.entry(*k).or_default();
            m.requests += r.requests;
            m.errors_4xx += r.errors_4xx;
            m.errors_5xx += r.errors_5xx;
            m.latency.merge(&r.latency);
        }
    }
    let mut by_endpoint: BTreeMap<&str, RouteStats> = BTreeMap::new();
    for ((ep, _), r) in &routes {
        let m = by_endpoint.entry(ep).or_default();
        m.errors_4xx += r.errors_4xx;
        m.errors_5xx += r.errors_5xx;
        m.latency.merge(&r.latency);
    }
    let f = g.add(
        "dynamo_kvindexer_request_duration_seconds",
        "HTTP request latency",
        MetricType::Histogram,
    );
    for (ep, r) in &by_endpoint {
        f.with(
            &[("endpoint", ep.to_string())],
            Value::Hist(r.latency.clone()),
        );
    }
    let f = g.add(
        "dynamo_kvindexer_requests",
        "Total HTTP requests",
        MetricType::Counter,
    );
    for ((ep, m), r) in &routes {
        f.with(
            &[("endpoint", ep.to_string()), ("method", m.to_string())],
            Value::Counter(r.requests),
        );
    }
    let f = g.add(
        "dynamo_kvindexer_errors",
        "HTTP error responses (4xx/5xx)",
        MetricType::Counter,
    );
    for (ep, r) in &by_endpoint {
        for (class, n) in [("4xx", r.errors_4xx), ("5xx", r.errors_5xx)] {
            if n > 0 {
                f.with(
                    &[("endpoint", ep.to_string()), ("status_class", class.into())],
                    Value::Counter(n),
                );
            }
        }
    }
    g.add(
        "kvix_shard_unavailable",
        "Requests failed with 503 because a shard did not answer its part",
        MetricType::Counter,
    )
    .with(
        &[],
        Value::Counter(shards.iter().map(|s| s.http.shard_failures).sum()),
    );
    let snap = app.registry().snapshot();
    let live = snap.live_indexes();
    g.add(
        "dynamo_kvindexer_models",
        "Number of active model+tenant indexers",
        MetricType::Gauge,
    )
    .with(&[], Value::Gauge(live.len() as i64));
    let workers: BTreeSet<(u32, crate::types::InstanceId)> = live
        .iter()
        .flat_map(|ix| ix.endpoints.keys().map(move |i| (ix.id.0, *i)))
        .collect();
    g.add(
        "dynamo_kvindexer_workers",
        "Number of registered worker instances",
        MetricType::Gauge,
    )
    .with(&[], Value::Gauge(workers.len() as i64));

    // Ingest, summed over every listener ever started (stats outlive their listener).
    let listeners = app
        .ingest()
        .listeners
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let sum = |f: fn(&crate::ingest::feed::FeedStats) -> u64| -> u64 {
        listeners.iter().map(|l| f(&l.3)).sum()
    };
    let r = Ordering::Relaxed;
    for (name, help, v) in [
        (
            "kvix_batches_received",
            "Event batches received from engines",
            sum(|s| s.batches.load(Ordering::Relaxed)),
        ),
        (
            "kvix_events_applied",
            "KV events applied (live and replayed)",
            sum(|s| s.events.load(Ordering::Relaxed)),
        ),
        (
            "kvix_blocks_stored",
            "Blocks stored by BlockStored events",
            sum(|s| s.blocks_stored.load(Ordering::Relaxed)),
        ),
        (
            "kvix_blocks_removed",
            "Blocks named by BlockRemoved events",
            sum(|s| s.blocks_removed.load(Ordering::Relaxed)),
        ),
        (
            "kvix_malformed_frames",
            "Frames that failed to decode and were skipped",
            sum(|s| s.malformed.load(Ordering::Relaxed)),
        ),
        (
            "kvix_unknown_parent_blocks",
            "Stores (runs of blocks) skipped because their worker names no such parent",
            shards.iter().map(|s| s.unknown_parent).sum(),
        ),
        (
            "kvix_unknown_removed_blocks",
            "Removals of blocks their worker does not hold",
            shards.iter().map(|s| s.unknown_removed).sum(),
        ),
        (
            "kvix_block_size_mismatch",
            "Stores skipped because their block size is not the registration's",
            sum(|s| s.block_size_mismatch.load(Ordering::Relaxed)),
        ),
        (
            "kvix_sequence_gaps",
            "Sequence gaps detected (seq > last + 1)",
            sum(|s| s.gaps.load(Ordering::Relaxed)),
        ),
        (
            "kvix_sequence_gap_batches",
            "Batches the sequence gaps left out, before replay",
            sum(|s| s.gap_batches.load(Ordering::Relaxed)),
        ),
        (
            "kvix_replay_requests",
            "Replay requests sent to engines",
            app.ingest().replay_stats.requests.load(r),
        ),
        (
            "kvix_replay_failures",
            "Replay requests that got no (valid) answer; the gap stays unrecovered",
            app.ingest().replay_stats.failures.load(r),
        ),
        (
            "kvix_replayed_batches",
            "Batches applied from replays",
            app.ingest().replay_stats.batches.load(r),
        ),
        (
            "kvix_replay_unrecovered_batches",
            "Missing batches a replay could not return (gone from the engine's buffer)",
            app.ingest().replay_stats.unrecovered.load(r),
        ),
        (
            "kvix_replay_duplicates",
            "Live batches skipped because a replay already applied them",
            app.ingest().replay_stats.duplicates.load(r),
        ),
        (
            "kvix_event_refusals",
            "Indexes or worker slots that event data asked for beyond --max-event-indexes / --max-event-slots",
            app.registry().event_refusals.load(r),
        ),
        (
            "kvix_snapshots_written",
            "Local snapshots written",
            app.recovery_stats().snapshots_written.load(r),
        ),
        (
            "kvix_snapshot_failures",
            "Local snapshots that could not be written",
            app.recovery_stats().snapshot_failures.load(r),
        ),
        (
            "kvix_bootstrap_blocks",
            "Blocks seeded from a snapshot or a peer's dump",
            app.recovery_stats().seeded_blocks.load(r),
        ),
    ] {
        g.add(name, help, MetricType::Counter)
            .with(&[], Value::Counter(v));
    }

    // Per engine stream: the last batch sequence applied (compare with the engine's).
    let mut last: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for l in &listeners {
        let seq = l.3.last_seq.load(Ordering::Relaxed);
        let e = last
            .entry((snap.instance_key(l.1).to_string(), l.2))
            .or_default();
        *e = (*e).max(seq);
    }
    let f = g.add(
        "kvix_listener_last_sequence",
        "Last batch sequence number applied per (instance, dp rank)",
        MetricType::Gauge,
    );
    for ((instance, dp), seq) in last {
        f.with(
            &[("instance", instance), ("dp", dp.to_string())],
            Value::Gauge(seq as i64),
        );
    }

    // Per shard.
    g.add(
        "kvix_shard_ops_applied",
        "Ring ops applied by each shard",
        MetricType::Counter,
    )
    .per_shard(shards, |s| Value::Counter(s.applied));
    g.add(
        "kvix_ring_pending",
        "Ops waiting on each shard's rings",
        MetricType::Gauge,
    )
    .per_shard(shards, |s| Value::Gauge(s.pending as i64));
    g.add(
        "kvix_ops_waiting_for_clear",
        "Ops held until the clear of their worker's tier is walked (they apply, in order, once it is)",
        MetricType::Gauge,
    )
        .per_shard(shards, |s| Value::Gauge(s.waiting as i64));
    g.add(
        "kvix_ring_full_stalls",
        "Times an ingest thread found a shard's ring full and waited",
        MetricType::Counter,
    )
    .per_shard(shards, |s| Value::Counter(s.stalls));
    g.add(
        "kvix_shard_blocks",
        "Blocks held by each shard",
        MetricType::Gauge,
    )
    .per_shard(shards, |s| Value::Gauge(s.blocks as i64));
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
        .per_shard(shards, |s| Value::Gauge(s.tier_blocks[Tier::PREDICTED.0 as usize] as i64));
    type Count = fn(&crate::shard::PredictionCounts) -> u64;
    let counts: [(&'static str, &'static str, Count); 5] = [
        (
            "kvix_predictions_created",
            "Predicted (block, worker) pairs created by /speculate",
            |c| c.created,
        ),
        (
            "kvix_predictions_refreshed",
            "Predictions given a later deadline by another /speculate",
            |c| c.refreshed,
        ),
        (
            "kvix_predictions_confirmed",
            "Predictions confirmed by the worker's BlockStored (now ordinary holders)",
            |c| c.confirmed,
        ),
        (
            "kvix_predictions_expired",
            "Predictions that reached their TTL unconfirmed",
            |c| c.expired,
        ),
        (
            "kvix_predictions_pruned",
            "Predictions ended early to keep an approximate index under its maximum size",
            |c| c.pruned,
        ),
    ];
    for (name, help, get) in counts {
        g.add(name, help, MetricType::Counter)
            .per_shard(shards, |s| Value::Counter(get(&s.predictions)));
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
    let f = g.add(
        "kvix_query_duration_seconds",
        "Latency of /query and /query_by_hash, parse to response",
        MetricType::Histogram,
    );
    for (ep, r) in &by_endpoint {
        if ep.starts_with("/query") {
            f.with(
                &[("endpoint", ep.to_string())],
                Value::Hist(r.latency.clone()),
            );
        }
    }

    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(g));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        tracing::error!("cannot encode metrics: {e}");
    }
    out
}
