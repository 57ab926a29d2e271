//! Predictions end to end: the real binary, `/speculate` over HTTP, confirming
//! `BlockStored` events over real ZMQ, and what every query route and `/dump` see.

mod common;

use common::{Publisher, Server, dump_rows, register, register_with, stored};
use kvix::hash::{block_seed, local_hash};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const MODEL: &str = "m";

fn tokens(a: u32, b: u32) -> Vec<u32> {
    (a..=b).collect()
}

/// A server on `threads` executors with worker 1 registered for `MODEL`.
fn serve_with_worker(threads: &str) -> (Server, Publisher) {
    let s = Server::start(&["--threads", threads]);
    let w1 = Publisher::bind(&zmq::Context::new());
    register(&s, MODEL, 1, &w1);
    (s, w1)
}

/// Registers worker `instance` at `dp_rank` for `MODEL` (predictions on a model
/// fed by events name registered workers); its publisher must stay alive.
fn add_worker(s: &Server, instance: u64, dp_rank: u32) -> Publisher {
    let w = Publisher::bind(&zmq::Context::new());
    register_with(s, MODEL, instance, &w, json!({"dp_rank": dp_rank}));
    w
}

fn scores(s: &Server, model: &str, t: &[u32]) -> Value {
    let (st, v) = s.post_json("/query", &json!({"token_ids": t, "model_name": model}));
    assert_eq!(st, 200, "{v}");
    v["scores"].clone()
}

fn speculate(s: &Server, body: Value) -> Value {
    s.post_ok("/speculate", &body)
}

fn metric(s: &Server, name: &str) -> f64 {
    s.metric(name, &[])
}

