//! `/metrics`: Prometheus text with Dynamo's indexer metric names plus kvix's own.
//!
//! Owns the metric names and their rendering. Nothing here is shared on the hot path:
//! HTTP figures are kept per executor in plain fields ([`HttpStats`], no atomics),
//! shard figures live in each shard; a scrape asks every core for its [`ShardStats`]
//! over the mesh, adds the ingest threads' counters, and encodes the lot with
//! `prometheus-client` through a one-shot collector.

mod dynamo;
mod slot_tracker;

use crate::app::{App, RecoveryStats};
use crate::ingest::feed::FeedStats;
use crate::ingest::{ListenerStats, ReplayStats};
use crate::registry::Snapshot;
use crate::types::Tier;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Render the Prometheus text for `app` and the shards' figures: family by family,
/// in a fixed order (HTTP, registry, ingest, shards, query latency, guards).
pub fn render(app: &App, shards: &[ShardStats]) -> String {
    let mut g = Gathered::default();
    let http = HttpTotals::merged(shards);
    http.families(&mut g, shards);
    let snap = app.registry().snapshot();
    registry_families(&mut g, &snap);
    engine_budget(&mut g, app);
    let scrape = Scrape {
        app,
        shards,
        // Every listener ever started (stats outlive their listener).
        listeners: app
            .ingest()
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    };
    for (name, help, total) in TOTALS {
        g.add(name, help, MetricType::Counter)
            .with(&[], Value::Counter(total(&scrape)));
    }
    scrape.last_sequences(&mut g, &snap);
    shard_families(&mut g, shards);
    http.query_latency(&mut g);
    guards(&mut g, app);
    access_log(&mut g, app);
    slot_tracker::slot_families(&mut g, shards);
    dynamo::listener_family(&mut g, &snap);
    let dynamo = (!snap.live_indexes().is_empty()).then(|| dynamo::dynamo_event_families(&scrape));
    let mut out = encode(g);
    if let Some(text) = dynamo {
        // Before the trailing `# EOF` that the encoder ends with.
        let at = out.rfind("# EOF").unwrap_or(out.len());
        out.insert_str(at, &text);
    }
    out
}

/// What the access log wrote and dropped (zero without `--access-log`).
fn access_log(g: &mut Gathered, app: &App) {
    let (written, dropped) = app.access_log().map_or((0, 0), |l| l.counts());
    g.add(
        "kvix_access_log_lines",
        "Access log lines written",
        MetricType::Counter,
    )
    .with(&[], Value::Counter(written));
    g.add(
        "kvix_access_log_dropped",
        "Access log lines dropped: the writer was behind by a full queue, or their write failed",
        MetricType::Counter,
    )
    .with(&[], Value::Counter(dropped));
}

/// What the guards against costly requests did: the tokenizing pool and the peer
/// dumps not taken.
fn guards(g: &mut Gathered, app: &App) {
    let pool = app.tokenize();
    let f = g.add(
        "kvix_tokenize_jobs",
        "Text prompts offered to the tokenizing pool, by outcome: done, busy (429: queue full), too_long (413), dropped (client gone before a thread took it: never run), discarded (client gone while it ran)",
        MetricType::Counter,
    );
    for (outcome, n) in pool.stats().outcomes() {
        f.with(&[("outcome", outcome.into())], Value::Counter(n));
    }
    g.add(
        "kvix_tokenize_queue",
        "Text prompts waiting for a tokenizing thread",
        MetricType::Gauge,
    )
    .with(&[], Value::Gauge(pool.queued() as i64));
    let f = g.add(
        "kvix_peer_dump_failures",
        "Peer /dump not taken at start, by reason (the next peer, or the local state, was used)",
        MetricType::Counter,
    );
    let failures = &app.recovery_stats().peer_dump_failures;
    for (reason, n) in crate::app::PEER_DUMP_FAILURES.iter().zip(failures) {
        f.with(
            &[("reason", (*reason).into())],
            Value::Counter(n.load(Ordering::Relaxed)),
        );
    }
}

fn encode(g: Gathered) -> String {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(g));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        tracing::error!("cannot encode metrics: {e}");
    }
    out
}

/// The HTTP figures merged over cores: per (endpoint, method), and per endpoint.
struct HttpTotals<'a> {
    routes: BTreeMap<(&'a str, &'a str), RouteStats>,
    by_endpoint: BTreeMap<&'a str, RouteStats>,
}

impl<'a> HttpTotals<'a> {
    fn merged(shards: &'a [ShardStats]) -> Self {
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
        HttpTotals {
            routes,
            by_endpoint,
        }
    }

