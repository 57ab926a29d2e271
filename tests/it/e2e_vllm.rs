//! End to end: the real binary, real ZMQ publishers sending msgspec-encoded vLLM
//! batches (positional, map-encoded, mixed), asserting every query route exactly.

use crate::support::{
    Engine, Publisher, Row, Server, dump_rows, fixture, fixture_with, publishers, register,
    register_with, stored, worker_flags,
};
use kvix::hash::{block_seed, local_hash};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

const MODEL: &str = "m";

fn tokens(a: u32, b: u32) -> Vec<u32> {
    (a..=b).collect()
}

fn local(t: &[u32]) -> u64 {
    local_hash(t, block_seed(None, None)).0
}

fn query(t: &[u32]) -> Value {
    json!({"token_ids": t, "model_name": MODEL})
}

fn query_by_hash(t: &[u32]) -> Value {
    let hashes: Vec<u64> = t.chunks_exact(4).map(local).collect();
    json!({"block_hashes": hashes, "model_name": MODEL})
}

/// `/query`'s `instances` entry of a worker whose blocks are all on the device (so
/// every tier counts them): each `(dp rank, matched tokens)`, the same as its
/// effective match, a `full` hit where a rank matched anything and a `miss` where
/// not, and the longest of the ranks' matches.
fn on_device(ranks: &[(u32, u64)]) -> Value {
    let longest = ranks.iter().map(|r| r.1).max().unwrap_or(0);
    let per_rank = |f: fn(u64) -> Value| -> serde_json::Map<String, Value> {
        ranks.iter().map(|&(r, n)| (r.to_string(), f(n))).collect()
    };
    let matched = per_rank(|n| json!(n));
    let hit = per_rank(|n| json!(if n > 0 { "full" } else { "miss" }));
    json!({"longest_matched": longest, "gpu": longest, "dp": matched, "cpu": longest,
           "disk": longest, "effective": matched, "hit": hit})
}

#[test]
fn vllm_events_to_dynamo_queries() {
    let s = Server::start(&["--threads", "2"]);
    events_to_queries(&s);
    // The index spreads over both shards (the default span is above 2).
    assert!(
        [("shard", "0"), ("shard", "1")]
            .iter()
            .all(|l| s.metric("kvix_shard_ops_applied_total", &[*l]) > 0.0)
    );
    s.stop();
}

/// The same events and answers when an index spreads over fewer shards than there
/// are: only its shard files anything, and a query asks it alone.
#[test]
fn vllm_events_to_dynamo_queries_on_one_shard_of_two() {
    let s = Server::start(&["--threads", "2", "--shards-per-index", "1"]);
    events_to_queries(&s);
    let held: Vec<f64> = ["0", "1"]
        .iter()
        .map(|i| s.metric("kvix_shard_ops_applied_total", &[("shard", i)]))
        .collect();
    assert!(
        held.iter().filter(|n| **n > 0.0).count() == 1,
        "one shard applies every op of the index: {held:?}"
    );
    s.stop();
}

fn events_to_queries(s: &Server) {
    let ctx = zmq::Context::new();
    let [mut w1, mut w2d0, mut w2d1] = publishers(&ctx);
    assert_eq!(register(s, MODEL, 1, &w1), json!({"status": "ok"}));
    assert_eq!(
        register_with(s, MODEL, 2, &w2d0, json!({"dp_rank": 0})),
        json!({"status": "ok"})
    );
    assert_eq!(
        register_with(s, MODEL, 2, &w2d1, json!({"dp_rank": 1})),
        json!({"status": "ok"})
    );

    // Worker 1: positional vLLM; 3 blocks, then a child of the third.
    w1.send(&fixture("w1_s0_store"));
    w1.send(&fixture("w1_s1_store_child"));
    // Worker 2 rank 0: map-encoded batch and events; rank 1: positional batch, map events.
    w2d0.send(&fixture("w2d0_s0_store"));
    w2d1.send(&fixture("w2d1_s0_store"));

    let prompt = tokens(1, 16);
    every_query_shape_answers(s, &prompt);
    workers_listed(s, &w1, &w2d0, &w2d1);
    dump_is_every_stored_block_parents_first(s);

    // A remove on rank 0 of worker 2 shortens its prefix; a clear empties worker 1.
    w2d0.send(&fixture("w2d0_s1_remove"));
    w1.send(&fixture("w1_s2_clear"));
    s.wait_post_eq(
        "/query",
        &query(&prompt),
        &json!({
            "scores": {"2": {"0": 4, "1": 4}},
            "frequencies": [2],
            "tree_sizes": {"1": {"0": 0}, "2": {"0": 1, "1": 2}},
            "instances": {
                "1": on_device(&[(0, 0)]),
                "2": on_device(&[(0, 4), (1, 4)])
            }
        }),
    );

    // The engine behind worker 1 restarts: a new publisher on the same port, sequence from 0.
    let addr = w1.endpoint.clone();
    drop(w1);
    let mut w1 = Publisher::bind_at(&ctx, &addr);
    w1.wait_subscriber();
    w1.send(&fixture("w1_restart_s0_store"));
    let after_restart = json!({
        "scores": {"1": {"0": 8}, "2": {"0": 4, "1": 4}},
        "frequencies": [3, 1],
        "tree_sizes": {"1": {"0": 2}, "2": {"0": 1, "1": 2}},
        "instances": {
            "1": on_device(&[(0, 8)]),
            "2": on_device(&[(0, 4), (1, 4)])
        }
    });
    s.wait_post_eq("/query", &query(&prompt), &after_restart);
    assert_eq!(
        s.post_json("/query_by_hash", &query_by_hash(&prompt)).1,
        after_restart
    );
    unregister_a_rank_then_the_instance(s, &prompt);
}