#[test]
fn a_prediction_scores_on_every_route_until_its_ttl_and_never_reaches_the_dump() {
    let (s, _w1) = serve_with_worker("2");
    let _w7 = add_worker(&s, 7, 1);
    let prompt = tokens(1, 16);

    let t0 = Instant::now();
    let r = speculate(
        &s,
        json!({"model_name": MODEL, "instance_id": 7, "dp_rank": 1, "token_ids": prompt, "ttl_ms": 1500}),
    );
    assert_eq!(r, json!({"predicted_blocks": 4, "ttl_ms": 1500}));
    // Visible as soon as /speculate answered, on every route and shape.
    assert_eq!(scores(&s, MODEL, &prompt), json!({"7": {"1": 16}}));
    let hashes: Vec<u64> = prompt
        .chunks_exact(4)
        .map(|c| local_hash(c, block_seed(None, None)).0)
        .collect();
    let (st, v) = s.post_json(
        "/query_by_hash",
        &json!({"block_hashes": hashes, "model_name": MODEL}),
    );
    assert_eq!((st, v["scores"].clone()), (200, json!({"7": {"1": 16}})));
    let (st, v) = s.post_json(
        "/conductor/query",
        &json!({"model": MODEL, "token_ids": prompt}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v.to_string().matches("\"longest_matched\":16").count(),
        1,
        "{v}"
    );
    let (st, v) = s.post_json(
        "/query",
        &json!({"model_name": MODEL, "token_ids": prompt, "scoring": "llm-d"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_ne!(v.to_string().find("7"), None, "{v}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "too slow to see the prediction live"
    );
    assert_eq!(metric(&s, "kvix_predictions_created_total"), 4.0);
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 4.0);
    // Never in the dump: the dump is the engines' state.
    assert!(dump_rows(&s, MODEL).1.is_empty());

    // Gone after the TTL, counted as expired, and the blocks went with it.
    s.eventually("the prediction expires", || {
        let v = scores(&s, MODEL, &prompt);
        if v == json!({}) {
            Ok(())
        } else {
            Err(v.to_string())
        }
    });
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert_eq!(metric(&s, "kvix_predictions_expired_total"), 4.0);
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 0.0);
    assert_eq!(metric(&s, "kvix_shard_blocks"), 0.0);
}

/// An idle indexer's executor sleeps until its next event; a prediction made then
/// still ends on time, not at the sleeping executor's next wake-up (up to half a
/// second later).
#[test]
fn a_prediction_made_while_the_indexer_is_idle_ends_on_time() {
    let (s, _w1) = serve_with_worker("1");
    let _w2 = add_worker(&s, 2, 0);
    for round in 0..3u32 {
        // Idle long enough for the executor to park.
        std::thread::sleep(Duration::from_millis(600));
        let prompt = tokens(100 * round + 1, 100 * round + 8);
        let t0 = Instant::now();
        speculate(
            &s,
            json!({"model_name": MODEL, "instance_id": 2, "token_ids": prompt, "ttl_ms": 20}),
        );
        while scores(&s, MODEL, &prompt) != json!({}) {
            assert!(
                t0.elapsed() < Duration::from_millis(400),
                "round {round}: a 20 ms prediction still scores after {:?}",
                t0.elapsed()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[test]
fn a_confirmed_prediction_stays_and_an_unconfirmed_one_beside_it_expires() {
    let (s, mut w1) = serve_with_worker("2");
    let (_w2, _w3) = (add_worker(&s, 2, 0), add_worker(&s, 3, 0));
    let prompt = tokens(1, 16);
    speculate(
        &s,
        json!({"model_name": MODEL, "instance_id": 1, "token_ids": prompt, "ttl_ms": 800}),
    );
    speculate(
        &s,
        json!({"model_name": MODEL, "instance_id": 2, "token_ids": prompt, "ttl_ms": 800}),
    );
    assert_eq!(
        scores(&s, MODEL, &prompt),
        json!({"1": {"0": 16}, "2": {"0": 16}})
    );
    // Worker 1's engine stores the first three blocks: those are confirmed.
    w1.send(&stored(&[101, 102, 103], None, &tokens(1, 12), 4));
    s.eventually("confirmation", || {
        match metric(&s, "kvix_predictions_confirmed_total") {
            3.0 => Ok(()),
            n => Err(n.to_string()),
        }
    });
    assert_eq!(dump_rows(&s, MODEL).1.len(), 3);
    s.eventually("the unconfirmed predictions expire", || {
        let v = scores(&s, MODEL, &prompt);
        if v == json!({"1": {"0": 12}}) {
            Ok(())
        } else {
            Err(v.to_string())
        }
    });
    // Worker 1's fourth block and every block of worker 2 were never confirmed.
    assert_eq!(metric(&s, "kvix_predictions_expired_total"), 5.0);
    assert_eq!(dump_rows(&s, MODEL).1.len(), 3);
    // A refresh extends a prediction rather than adding one.
    speculate(
        &s,
        json!({"model_name": MODEL, "instance_id": 3, "token_ids": tokens(1, 4), "ttl_ms": 60000}),
    );
    speculate(
        &s,
        json!({"model_name": MODEL, "instance_id": 3, "token_ids": tokens(1, 4), "ttl_ms": 60000}),
    );
    assert_eq!(metric(&s, "kvix_predictions_refreshed_total"), 1.0);
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 1.0);
}

#[test]
fn an_approximate_model_is_fed_by_speculation_alone_and_pruned_to_its_bound() {
    let s = Server::start(&[
        "--threads",
        "2",
        "--approximate",
        "approx",
        "--router-max-tree-size",
        "40",
        "--router-prune-target-ratio",
        "0.5",
    ]);
    // No index yet: the first speculation must say its block size.
    let (st, v) = s.post_json(
        "/speculate",
        &json!({"model_name": "approx", "instance_id": "w-a", "token_ids": tokens(1, 8)}),
    );
    assert_eq!(st, 422, "{v}");
    assert!(v.to_string().contains("block_size"), "{v}");
    // A model that is neither registered nor approximate is unknown.
    let (st, _) = s.post_json(
        "/speculate",
        &json!({"model_name": "nope", "instance_id": 1, "token_ids": tokens(1, 8)}),
    );
    assert_eq!(st, 404);

    // The router TTL (120 s by default) applies, and names work as instances.
    let r = speculate(
        &s,
        json!({"model_name": "approx", "instance_id": "w-a", "block_size": 4, "token_ids": tokens(1, 8)}),
    );
    assert_eq!(r, json!({"predicted_blocks": 2, "ttl_ms": 120000}));
    // 30 prompts of 4 blocks each, newest last: far over the 40-block bound.
    let mut last = Vec::new();
    for p in 0..30u32 {
        last = tokens(1000 * (p + 1), 1000 * (p + 1) + 15);
        speculate(
            &s,
            json!({"model_name": "approx", "instance_id": 5, "token_ids": last}),
        );
    }
    let blocks = metric(&s, "kvix_shard_blocks");
    assert!(blocks <= 40.0, "{blocks} blocks");
    assert!(metric(&s, "kvix_predictions_pruned_total") > 0.0);
    // The newest prompt is the last to be pruned: it still scores in full.
    assert_eq!(scores(&s, "approx", &last), json!({"5": {"0": 16}}));
}

#[test]
fn bad_speculations_get_errors_naming_the_field() {
    let (s, _w1) = serve_with_worker("1");
    for (body, field) in [
        (
            json!({"model_name": MODEL, "token_ids": [1, 2, 3, 4]}),
            "instance_id",
        ),
        (json!({"model_name": MODEL, "instance_id": 1}), "token_ids"),
        (
            json!({"model_name": MODEL, "instance_id": 1, "token_ids": [1], "ttl_ms": -5}),
            "ttl_ms",
        ),
        (
            json!({"model_name": MODEL, "instance_id": 1, "token_ids": ["a"]}),
            "token_ids",
        ),
    ] {
        let (st, v) = s.post_json("/speculate", &body);
        assert!(st == 400 || st == 422, "{body}: {st} {v}");
        assert!(v.to_string().contains(field), "{body}: {v}");
    }
    let (st, _) = s.call("GET", "/speculate", None);
    assert_eq!(st, 405);
    let (st, v) = s.post_json(
        "/speculate",
        &json!({"model_name": MODEL, "instance_id": 1, "token_ids": [1, 2, 3, 4], "block_size": 8}),
    );
    assert_eq!(st, 400, "{v}");
    // Nothing was predicted by any of them, and the service still answers.
    assert_eq!(metric(&s, "kvix_predictions_created_total"), 0.0);
    assert_eq!(scores(&s, MODEL, &tokens(1, 4)), json!({}));
}
