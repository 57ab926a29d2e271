//! The HTTP families: requests, errors and latency per route, merged over cores.
//!
//! Owns Dynamo's request family names and kvix's query latency. Must never keep
//! figures of its own: it merges the cores' [`HttpStats`](super::HttpStats).

use super::encode::{Gathered, Value};
use super::stats::{RouteStats, ShardStats};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;

/// The HTTP figures merged over cores: per (endpoint, method), and per endpoint.
pub(super) struct HttpTotals<'a> {
    routes: BTreeMap<(&'a str, &'a str), RouteStats>,
    by_endpoint: BTreeMap<&'a str, RouteStats>,
}

impl<'a> HttpTotals<'a> {
    pub(super) fn merged(shards: &'a [ShardStats]) -> Self {
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
    pub(super) fn families(&self, g: &mut Gathered, shards: &[ShardStats]) {
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
    pub(super) fn query_latency(&self, g: &mut Gathered) {
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