/// The first stores' answer for `prompt`, by token ids, by local hashes, with a
/// trailing partial block; a prompt sharing nothing gets tree sizes alone.
fn every_query_shape_answers(s: &Server, prompt: &[u32]) {
    let want = json!({
        "scores": {"1": {"0": 16}, "2": {"0": 8, "1": 4}},
        "frequencies": [3, 2, 1, 1],
        "tree_sizes": {"1": {"0": 4}, "2": {"0": 2, "1": 2}},
        "instances": {
            "1": on_device(&[(0, 16)]),
            "2": on_device(&[(0, 8), (1, 4)])
        }
    });
    s.wait_post_eq("/query", &query(prompt), &want);
    // The same prefix by precomputed Dynamo local hashes.
    assert_eq!(
        s.post_json("/query_by_hash", &query_by_hash(prompt)),
        (200, want.clone())
    );
    // A prompt with a trailing partial block scores the same.
    let mut longer = prompt.to_vec();
    longer.extend([7, 7]);
    assert_eq!(s.post_json("/query", &query(&longer)).1, want);
    // A prompt sharing nothing scores nobody but still reports tree sizes.
    assert_eq!(
        s.post_json("/query", &query(&[9, 9, 9, 9])).1,
        json!({"scores": {}, "frequencies": [], "tree_sizes": want["tree_sizes"], "instances": {
            "1": on_device(&[(0, 0)]),
            "2": on_device(&[(0, 0), (1, 0)])
        }})
    );
}

/// `/workers` lists each worker with its endpoint per dp rank.
fn workers_listed(s: &Server, w1: &Publisher, w2d0: &Publisher, w2d1: &Publisher) {
    let workers = s.get_json("/workers");
    let brief: Vec<Value> = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| json!({"instance_id": w["instance_id"], "endpoints": w["endpoints"]}))
        .collect();
    assert_eq!(
        brief,
        vec![
            json!({"instance_id": 1, "endpoints": {"0": w1.endpoint}}),
            json!({"instance_id": 2, "endpoints": {"0": w2d0.endpoint, "1": w2d1.endpoint}}),
        ]
    );
}

/// `/dump`: one stored event per (block, holder), engine hashes, parents first.
fn dump_is_every_stored_block_parents_first(s: &Server) {
    let (bs, rows) = dump_rows(s, MODEL);
    assert_eq!(bs, Some(4));
    let dev = || "device".to_string();
    let want_rows: BTreeSet<Row> = [
        (1, 0, 101, None, local(&tokens(1, 4)), dev()),
        (1, 0, 102, Some(101), local(&tokens(5, 8)), dev()),
        (1, 0, 103, Some(102), local(&tokens(9, 12)), dev()),
        (1, 0, 104, Some(103), local(&tokens(13, 16)), dev()),
        (2, 0, 201, None, local(&tokens(1, 4)), dev()),
        (2, 0, 202, Some(201), local(&tokens(5, 8)), dev()),
        (2, 1, 301, None, local(&tokens(1, 4)), dev()),
        (2, 1, 302, Some(301), local(&[99, 98, 97, 96]), dev()),
    ]
    .into_iter()
    .collect();
    assert_eq!(rows.len(), want_rows.len(), "{rows:?}");
    assert_eq!(rows.iter().cloned().collect::<BTreeSet<_>>(), want_rows);
    for (i, r) in rows.iter().enumerate() {
        if let Some(p) = r.3 {
            assert!(
                rows[..i]
                    .iter()
                    .any(|q| q.0 == r.0 && q.1 == r.1 && q.2 == p),
                "parent of {r:?} comes after it"
            );
        }
    }
}

/// Unregistering one dp rank drops only that rank; the whole instance drops the rest.
fn unregister_a_rank_then_the_instance(s: &Server, prompt: &[u32]) {
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 2, "model_name": MODEL, "tenant_id": "default", "dp_rank": 1}),
    );
    let v = s.post_json("/query", &query(prompt)).1;
    assert_eq!(v["scores"], json!({"1": {"0": 8}, "2": {"0": 4}}));
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 2, "model_name": MODEL}),
    );
    let v = s.post_json("/query", &query(prompt)).1;
    assert_eq!(v["scores"], json!({"1": {"0": 8}}));
    assert_eq!(v["tree_sizes"], json!({"1": {"0": 2}}));
    let ids: Vec<u64> = s
        .get_json("/workers")
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["instance_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1]);
}

