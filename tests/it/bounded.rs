//! `--max-blocks` end to end: the real binary fed far past its bound by real vLLM
//! events over ZMQ and by long predictions, queried over HTTP while it evicts.

use crate::support::{Publisher, QueryLoop, Server, dump_rows, removed, stored, workers};
use serde_json::{Value, json};
use std::time::Duration;

const MODEL: &str = "m";
const BOUND: u32 = 200;
/// Blocks per prompt (4 tokens each).
const BLOCKS: u32 = 8;

/// Prompt `p`: 32 tokens no other prompt shares, so no blocks are shared.
fn prompt(p: u32) -> Vec<u32> {
    (0..BLOCKS * 4).map(|t| 100_000 * (p + 1) + t).collect()
}

/// The engine's block hashes of prompt `p`.
fn hashes(p: u32) -> Vec<u64> {
    (0..BLOCKS as u64)
        .map(|b| 1_000 * (p as u64 + 1) + b)
        .collect()
}

fn score(s: &Server, p: u32) -> Value {
    let (st, v) = s.post_json(
        "/query",
        &json!({"model_name": MODEL, "token_ids": prompt(p)}),
    );
    assert_eq!(st, 200, "{v}");
    v["scores"].clone()
}

#[test]
fn the_index_stays_within_max_blocks_keeping_the_newest_and_the_matched() {
    let t0 = std::time::Instant::now();
    let s = Server::start(&["--threads", "2", "--max-blocks", &BOUND.to_string()]);
    let ctx = zmq::Context::new();
    let [mut w] = workers(&s, &ctx, MODEL);

    let full = json!({"1": {"0": BLOCKS * 4}});
    // 100 prompts, four times the bound. Prompt 0 is a hot system prompt a router
    // keeps asking about; every other prompt is asked about once, when it lands.
    let prompts = 100;
    for p in 0..prompts {
        w.send(&stored(&hashes(p), None, &prompt(p), 4));
        s.eventually("the prompt lands", || match score(&s, p) {
            v if v == full => Ok(()),
            v => Err(v.to_string()),
        });
        if p > 0 {
            assert_eq!(score(&s, 0), full, "the matched prompt was evicted at {p}");
        }
        let blocks = s.metric("kvix_shard_blocks", &[]);
        assert!(blocks <= BOUND as f64, "{blocks} blocks after prompt {p}");
    }
    let stored_blocks = (prompts * BLOCKS) as f64;
    let blocks = s.metric("kvix_shard_blocks", &[]);
    let evicted = s.metric("kvix_evicted_blocks_total", &[]);
    assert!(
        blocks <= BOUND as f64 && blocks >= BOUND as f64 * 0.9,
        "{blocks}"
    );
    assert_eq!(evicted + blocks, stored_blocks);
    assert!(dump_rows(&s, MODEL).1.len() <= BOUND as usize);
    // The newest prompt scores in full; the oldest unmatched ones are gone (a
    // prefix match stops at the first evicted block).
    assert_eq!(score(&s, prompts - 1), full);
    let gone = (1..10).filter(|&p| score(&s, p) != full).count();
    assert!(gone >= 8, "only {gone} of the oldest prompts lost blocks");

    // The engine later frees evicted blocks: nothing to do, and no error.
    let malformed = s.metric("kvix_malformed_frames_total", &[]);
    for p in 1..10 {
        w.send(&removed(&hashes(p)));
    }
    w.send(&stored(&hashes(500), None, &prompt(500), 4));
    s.eventually("later events still apply", || match score(&s, 500) {
        v if v == full => Ok(()),
        v => Err(v.to_string()),
    });
    assert_eq!(s.metric("kvix_malformed_frames_total", &[]), malformed);
    assert_eq!(score(&s, 0), full);
    assert!(s.metric("kvix_shard_blocks", &[]) <= BOUND as f64);
    let log = s.stop();
    let warnings = log.matches("index at --max-blocks").count();
    let intervals = t0.elapsed().as_secs() as usize / 10 + 1;
    // Only a shard that evicts warns (here the one the worker's blocks live in).
    assert!(
        (1..=2 * intervals).contains(&warnings),
        "{warnings} warnings: at most one per shard per 10 s expected\n{log}"
    );
}

