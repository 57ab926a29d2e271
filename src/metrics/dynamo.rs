//! Dynamo's own metric families, named, typed and labelled as Dynamo's indexer
//! writes them, read from kvix's counters (no bookkeeping of their own).

use super::{Gathered, Scrape, Value};
use crate::registry::Snapshot;
use prometheus_client::metrics::MetricType;

/// Dynamo's listener gauge: one series per status, always all four. Every
/// registered (instance, dp rank) and every bound pod's rank is a subscribed stream
/// kvix keeps reading (it reconnects a dropped one itself), so all are `active`.
pub(super) fn listener_family(g: &mut Gathered, snap: &Snapshot) {
    let active: usize = snap
        .live_indexes()
        .iter()
        .flat_map(|ix| ix.endpoints.values())
        .map(|by_dp| by_dp.len())
        .sum();
    let f = g.add(
        "dynamo_kvindexer_listeners",
        "Number of ZMQ listeners by status",
        MetricType::Gauge,
    );
    for (status, n) in [
        ("active", active),
        ("failed", 0),
        ("paused", 0),
        ("pending", 0),
    ] {
        f.with(&[("status", status.into())], Value::Gauge(n as i64));
    }
}

/// Statuses of Dynamo's `kv_cache_events_applied`, in its order.
const DYNAMO_EVENT_STATUSES: [&str; 9] = [
    "ok",
    "parent_block_not_found",
    "block_not_found",
    "invalid_block",
    "capacity_exhausted",
    "allocation_failed",
    "ownership_degree_overflow",
    "indexer_invariant_violation",
    "unsupported_residency_domain",
];

/// Dynamo's event families, named and shaped as its indexer writes them (Prometheus
/// text 0.0.4, counters without a `_total` suffix added, every label value present
/// from the first index on), read from kvix's own counters:
/// - `kv_cache_events_applied{event_type, status}`: stores, removals and clears that
///   reached a worker; a store whose parent the worker does not name is
///   `parent_block_not_found`, the rest `ok` (as Dynamo's default concurrent tree
///   counts a removal of unknown blocks `ok`);
/// - `kv_cache_event_warnings{warning_kind="duplicate_store"}`: stores that changed
///   nothing, the worker held every block already;
/// - `ckf_mutation_total{outcome}`: block-level outcomes; `unknown_remove` counts
///   removals of blocks their worker does not hold, `capacity_exhausted` stays 0
///   (`--max-blocks` evicts instead of refusing).
///
/// Written by hand because the encoder adds `_total` to every counter.
pub(super) fn dynamo_event_families(s: &Scrape) -> String {
    use std::fmt::Write;
    let stored = s.feed(|f| &f.stored_events);
    let orphan = s.shards(|x| x.unknown_parent);
    let applied = |kind: &str, status: &str| -> u64 {
        match (kind, status) {
            ("stored", "ok") => stored.saturating_sub(orphan),
            ("stored", "parent_block_not_found") => orphan.min(stored),
            ("removed", "ok") => s.feed(|f| &f.removed_events),
            ("cleared", "ok") => s.feed(|f| &f.cleared_events),
            _ => 0,
        }
    };
    let mut out = String::new();
    let mut family = |name: &str, help: &str, rows: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, n) in rows {
            let _ = writeln!(out, "{name}{{{labels}}} {n}");
        }
    };
    let mut rows = Vec::new();
    for kind in ["cleared", "removed", "stored"] {
        let mut statuses = DYNAMO_EVENT_STATUSES;
        statuses.sort_unstable();
        for status in statuses {
            rows.push((
                format!("event_type=\"{kind}\",status=\"{status}\""),
                applied(kind, status),
            ));
        }
    }
    family(
        "dynamo_kvrouter_kv_cache_events_applied",
        "Total number of KV cache events applied to index",
        &rows,
    );
    family(
        "dynamo_kvrouter_kv_cache_event_warnings",
        "Total number of suspicious KV cache events seen by the router indexer",
        &[(
            "warning_kind=\"duplicate_store\"".into(),
            s.shards(|x| x.duplicate_stores),
        )],
    );
    family(
        "dynamo_kvrouter_ckf_mutation_total",
        "Total number of CKF block-level mutation outcomes",
        &[
            ("outcome=\"capacity_exhausted\"".into(), 0),
            (
                "outcome=\"unknown_remove\"".into(),
                s.shards(|x| x.unknown_removed),
            ),
        ],
    );
    out
}
