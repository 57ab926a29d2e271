//! `/metrics`: Prometheus text with Dynamo's indexer metric names plus kvix's own.
//!
//! Owns the metric names and their rendering. Nothing here is shared on the hot path:
//! HTTP figures are kept per executor in plain fields ([`HttpStats`], no atomics),
//! shard figures live in each shard; a scrape asks every core for its [`ShardStats`]
//! over the mesh, adds the ingest threads' counters, and encodes the lot with
//! `prometheus-client` through a one-shot collector.

mod dynamo;
mod encode;
mod http;
mod shard;
mod slot_tracker;
mod stats;
mod totals;

pub use stats::{BUCKETS, Hist, HttpStats, RouteStats, ShardStats};

use crate::app::App;
use crate::registry::Snapshot;
use encode::{Gathered, Value, encode};
use http::HttpTotals;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use totals::{Scrape, TOTALS};

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
    shard::shard_families(&mut g, shards);
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