/// The longest a query may wait while kvix evicts: generous for a loaded
/// two-core machine and a debug build, far below what a walk of the index per
/// evicted block cost (seconds).
const QUERY_WAIT: Duration = Duration::from_millis(200);

/// A server bounded at 1,000 blocks on two executors, worker 1 registered.
fn bounded_server() -> (Server, Publisher) {
    let s = Server::start(&["--threads", "2", "--max-blocks", "1000"]);
    let [w] = workers(&s, &zmq::Context::new(), MODEL);
    (s, w)
}

/// Once the index is back within its bound (and a little after), no query of
/// `queries` waited [`QUERY_WAIT`] or longer while `what`.
fn queries_kept_up_with_eviction(s: &Server, queries: QueryLoop, what: &str) {
    s.eventually("the index is back within its bound", || {
        match s.metric("kvix_shard_blocks", &[]) {
            b if b <= 1000.0 => Ok(()),
            b => Err(format!("{b} blocks")),
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let (worst, answered) = queries.finish();
    assert!(answered >= 20, "{answered} queries answered");
    eprintln!("{answered} queries, the longest {worst:?}, while {what}");
    assert!(worst < QUERY_WAIT, "a query waited {worst:?} while {what}");
}

/// One prediction of an 80,000-block chain under `--max-blocks 1000`: the chain
/// has one leaf at a time, and it is evicted back to the bound, in steps,
/// while queries on both executors keep being answered.
#[test]
fn a_long_predicted_chain_past_max_blocks_never_holds_queries_up() {
    let (s, _w) = bounded_server();
    let queries = QueryLoop::start(
        &s.base,
        4,
        json!({"model_name": MODEL, "token_ids": prompt(0)}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let chain: Vec<u64> = (0..80_000u64).map(|i| 0x5EED_0000_0000 + i).collect();
    let r = s.post_ok(
        "/speculate",
        &json!({"model_name": MODEL, "instance_id": 1, "block_hashes": chain, "ttl_ms": 600_000}),
    );
    assert_eq!(r["predicted_blocks"], 80_000);
    queries_kept_up_with_eviction(&s, queries, "the chain was predicted and evicted");
    // What stays is the chain's head: the newest blocks nothing hangs from go first.
    let (st, v) = s.post_json(
        "/query_by_hash",
        &json!({"model_name": MODEL, "block_hashes": chain[..10]}),
    );
    assert_eq!((st, v["scores"].clone()), (200, json!({"1": {"0": 40}})));
}

/// Twenty engine prompts of 2,000 blocks each under `--max-blocks 1000`: each
/// store evicts about as much as it files, while queries keep being answered.
#[test]
fn long_engine_prompts_past_max_blocks_never_hold_queries_up() {
    let (s, mut w) = bounded_server();
    let queries = QueryLoop::start(
        &s.base,
        4,
        json!({"model_name": MODEL, "token_ids": prompt(0)}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let prompts = 20u32;
    let tokens = |p: u32| -> Vec<u32> { (0..8000).map(|t| 10_000_000 * (p + 1) + t).collect() };
    for p in 0..prompts {
        let hashes: Vec<u64> = (0..2000).map(|b| 1_000_000 * (p as u64 + 1) + b).collect();
        w.send(&stored(&hashes, None, &tokens(p), 4));
    }
    s.eventually("every prompt is applied", || {
        match s.metric("kvix_blocks_stored_total", &[]) {
            n if n == (prompts * 2000) as f64 => Ok(()),
            n => Err(format!("{n} blocks stored")),
        }
    });
    queries_kept_up_with_eviction(&s, queries, "40,000 blocks were stored and evicted");
    // Older prompts went first; the newest one's head stays.
    assert!(s.metric("kvix_evicted_blocks_total", &[]) >= 19_000.0);
    let (st, v) = s.post_json(
        "/query",
        &json!({"model_name": MODEL, "token_ids": tokens(prompts - 1)[..400]}),
    );
    assert_eq!((st, v["scores"].clone()), (200, json!({"1": {"0": 400}})));
}
