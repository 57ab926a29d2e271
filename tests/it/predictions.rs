//! Predictions end to end: the real binary, `/speculate` over HTTP, confirming
//! `BlockStored` events over real ZMQ, and what every query route and `/dump` see.

use crate::support::{self, Publisher, Server, dump_rows, register, register_with, stored};
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

/// A server on two executors whose model `approx` is approximate, its index
/// bounded at `max_tree` blocks, with `extra` flags.
fn approximate_server(max_tree: &str, extra: &[&str]) -> Server {
    let flags = [
        "--threads",
        "2",
        "--approximate",
        "approx",
        "--router-max-tree-size",
    ];
    Server::start(&[&flags[..], &[max_tree], extra].concat())
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
    let s = approximate_server("40", &["--router-prune-target-ratio", "0.5"]);
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

/// A prediction names a worker an engine reports for: on a model fed by events,
/// one that is not registered (never, or no more), or a dp rank it does not
/// have, is a 404 naming the field, predicts nothing and never scores.
#[test]
fn a_speculation_for_a_worker_that_is_not_registered_is_a_404_and_never_scores() {
    let (s, _w1) = serve_with_worker("2");
    let w2 = add_worker(&s, 2, 0);
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 2, "model_name": MODEL}),
    );
    drop(w2);
    let prompt = tokens(1, 16);
    for (instance, dp, field) in [
        (json!(7), 0, "instance_id"),
        (json!("w-x"), 0, "instance_id"),
        (json!(2), 0, "instance_id"),
        (json!(1), 3, "dp_rank"),
    ] {
        let (st, v) = s.post_json(
            "/speculate",
            &json!({"model_name": MODEL, "instance_id": instance, "dp_rank": dp, "token_ids": prompt}),
        );
        assert_eq!(st, 404, "{instance} dp {dp}: {v}");
        assert_eq!(v["field"], field, "{instance} dp {dp}: {v}");
    }
    assert_eq!(scores(&s, MODEL, &prompt), json!({}));
    assert_eq!(metric(&s, "kvix_predictions_created_total"), 0.0);
    let workers = s.get_json("/workers");
    assert_eq!(workers.as_array().map(Vec::len), Some(1), "{workers}");
    // The registered worker's prediction still scores.
    speculate(
        &s,
        json!({"model_name": MODEL, "instance_id": 1, "token_ids": prompt}),
    );
    assert_eq!(scores(&s, MODEL, &prompt), json!({"1": {"0": 16}}));
}

/// vLLM's batch envelope `[ts, events, dp_rank]` of one `BlockStored`.
fn stored_at_dp(hashes: &[u64], t: &[u32], dp: u64) -> Vec<u8> {
    let mut b = stored(hashes, None, t, 4);
    assert_eq!(b[0], 0x92, "a two-element batch");
    b[0] = 0x93;
    rmp::encode::write_uint(&mut b, dp).unwrap();
    b
}

/// Predictions never take the slots an engine's dp ranks need: 1,100 of them on
/// dp ranks the worker does not have are refused (no 5xx, nothing made), and
/// the engine's batch on a new dp rank is still indexed.
#[test]
fn speculations_on_new_dp_ranks_take_nothing_from_the_engines() {
    let (s, mut w1) = serve_with_worker("2");
    let answers: Vec<(u32, u16, Value)> = (1..=1100u32)
        .map(|dp| {
            let (st, v) = s.post_json(
                "/speculate",
                &json!({"model_name": MODEL, "instance_id": 1, "dp_rank": dp, "block_hashes": [dp]}),
            );
            (dp, st, v)
        })
        .collect();
    let failed: Vec<_> = answers.iter().filter(|(_, st, _)| *st >= 500).collect();
    assert!(
        failed.is_empty(),
        "{} 5xx, the first {:?}",
        failed.len(),
        failed[0]
    );
    for (dp, st, v) in &answers {
        assert_eq!((*st, &v["field"]), (404, &json!("dp_rank")), "dp {dp}: {v}");
    }
    w1.send(&stored_at_dp(&[11, 12], &tokens(1, 8), 5));
    s.eventually("the engine's new dp rank is indexed", || {
        match scores(&s, MODEL, &tokens(1, 8)) {
            v if v == json!({"1": {"5": 8}}) => Ok(()),
            v => Err(v.to_string()),
        }
    });
    assert_eq!(metric(&s, "kvix_event_refusals_total"), 0.0);
    assert_eq!(metric(&s, "kvix_predictions_created_total"), 0.0);
}