#[test]
fn malformed_frames_are_counted_logged_and_skipped() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    // An engine with a replay endpoint: a malformed frame must not make kvix ask it
    // for anything.
    let mut e = Engine::start(&ctx);
    let replay = json!({"replay_endpoint": e.replay_endpoint});
    assert_eq!(
        register_with(&s, MODEL, 7, &e.publisher, replay),
        json!({"status": "ok"})
    );

    let good = fixture("w1_s0_store");
    let unknown_tag = fixture_with("w1_s0_store", b"BlockStored", b"BlockStorex");
    e.publish(&[0xc1]); // a reserved msgpack marker
    e.publish(&good[..good.len() / 2]); // truncated
    e.publish(&unknown_tag);
    e.publish(&[0x93, 0xa1, b'x', 0x90, 0xc0]); // ts of the wrong type
    e.publisher.send_frames(&[b"topic", &0u64.to_be_bytes()]); // two frames instead of three
    e.publisher.send_frames(&[b"topic", b"1234", &good]); // a 4-byte sequence frame
    // The listener must still be alive and apply the next good frame.
    e.publish(&good);
    s.wait_post_eq(
        "/query",
        &query(&tokens(1, 12)),
        &json!({
            "scores": {"7": {"0": 12}},
            "frequencies": [1, 1, 1],
            "tree_sizes": {"7": {"0": 3}},
            "instances": {"7": on_device(&[(0, 12)])}
        }),
    );
    // A malformed frame at seq N between good ones at N-1 and N+1: its sequence was
    // received, so N+1 is no gap.
    e.publish(&[0xc1]);
    e.publish(&stored(&[900], None, &[50, 51, 52, 53], 4));
    s.wait_scores(&query(&[50, 51, 52, 53]), &json!({"7": {"0": 4}}));
    assert_eq!(s.metric("kvix_malformed_frames_total", &[]), 7.0);
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 0.0);
    assert_eq!(s.metric("kvix_sequence_gap_batches_total", &[]), 0.0);
    assert_eq!(s.metric("kvix_replay_requests_total", &[]), 0.0);
    assert_eq!(e.replay_requests.load(Ordering::Relaxed), 0);
    let log = s.stop();
    // Counted each (above), logged once per 10 s with the count left out.
    let skipped = log.matches("malformed frame skipped").count();
    assert_eq!(skipped, 1, "log:\n{log}");
    assert!(log.contains("instance=7"), "log names the worker:\n{log}");
    assert!(!log.contains("sequence gap"), "log:\n{log}");
}

#[test]
fn workers_flag_registers_at_startup() {
    let ctx = zmq::Context::new();
    let mut a = Publisher::bind(&ctx);
    let mut b = Publisher::bind(&ctx);
    let workers = format!("1={},2:1={}", a.endpoint, b.endpoint);
    let s = Server::start(&worker_flags(MODEL, &workers, &[]));
    a.wait_subscriber();
    b.wait_subscriber();
    a.send(&fixture("w1_s0_store"));
    b.send(&fixture("vllm_array_minimal"));
    s.wait_post_eq(
        "/query",
        &query(&tokens(1, 8)),
        &json!({
            "scores": {"1": {"0": 8}, "2": {"1": 4}},
            "frequencies": [2, 1],
            "tree_sizes": {"1": {"0": 3}, "2": {"1": 1}},
            "instances": {
                "1": on_device(&[(0, 8)]),
                "2": on_device(&[(1, 4)])
            }
        }),
    );
}

#[test]
fn matched_only_lists_just_the_workers_holding_the_prefix() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let mut pubs = publishers::<3>(&ctx);
    for (i, p) in pubs.iter().enumerate() {
        register(&s, MODEL, i as u64 + 1, p);
    }
    pubs[1].send(&stored(&[local(&tokens(1, 4))], None, &tokens(1, 4), 4));
    pubs[2].send(&stored(&[local(&tokens(9, 12))], None, &tokens(9, 12), 4));
    s.wait_scores(&query(&tokens(1, 4)), &json!({"2": {"0": 4}}));
    // By default every live worker is listed, holding the prefix or not.
    let all = s.post_ok("/query", &query(&tokens(1, 4)));
    assert_eq!(
        all["tree_sizes"],
        json!({"1": {"0": 0}, "2": {"0": 1}, "3": {"0": 1}})
    );
    let mut body = query(&tokens(1, 4));
    body["matched_only"] = json!(true);
    let some = s.post_ok("/query", &body);
    assert_eq!(some["scores"], all["scores"]);
    assert_eq!(some["frequencies"], all["frequencies"]);
    assert_eq!(some["tree_sizes"], json!({"2": {"0": 1}}));
    let listed: Vec<&String> = some["instances"].as_object().unwrap().keys().collect();
    assert_eq!(listed, ["2"]);
    // Nothing held: nothing listed.
    let mut none = query(&tokens(21, 24));
    none["matched_only"] = json!(true);
    let v = s.post_ok("/query", &none);
    assert_eq!(v["tree_sizes"], json!({}));
    assert_eq!(v["instances"], json!({}));
}