    /// Dynamo's request families, and the requests a shard failed.
    fn families(&self, g: &mut Gathered, shards: &[ShardStats]) {
        let f = g.add(
            "dynamo_kvindexer_request_duration_seconds",
            "HTTP request latency",
            MetricType::Histogram,
        );
        for (ep, r) in &self.by_endpoint {
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
        for ((ep, m), r) in &self.routes {
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
        for (ep, r) in &self.by_endpoint {
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
    }

    /// The latency of the query routes alone.
    fn query_latency(&self, g: &mut Gathered) {
        let f = g.add(
            "kvix_query_duration_seconds",
            "Latency of /query and /query_by_hash, parse to response",
            MetricType::Histogram,
        );
        for (ep, r) in &self.by_endpoint {
            if ep.starts_with("/query") {
                f.with(
                    &[("endpoint", ep.to_string())],
                    Value::Hist(r.latency.clone()),
                );
            }
        }
    }
}

/// Dynamo's model and worker counts.
fn registry_families(g: &mut Gathered, snap: &Snapshot) {
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
}

/// Engines listened to in connect mode and the most the open-file limit allows.
fn engine_budget(g: &mut Gathered, app: &App) {
    let (engines, max) = app.ingest().engines();
    g.add(
        "kvix_engines",
        "Registered engines kvix listens to (connect mode), two descriptors each",
        MetricType::Gauge,
    )
    .with(&[], Value::Gauge(engines as i64));
    g.add(
        "kvix_engines_max",
        "Engines the open-file limit allows; /register past it answers 503",
        MetricType::Gauge,
    )
    .with(&[], Value::Gauge(max as i64));
}

/// What the process-wide totals are read from.
struct Scrape<'a> {
    app: &'a App,
    shards: &'a [ShardStats],
    listeners: Vec<ListenerStats>,
}

impl Scrape<'_> {
    /// One ingest counter summed over every listener.
    fn feed(&self, counter: fn(&FeedStats) -> &AtomicU64) -> u64 {
        self.listeners
            .iter()
            .map(|l| counter(&l.3).load(Ordering::Relaxed))
            .fold(0u64, u64::saturating_add)
    }

    /// A counter of the bound sockets (`--zmq-bind`).
    fn bound(&self, counter: fn(&crate::ingest::bind::BindStats) -> &AtomicU64) -> u64 {
        counter(&self.app.ingest().bind_stats).load(Ordering::Relaxed)
    }

    /// One shard figure summed over the shards.
    fn shards(&self, figure: fn(&ShardStats) -> u64) -> u64 {
        self.shards.iter().map(figure).sum()
    }

    fn replay(&self, counter: fn(&ReplayStats) -> &AtomicU64) -> u64 {
        counter(&self.app.ingest().replay_stats).load(Ordering::Relaxed)
    }

    fn recovery(&self, counter: fn(&RecoveryStats) -> &AtomicU64) -> u64 {
        counter(self.app.recovery_stats()).load(Ordering::Relaxed)
    }

    /// Per engine stream: the last batch sequence applied (compare with the engine's).
    fn last_sequences(&self, g: &mut Gathered, snap: &Snapshot) {
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

type Total = (&'static str, &'static str, fn(&Scrape) -> u64);

/// The process-wide counters: ingest, replay, refusals, recovery.
const TOTALS: [Total; 25] = [
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

/// Each shard's predictions (from `/speculate`) and evictions.
const SHARD_PREDICTIONS: [PerShard; 8] = [
    (
        "kvix_predicted_blocks",
        "Live predicted (block, worker) pairs per shard (from /speculate, not yet confirmed or expired)",
        MetricType::Gauge,
        |s| Value::Gauge(s.tier_blocks[Tier::PREDICTED.0 as usize] as i64),
    ),
    (
        "kvix_predictions_created",
        "Predicted (block, worker) pairs created by /speculate",
        MetricType::Counter,
        |s| Value::Counter(s.predictions.created),
    ),
    (
        "kvix_predictions_refreshed",
        "Predictions given a later deadline by another /speculate",
        MetricType::Counter,
        |s| Value::Counter(s.predictions.refreshed),
    ),
    (
        "kvix_predictions_confirmed",
        "Predictions confirmed by the worker's BlockStored (now ordinary holders)",
        MetricType::Counter,
        |s| Value::Counter(s.predictions.confirmed),
    ),
    (
        "kvix_predictions_expired",
        "Predictions that reached their TTL unconfirmed",
        MetricType::Counter,
        |s| Value::Counter(s.predictions.expired),
    ),
    (
        "kvix_predictions_pruned",
        "Predictions ended early to keep an approximate index under its maximum size",
        MetricType::Counter,
        |s| Value::Counter(s.predictions.pruned),
    ),
    (
        "kvix_prediction_refusals",
        "/speculate requests refused by --max-predictions (longer than it, or the index at it)",
        MetricType::Counter,
        |s| Value::Counter(s.predictions.refused),
    ),
    (
        "kvix_evicted_blocks",
        "Blocks evicted (least recently stored or matched first) to keep the index within --max-blocks",
        MetricType::Counter,
        |s| Value::Counter(s.evicted),
    ),
];

fn per_shard(g: &mut Gathered, shards: &[ShardStats], table: &[PerShard]) {
    for &(name, help, kind, value) in table {
        g.add(name, help, kind).per_shard(shards, value);
    }
}

/// The shards' families: queues, blocks per tier, predictions, memory.
fn shard_families(g: &mut Gathered, shards: &[ShardStats]) {
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
    per_shard(g, shards, &SHARD_PREDICTIONS);
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