/// `--max-predictions` caps a request (413 naming the field) and an index's live
/// predictions (429); each refusal is counted and predicts nothing, and the
/// room comes back as predictions end.
#[test]
fn max_predictions_caps_a_request_and_an_index() {
    let s = Server::start(&["--threads", "2", "--max-predictions", "1000"]);
    let _w1 = Publisher::bind(&zmq::Context::new());
    register(&s, MODEL, 1, &_w1);
    let chain = |from: u64, n: u64| -> Vec<u64> { (from..from + n).collect() };
    let body = |hashes: Vec<u64>, ttl: u64| json!({"model_name": MODEL, "instance_id": 1, "block_hashes": hashes, "ttl_ms": ttl});
    let (st, v) = s.post_json("/speculate", &body(chain(1, 1001), 60_000));
    assert_eq!((st, &v["field"]), (413, &json!("block_hashes")), "{v}");
    speculate(&s, body(chain(10_000, 600), 800));
    let (st, v) = s.post_json("/speculate", &body(chain(20_000, 600), 60_000));
    assert_eq!(st, 429, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("--max-predictions")),
        "{v}"
    );
    assert_eq!(metric(&s, "kvix_prediction_refusals_total"), 2.0);
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 600.0);
    // Once the first prediction ends, the second fits.
    s.eventually("room for the second prediction", || {
        match s.post_json("/speculate", &body(chain(20_000, 600), 60_000)) {
            (200, _) => Ok(()),
            (st, v) => Err(format!("{st} {v}")),
        }
    });
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 600.0);
}

/// CPU seconds (user and system) the process `pid` has used.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap();
    let per_sec: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    ticks / per_sec
}

