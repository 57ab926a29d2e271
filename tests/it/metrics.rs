//! `/metrics` over the real binary: parses with a Prometheus text parser, carries
//! Dynamo's indexer metric names, and its counters move as the test drives the server.

use crate::support::{
    Dynamo, Engine, Publisher, Server, agent, all_cleared, metric_in, removed, stored,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

/// Dynamo's families that kvix writes under Dynamo's names, for Dynamo's dashboards.
const DYNAMO_FAMILIES: [&str; 4] = [
    "dynamo_kvindexer_listeners",
    "dynamo_kvrouter_kv_cache_events_applied",
    "dynamo_kvrouter_kv_cache_event_warnings",
    "dynamo_kvrouter_ckf_mutation_total",
];

/// The same events for both indexers, as vLLM sends them (`[ts, events, dp_rank]`):
/// a store, a store under a parent the worker never named, the first store again
/// (a duplicate), a child of it, its removal, the removal of a block never stored,
/// and a clear.
fn event_script() -> Vec<Vec<u8>> {
    [
        stored(&[1, 2], None, &[1, 2, 3, 4, 5, 6, 7, 8], 4),
        stored(&[3], Some(99), &[9, 9, 9, 9], 4),
        stored(&[1, 2], None, &[1, 2, 3, 4, 5, 6, 7, 8], 4),
        stored(&[4], Some(2), &[10, 11, 12, 13], 4),
        removed(&[4]),
        removed(&[77]),
        all_cleared(),
    ]
    .into_iter()
    .map(|b| {
        assert_eq!(b[0], 0x92, "a two-element batch");
        let mut b = b;
        b[0] = 0x93;
        rmp::encode::write_uint(&mut b, 0).unwrap();
        b
    })
    .collect()
}

/// Dynamo's families in a `/metrics` text: `TYPE <name>` and `<name>{labels}` (labels
/// sorted by name) to their type or value.
fn dynamo_families(text: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            if DYNAMO_FAMILIES.contains(&name) {
                out.insert(format!("TYPE {name}"), json!(kind));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        if !DYNAMO_FAMILIES.contains(&name) {
            continue;
        }
        let mut labels: Vec<&str> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
            .collect();
        labels.sort_unstable();
        let value: f64 = value.parse().unwrap();
        out.insert(format!("{name}{{{}}}", labels.join(",")), json!(value));
    }
    out
}

/// Every `dynamo_*` family a `/metrics` text has samples of, by the name a query
/// uses (a histogram's `_bucket`, `_sum` and `_count` as the histogram).
fn sample_families(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with("dynamo_"))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_string()
        })
        .collect()
}

/// Register one worker of `MODEL` at `base`, publish [`event_script`] to it and
/// return its Dynamo families once the last event (the clear) is counted.
fn drive(base: &str, ctx: &zmq::Context) -> BTreeMap<String, Value> {
    let a = agent(Some(Duration::from_secs(10)));
    let mut p = Publisher::bind(ctx);
    let body =
        json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": MODEL, "block_size": 4});
    let resp = a
        .post(format!("{base}/register"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .unwrap();
    assert!(resp.status().is_success(), "{base}/register");
    p.wait_subscriber();
    for b in event_script() {
        p.send(&b);
    }
    let cleared = "dynamo_kvrouter_kv_cache_events_applied{event_type=\"cleared\",status=\"ok\"}";
    let get = |path: &str| {
        a.get(format!("{base}{path}"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = get("/metrics");
        if dynamo_families(&text).get(cleared) == Some(&json!(1.0)) {
            // Every event decoded; `/dump` answers once the index applied them all
            // (kvix's shards count what a store changed when they apply it).
            get("/dump");
            let text = get("/metrics");
            let mut got = dynamo_families(&text);
            got.insert("families".into(), json!(sample_families(&text)));
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{base}: the clear was never counted:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The same registration and events sent to kvix and to Dynamo's indexer give the
/// same Dynamo families: names, types, label sets, and the counts both keep.
/// Dynamo's answer is recorded in `tests/data/dynamo_metrics.json`; with
/// `DYNAMO_PEER=<dynamo-peer built --features metrics>` the test also runs it live,
/// and `DYNAMO_PEER_RECORD=<file>` then writes the recording.
#[test]
fn dynamos_metric_families_match_dynamos_indexer() {
    let ctx = zmq::Context::new();
    let s = Server::start(&["--threads", "2"]);
    let kvix = drive(&s.base, &ctx);
    let recorded: BTreeMap<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/dynamo_metrics.json"
        ))
        .unwrap(),
    )
    .unwrap();
    if let Ok(bin) = std::env::var("DYNAMO_PEER") {
        // Dynamo's standalone indexer (`scripts/dynamo_peer`, built `--features metrics`).
        let d = Dynamo::start(&bin, &[]);
        let live = drive(&d.base, &ctx);
        if let Ok(out) = std::env::var("DYNAMO_PEER_RECORD") {
            std::fs::write(out, serde_json::to_string_pretty(&live).unwrap()).unwrap();
        }
        compare_families("live Dynamo", &live, &kvix);
    }
    compare_families("recorded Dynamo", &recorded, &kvix);
}

fn compare_families(peer: &str, dynamo: &BTreeMap<String, Value>, kvix: &BTreeMap<String, Value>) {
    // Every family Dynamo writes, kvix writes too (it has more of its own).
    let families = |m: &BTreeMap<String, Value>| -> Vec<String> {
        serde_json::from_value(m["families"].clone()).unwrap()
    };
    let missing: Vec<String> = families(dynamo)
        .into_iter()
        .filter(|f| !families(kvix).contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "families {peer} has and kvix has not: {missing:?}"
    );
    let keys = |m: &BTreeMap<String, Value>| {
        m.keys()
            .filter(|k| *k != "families")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(kvix), keys(dynamo), "series: kvix vs {peer}");
    for (k, v) in dynamo.iter().filter(|(k, _)| *k != "families") {
        // Dynamo 1.6.1 never bumps its CKF outcomes; kvix counts unknown removals there.
        if k.starts_with("dynamo_kvrouter_ckf_mutation_total{") {
            continue;
        }
        assert_eq!(&kvix[k], v, "{k}: kvix vs {peer}");
    }
}
