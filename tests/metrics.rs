//! `/metrics` over the real binary: parses with a Prometheus text parser, carries
//! Dynamo's indexer metric names, and its counters move as the test drives the server.

mod common;

use common::{Engine, Server, metric_in, stored};
use serde_json::json;

const MODEL: &str = "m";

fn scrape(s: &Server) -> String {
    let (st, text) = s.call("GET", "/metrics", None);
    assert_eq!(st, 200);
    // Every line parses (the parser skips what it cannot read, so check it read all):
    // one sample per plain line (a histogram's _sum and _count included), one per label
    // set for a histogram's _bucket lines.
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
    let hist = [
        "dynamo_kvindexer_request_duration_seconds",
        "kvix_query_duration_seconds",
    ];
    let plain_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter(|l| !hist.iter().any(|h| l.starts_with(&format!("{h}_bucket"))))
        .count();
    let plain_samples = scrape
        .samples
        .iter()
        .filter(|s| !matches!(s.value, prometheus_parse::Value::Histogram(_)))
        .count();
    assert_eq!(
        plain_samples, plain_lines,
        "every sample line parses:\n{text}"
    );
    let hist_sets = text
        .lines()
        .filter(|l| hist.iter().any(|h| l.starts_with(&format!("{h}_count"))))
        .count();
    let hist_samples = scrape.samples.len() - plain_samples;
    assert_eq!(hist_samples, hist_sets, "every histogram parses:\n{text}");
    text
}

#[test]
fn metrics_parse_and_move() {
    let s = Server::start(&["--threads", "2"]);
    let t = scrape(&s);
    for name in [
        "dynamo_kvindexer_models",
        "dynamo_kvindexer_workers",
        "kvix_events_applied_total",
        "kvix_sequence_gaps_total",
        "kvix_malformed_frames_total",
        "kvix_replayed_batches_total",
    ] {
        assert!(t.contains(name), "{name} missing:\n{t}");
    }
    assert_eq!(metric_in(&t, "dynamo_kvindexer_models", &[]), 0.0);

    let ctx = zmq::Context::new();
    let mut e = Engine::registered(&ctx, &s, 3, MODEL);
    e.publish(&stored(&[1, 2], None, &[1, 2, 3, 4, 5, 6, 7, 8], 4));
    e.publish(&[0xc1]); // malformed
    e.drop.insert(2); // a gap (no replay endpoint: counted, not recovered)
    e.publish(&stored(&[9], None, &[9, 9, 9, 9], 4));
    e.publish(&stored(&[3], Some(2), &[9, 10, 11, 12], 4));
    e.publish(&stored(&[4], Some(77), &[1, 1, 1, 1], 4)); // unknown parent: skipped
    s.eventually("events applied", || {
        let t = scrape(&s);
        let ev = metric_in(&t, "kvix_events_applied_total", &[]);
        if ev == 3.0 {
            Ok(())
        } else {
            Err(format!("{ev}"))
        }
    });
    let q = json!({"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "model_name": MODEL});
    for _ in 0..5 {
        s.post_ok("/query", &q);
    }
    let (st, _) = s.post_json("/query", &json!({"token_ids": [1], "model_name": "nope"}));
    assert_eq!(st, 404);
    let t = scrape(&s);
    let m = |name: &str, labels: &[(&str, &str)]| metric_in(&t, name, labels);
    assert_eq!(m("dynamo_kvindexer_models", &[]), 1.0);
    assert_eq!(m("dynamo_kvindexer_workers", &[]), 1.0);
    assert_eq!(m("kvix_malformed_frames_total", &[]), 1.0);
    assert_eq!(m("kvix_sequence_gaps_total", &[]), 1.0);
    assert_eq!(m("kvix_batches_received_total", &[]), 3.0);
    assert_eq!(
        m(
            "dynamo_kvindexer_requests_total",
            &[("endpoint", "/query"), ("method", "POST")]
        ),
        6.0
    );
    assert_eq!(
        m(
            "dynamo_kvindexer_requests_total",
            &[("endpoint", "/register"), ("method", "POST")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "dynamo_kvindexer_errors_total",
            &[("endpoint", "/query"), ("status_class", "4xx")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "dynamo_kvindexer_request_duration_seconds_count",
            &[("endpoint", "/query")]
        ),
        6.0
    );
    assert_eq!(
        m(
            "kvix_query_duration_seconds_count",
            &[("endpoint", "/query")]
        ),
        6.0
    );
    // Blocks per shard and tier: 3 blocks (1, 2, 3; 9 was lost) on the device tier.
    assert_eq!(m("kvix_shard_blocks", &[]), 3.0);
    assert_eq!(m("kvix_shard_tier_blocks", &[("tier", "device")]), 3.0);
    assert_eq!(m("kvix_shard_tier_blocks", &[("tier", "host_pinned")]), 0.0);
    assert!(
        m("kvix_shard_ops_applied_total", &[("shard", "0")])
            + m("kvix_shard_ops_applied_total", &[("shard", "1")])
            >= 3.0
    );
    assert_eq!(m("kvix_ring_pending", &[]), 0.0);
    assert!(t.contains("kvix_ops_waiting_for_clear{shard=\"1\"} 0"));
    assert!(t.contains("kvix_ring_full_stalls_total{shard=\"1\"}"));
    assert!(t.contains("kvix_executor_polling_yielded_total{shard=\"1\"}"));
    assert_eq!(m("kvix_unknown_parent_blocks_total", &[]), 1.0);
    // The worker's three live blocks sit in its engine-hash map (16 bytes or more
    // each); unregistering the worker frees the map.
    assert!(m("kvix_engine_map_heap_bytes", &[]) >= 48.0);
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 3, "model_name": MODEL}),
    );
    s.eventually("engine maps freed", || {
        let b = metric_in(&scrape(&s), "kvix_engine_map_heap_bytes", &[]);
        if b == 0.0 {
            Ok(())
        } else {
            Err(format!("{b}"))
        }
    });
}