/// Hour-long predictions asked for by the million: the index keeps at most
/// `--max-predictions` (the rest are refused with 429), and once the requests
/// are answered the process goes idle (a deadline an hour out is looked at a
/// few times in that hour, not every few seconds), answers queries at once and
/// holds a bounded amount of memory. 4M blocks asked for, the default cap of
/// 1,048,576 kept.
#[test]
fn hour_long_predictions_by_the_million_leave_the_process_idle_and_bounded() {
    let (s, _w1) = serve_with_worker("2");
    let rss0 = support::rss_mib(s.pid());
    let (requests, blocks) = (16u64, 250_000u64);
    let mut refused = 0;
    for r in 0..requests {
        let hashes: Vec<u64> = (0..blocks).map(|b| (r << 32) + b + 1).collect();
        let (st, v) = s.post_json(
            "/speculate",
            &json!({"model_name": MODEL, "instance_id": 1, "block_hashes": hashes, "ttl_ms": 3_600_000}),
        );
        match st {
            200 => {}
            429 => refused += 1,
            _ => panic!("request {r}: {st} {v}"),
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, t0) = (cpu_secs(s.pid()), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let busy = (cpu_secs(s.pid()) - cpu0) / t0.elapsed().as_secs_f64();
    eprintln!(
        "{:.0}% of a core busy 2 s after the last request",
        busy * 100.0
    );
    // CPU and latency figures: asserted on a quiet machine (`--features
    // perf-checks`); the queries must answer either way.
    let perf = cfg!(feature = "perf-checks");
    if perf {
        assert!(
            busy < 0.15,
            "{:.0}% of a core busy 2 s after the last request",
            busy * 100.0
        );
    }
    let prompt = tokens(1, 16);
    for _ in 0..10 {
        let t = Instant::now();
        scores(&s, MODEL, &prompt);
        if perf {
            assert!(
                t.elapsed() < Duration::from_millis(50),
                "a query took {:?}",
                t.elapsed()
            );
        }
    }
    let grew = support::rss_mib(s.pid()) - rss0;
    eprintln!(
        "idle: {:.1}% of a core; RSS grew {grew:.0} MiB",
        busy * 100.0
    );
    assert!(grew < 400.0, "RSS grew {grew:.0} MiB");
    assert_eq!(refused, requests - 4);
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 4.0 * blocks as f64);
}

/// One prediction far past an approximate index's bound is pruned to the
/// bound's target, the older predictions first and the long prompt from its
/// end: its head still scores, and the index is not emptied.
#[test]
fn one_long_prediction_prunes_an_approximate_index_to_its_target() {
    let s = approximate_server("2000", &[]);
    for (w, p) in [("w-a", 1u32), ("w-b", 2), ("w-a", 3)] {
        speculate(
            &s,
            json!({"model_name": "approx", "instance_id": w, "block_size": 4, "token_ids": tokens(100 * p, 100 * p + 15)}),
        );
    }
    let chain: Vec<u64> = (0..10_000u64).map(|b| 0xC4A1_0000 + b).collect();
    speculate(
        &s,
        json!({"model_name": "approx", "instance_id": "w-c", "block_hashes": chain}),
    );
    // Each shard holds at most 1,000 blocks and is pruned to 800: the chain's
    // shard keeps its first 800 blocks.
    let (st, v) = s.post_json(
        "/query_by_hash",
        &json!({"model_name": "approx", "block_hashes": chain[..801]}),
    );
    assert_eq!(
        (st, v["scores"].clone()),
        (200, json!({"w-c": {"0": 3200}}))
    );
    let blocks = metric(&s, "kvix_shard_blocks");
    assert!((800.0..=2000.0).contains(&blocks), "{blocks} blocks");
}

/// P/D disaggregation (llm-d): one call predicts the prompt on the decode worker
/// and on the prefill worker it was routed to, or on neither.
#[test]
fn a_speculation_names_its_prefill_worker_too() {
    let s = Server::start(&["--threads", "2", "--max-predictions", "5"]);
    let _decode = add_worker(&s, 1, 0);
    let _prefill = add_worker(&s, 2, 1);
    let t = tokens(1, 8);
    let body = |prefill: Value| {
        let mut b =
            json!({"model_name": MODEL, "instance_id": 1, "token_ids": t, "ttl_ms": 60_000});
        b.as_object_mut()
            .unwrap()
            .extend(prefill.as_object().unwrap().clone());
        b
    };
    // A prefill worker that is not registered, or not at that rank: a 404 naming
    // the prefill field, and nothing predicted on the decode worker either.
    for (prefill, field) in [
        (json!({"prefill_instance_id": 9}), "prefill_instance_id"),
        (
            json!({"prefill_instance_id": 2, "prefill_dp_rank": 0}),
            "prefill_dp_rank",
        ),
        (json!({"prefill_dp_rank": 1}), "prefill_instance_id"),
    ] {
        let (st, f, e) = support::error(&s, "/speculate", &body(prefill));
        assert_eq!((st >= 400, f.as_str()), (true, field), "{e}");
    }
    // Two blocks on each of two workers: four predictions, within the cap of five.
    let v = speculate(
        &s,
        body(json!({"prefill_instance_id": 2, "prefill_dp_rank": 1})),
    );
    assert_eq!(
        v,
        json!({"predicted_blocks": 2, "prefill_predicted_blocks": 2, "ttl_ms": 60_000})
    );
    assert_eq!(scores(&s, MODEL, &t), json!({"1": {"0": 8}, "2": {"1": 8}}));
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 4.0);
    // Two more on each would take the index past five: refused whole.
    let more = json!({"model_name": MODEL, "instance_id": 1, "token_ids": tokens(11, 18),
                      "prefill_instance_id": 2, "prefill_dp_rank": 1});
    let (st, v) = s.post_json("/speculate", &more);
    assert_eq!(st, 429, "{v}");
    assert_eq!(metric(&s, "kvix_predicted_blocks"), 4.0);
    assert_eq!(scores(&s, MODEL, &tokens(11, 18)), json!({}));
}
