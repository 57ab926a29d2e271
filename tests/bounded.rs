//! `--max-blocks` end to end: the real binary fed far past its bound by real vLLM
//! events over ZMQ, queried over HTTP while it evicts.

mod common;

use common::{Server, dump_rows, removed, stored, workers};
use serde_json::{Value, json};

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
