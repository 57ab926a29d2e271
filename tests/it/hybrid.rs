//! Hybrid-attention models end to end: the real binary, real ZMQ publishers
//! sending vLLM's map-encoded events with their KV-cache group fields, and
//! `/query`'s per-instance `effective` and `hit` under vLLM's hit rules, while
//! `scores` stays the full-attention answer.
//!
//! A replica recovering such an index from a peer's `/dump`, and a restart
//! from a snapshot, answer as the original did.
//!
//! Every prompt here has blocks of 4 tokens, block `i` being tokens
//! `4i+1 ..= 4i+4`, named by the engine (in every group alike) `100 + i`.

use crate::support::{self, Publisher, Server, publishers, register, register_with};
use serde_json::{Value, json};

const BS: u32 = 4;

/// Tokens of blocks `0..n`.
fn tokens(n: u32) -> Vec<u32> {
    (1..=n * BS).collect()
}

fn hash(block: u32) -> u64 {
    100 + block as u64
}

/// One event of a vLLM batch, as current vLLM encodes it: a tagged map.
enum Ev {
    /// `group` stores `blocks` (a subset of `first..end`, sparse for a group
    /// that keeps no state for the others), its tokens spanning `first..end`.
    Stored {
        first: u32,
        end: u32,
        blocks: Vec<u32>,
        group: u32,
        kind: &'static str,
        window: Option<u32>,
    },
    Removed {
        blocks: Vec<u32>,
        group: u32,
    },
}

fn s(k: &str, b: &mut Vec<u8>) {
    rmp::encode::write_str(b, k).unwrap();
}

fn uints(b: &mut Vec<u8>, v: impl ExactSizeIterator<Item = u64>) {
    rmp::encode::write_array_len(b, v.len() as u32).unwrap();
    for x in v {
        rmp::encode::write_uint(b, x).unwrap();
    }
}

/// `[ts, [events], dp_rank]` with map events.
fn batch(events: &[Ev]) -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_array_len(&mut b, 3).unwrap();
    rmp::encode::write_f64(&mut b, 1.0).unwrap();
    rmp::encode::write_array_len(&mut b, events.len() as u32).unwrap();
    for e in events {
        match e {
            Ev::Stored {
                first,
                end,
                blocks,
                group,
                kind,
                window,
            } => {
                rmp::encode::write_map_len(&mut b, 11).unwrap();
                s("type", &mut b);
                s("BlockStored", &mut b);
                s("block_hashes", &mut b);
                uints(&mut b, blocks.iter().map(|&i| hash(i)));
                s("parent_block_hash", &mut b);
                if *first == 0 {
                    rmp::encode::write_nil(&mut b).unwrap();
                } else {
                    rmp::encode::write_uint(&mut b, hash(first - 1)).unwrap();
                }
                s("token_ids", &mut b);
                uints(&mut b, (first * BS + 1..end * BS + 1).map(u64::from));
                s("block_size", &mut b);
                rmp::encode::write_uint(&mut b, BS as u64).unwrap();
                s("lora_id", &mut b);
                rmp::encode::write_nil(&mut b).unwrap();
                s("medium", &mut b);
                s("GPU", &mut b);
                s("lora_name", &mut b);
                rmp::encode::write_nil(&mut b).unwrap();
                s("group_idx", &mut b);
                rmp::encode::write_uint(&mut b, *group as u64).unwrap();
                s("kv_cache_spec_kind", &mut b);
                s(kind, &mut b);
                s("kv_cache_spec_sliding_window", &mut b);
                match window {
                    Some(w) => rmp::encode::write_uint(&mut b, *w as u64)
                        .map(|_| ())
                        .unwrap(),
                    None => rmp::encode::write_nil(&mut b).unwrap(),
                }
            }
            Ev::Removed { blocks, group } => {
                rmp::encode::write_map_len(&mut b, 4).unwrap();
                s("type", &mut b);
                s("BlockRemoved", &mut b);
                s("block_hashes", &mut b);
                uints(&mut b, blocks.iter().map(|&i| hash(i)));
                s("medium", &mut b);
                s("GPU", &mut b);
                s("group_idx", &mut b);
                rmp::encode::write_uint(&mut b, *group as u64).unwrap();
            }
        }
    }
    rmp::encode::write_uint(&mut b, 0).unwrap();
    b
}

/// A full-attention group's store of blocks `first..end`.
fn full(group: u32, first: u32, end: u32) -> Ev {
    Ev::Stored {
        first,
        end,
        blocks: (first..end).collect(),
        group,
        kind: "full_attention",
        window: None,
    }
}

/// Another group's store of `blocks`, its tokens spanning `first..end`.
fn other(
    group: u32,
    kind: &'static str,
    window: Option<u32>,
    first: u32,
    end: u32,
    blocks: &[u32],
) -> Ev {
    Ev::Stored {
        first,
        end,
        blocks: blocks.to_vec(),
        group,
        kind,
        window,
    }
}

fn query(model: &str, blocks: u32) -> Value {
    json!({"model_name": model, "token_ids": tokens(blocks)})
}

/// Wait until worker `instance`'s rank 0 answers `effective` tokens and `hit`
/// for a prompt of `blocks` blocks, with `scores` (full attention) `full` tokens.
fn expect(
    s: &Server,
    model: &str,
    instance: u64,
    blocks: u32,
    full: u64,
    effective: u64,
    hit: &str,
) {
    let body = query(model, blocks);
    let id = instance.to_string();
    s.eventually(
        &format!("{blocks} blocks: effective {effective} ({hit}), scores {full}"),
        || {
            let v = s.post_json("/query", &body).1;
            let inst = &v["instances"][&id];
            let score = v["scores"][&id]["0"].as_u64().unwrap_or(0);
            if inst["effective"]["0"] == json!(effective)
                && inst["hit"]["0"] == json!(hit)
                && score == full
            {
                Ok(())
            } else {
                Err(v.to_string())
            }
        },
    );
}

#[test]
fn sliding_window_slid_out_evicted_in_the_middle_then_gone() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut w] = publishers(&ctx);
    register(&s, "gemma", 1, &w);
    // Gemma's order: group 0 is the sliding window (9 tokens: ceil(8 / 4) = 2
    // blocks must be present), group 1 full attention; group 0's store comes
    // first in the step's batch. The window group keeps blocks 2..8 of the 8 it
    // computed: 0 and 1 slid out of the window (vLLM names only kept blocks).
    w.send(&batch(&[
        other(0, "sliding_window", Some(9), 0, 8, &[2, 3, 4, 5, 6, 7]),
        full(1, 0, 8),
    ]));
    // 8 blocks: from the right, 7 and 6 are present: a run of 2 ends the hit at 8.
    expect(&s, "gemma", 1, 8, 32, 32, "full");
    // 5 blocks: capped at 5, blocks 4 and 3 make the run: 5 blocks.
    expect(&s, "gemma", 1, 5, 20, 20, "full");
    // 2 blocks: neither 1 nor 0 is in the window any more, and no run from
    // block 0: nothing to reuse, though full attention holds both.
    expect(&s, "gemma", 1, 2, 8, 0, "miss");

    // Blocks 4 and 6 are evicted from the window group only (group 0's removal).
    w.send(&batch(&[Ev::Removed {
        blocks: vec![4, 6],
        group: 0,
    }]));
    // 8 blocks: 7 alone (6 gone), 5 alone (4 gone), then 3 and 2: the run ends
    // the hit at block 4 (16 tokens); full attention still holds all 8.
    expect(&s, "gemma", 1, 8, 32, 16, "partial");
    // llm-d's run ends with the effective prefix: 4 device blocks of weight 1.
    let v = s.post_json(
        "/query",
        &json!({"model_name": "gemma", "token_ids": tokens(8), "scoring": "llm-d"}),
    );
    assert_eq!(v.1["llm_d"]["1"]["0"]["score"], json!(4.0), "{}", v.1);
    // So does the conductor's longest prefix, and the blocks counted within it.
    let v = s.post_json("/query", &json!({"model": "gemma", "token_ids": tokens(8)}));
    assert_eq!(
        v.1,
        json!({"default": {"1": {"longest_matched": 16, "GPU": 16, "DP": {"0": 16}, "CPU": 0, "DISK": 0}}})
    );

    // The window group loses the rest: nothing is reusable.
    w.send(&batch(&[Ev::Removed {
        blocks: vec![2, 3, 5, 7],
        group: 0,
    }]));
    expect(&s, "gemma", 1, 8, 32, 0, "miss");
    // A full-attention removal still removes from the index Dynamo keeps.
    w.send(&batch(&[Ev::Removed {
        blocks: vec![7],
        group: 1,
    }]));
    expect(&s, "gemma", 1, 8, 28, 0, "miss");
    s.stop();
}

#[test]
fn mamba_sparse_state_blocks() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut w] = publishers(&ctx);
    register(&s, "qwen-next", 1, &w);
    // Group 0 full attention, group 1 Mamba: Mamba keeps the state after blocks 3
    // and 7 only; its tokens span all 8 blocks.
    w.send(&batch(&[
        full(0, 0, 8),
        other(1, "mamba", None, 0, 8, &[3, 7]),
    ]));
    // 8 blocks: the last state (block 7) covers the whole prefix.
    expect(&s, "qwen-next", 1, 8, 32, 32, "full");
    // 6 blocks: the last state before the end is block 3's: 4 blocks.
    expect(&s, "qwen-next", 1, 6, 24, 16, "partial");
    // 3 blocks: no state at or before block 2.
    expect(&s, "qwen-next", 1, 3, 12, 0, "miss");
    // The state after block 7 is evicted: block 3's is the last.
    w.send(&batch(&[Ev::Removed {
        blocks: vec![7],
        group: 1,
    }]));
    expect(&s, "qwen-next", 1, 8, 32, 16, "partial");
    // The next step: Mamba's store names as parent block 7, which only full
    // attention still holds; its state after block 9 covers 10 blocks.
    w.send(&batch(&[
        full(0, 8, 10),
        other(1, "mamba", None, 8, 10, &[9]),
    ]));
    expect(&s, "qwen-next", 1, 10, 40, 40, "full");
    // Full attention loses block 9: its match is 9 blocks, and Mamba's last
    // state within them is block 3's.
    w.send(&batch(&[Ev::Removed {
        blocks: vec![9],
        group: 0,
    }]));
    expect(&s, "qwen-next", 1, 10, 36, 16, "partial");
    // A state block of a block full attention does not hold (9, just removed) is
    // not kept, and counted; a group of a kind kvix has no rule for is dropped.
    w.send(&batch(&[
        other(1, "mamba", None, 8, 10, &[9]),
        other(3, "encoder_only_attention", None, 0, 1, &[0]),
    ]));
    s.eventually("the unheld and the ignored counted", || {
        let unheld = s.metric("kvix_group_blocks_unheld_total", &[]);
        let ignored = s.metric("kvix_ignored_events_total", &[]);
        (unheld == 1.0 && ignored == 1.0)
            .then_some(())
            .ok_or(format!("unheld {unheld}, ignored {ignored}"))
    });
    expect(&s, "qwen-next", 1, 10, 36, 16, "partial");
    s.stop();
}

#[test]
fn chunked_local_needs_the_current_chunk_only() {
    // Chunks of 8 tokens for `llama4` from the command line; worker 2 registers
    // chunks of 16 instead.
    let s = Server::start(&["--threads", "2", "--attention-chunk-size", "llama4=8"]);
    let ctx = zmq::Context::new();
    let [mut w1, mut w2]: [Publisher; 2] = publishers(&ctx);
    register(&s, "llama4", 1, &w1);
    register_with(&s, "llama4", 2, &w2, json!({"attention_chunk_size": 16}));
    // Both: full attention holds blocks 0..6; the chunked group keeps 4 and 5.
    for w in [&mut w1, &mut w2] {
        w.send(&batch(&[
            full(0, 0, 6),
            other(1, "chunked_local_attention", None, 0, 6, &[4, 5]),
        ]));
    }
    // Worker 1, 6 blocks (24 tokens): the chunk of the next token starts at 24:
    // no block of it is needed, all 6 count.
    expect(&s, "llama4", 1, 6, 24, 24, "full");
    // 5 blocks (20 tokens): the chunk starts at 16 (block 4), which is present.
    expect(&s, "llama4", 1, 5, 20, 20, "full");
    // 3 blocks (12 tokens): the chunk starts at 8 (block 2), which is not: 2 blocks.
    expect(&s, "llama4", 1, 3, 12, 8, "partial");
    // Worker 2, chunks of 16: 3 blocks (12 tokens) are all in the chunk at 0,
    // whose block 0 is not kept: nothing.
    expect(&s, "llama4", 2, 3, 12, 0, "miss");
    // 6 blocks (24 tokens): the chunk starts at 16 (block 4); 4 and 5 are present.
    expect(&s, "llama4", 2, 6, 24, 24, "full");
    s.stop();
}

#[test]
fn a_model_without_group_fields_is_scored_as_before() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut w] = publishers(&ctx);
    register(&s, "plain", 1, &w);
    let hashes: Vec<u64> = (0..3).map(hash).collect();
    w.send(&support::stored(&hashes, None, &tokens(3), BS));
    // Full attention alone: effective is the device match, a hit is whole.
    expect(&s, "plain", 1, 3, 12, 12, "full");
    let v = s
        .post_json(
            "/query",
            &json!({"model_name": "plain", "token_ids": [9, 9, 9, 9]}),
        )
        .1;
    assert_eq!(v["instances"]["1"]["effective"], json!({"0": 0}), "{v}");
    assert_eq!(v["instances"]["1"]["hit"], json!({"0": "miss"}), "{v}");
    // Its `/dump` is Dynamo's, without kvix's group fields.
    let dump = s.get_json("/dump");
    assert!(
        dump["plain:default"].get("kvix_group_specs").is_none(),
        "{dump}"
    );
    assert!(!dump.to_string().contains("kvix_groups"), "{dump}");
    s.stop();
}

/// The state the recovery tests build: worker 1 of `gemma` (group 0 a sliding
/// window of 9 tokens, 2 blocks; group 1 full attention) and worker 2 of
/// `qwen-next` (group 0 full attention, group 1 Mamba), both holding blocks
/// 0..8 in full attention.
fn hybrid_state(s: &Server, w1: &mut Publisher, w2: &mut Publisher) {
    register(s, "gemma", 1, w1);
    register(s, "qwen-next", 2, w2);
    // The window keeps 2..8, then loses 4 and 6: it holds 2, 3, 5 and 7.
    w1.send(&batch(&[
        other(0, "sliding_window", Some(9), 0, 8, &[2, 3, 4, 5, 6, 7]),
        full(1, 0, 8),
    ]));
    w1.send(&batch(&[Ev::Removed {
        blocks: vec![4, 6],
        group: 0,
    }]));
    // Mamba keeps the states after blocks 3 and 7.
    w2.send(&batch(&[
        full(0, 0, 8),
        other(1, "mamba", None, 0, 8, &[3, 7]),
    ]));
}

/// What [`hybrid_state`] answers (the rules as in the tests above).
fn expect_hybrid_state(s: &Server) {
    // gemma, 8 blocks: from the right 7 alone, 5 alone, then 3 and 2 make the
    // run of 2: the hit ends at block 4 (16 tokens).
    expect(s, "gemma", 1, 8, 32, 16, "partial");
    // 4 blocks: 3 and 2 end the prompt: all of it.
    expect(s, "gemma", 1, 4, 16, 16, "full");
    // 2 blocks: neither is in the window, and there is no run from block 0.
    expect(s, "gemma", 1, 2, 8, 0, "miss");
    // qwen-next: 8 blocks end on block 7's state; 6 blocks fall back to block
    // 3's (4 blocks); 3 blocks have none.
    expect(s, "qwen-next", 2, 8, 32, 32, "full");
    expect(s, "qwen-next", 2, 6, 24, 16, "partial");
    expect(s, "qwen-next", 2, 3, 12, 0, "miss");
}

/// After recovery, live removals in the other groups apply where they would
/// have applied on the original: the recovered index knows each group.
fn live_group_removals_apply(s: &[&Server], w1: &mut Publisher, w2: &mut Publisher) {
    w1.send(&batch(&[Ev::Removed {
        blocks: vec![3],
        group: 0,
    }]));
    w2.send(&batch(&[Ev::Removed {
        blocks: vec![3],
        group: 1,
    }]));
    for s in s {
        // gemma's window holds 2, 5 and 7: no run of 2 anywhere, none from block 0.
        expect(s, "gemma", 1, 8, 32, 0, "miss");
        // qwen-next's only state is block 7's: 6 blocks have none; 8 still do.
        expect(s, "qwen-next", 2, 6, 24, 0, "miss");
        expect(s, "qwen-next", 2, 8, 32, 32, "full");
    }
}

#[test]
fn a_replica_recovers_each_group_from_its_peer() {
    let a = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut w1, mut w2]: [Publisher; 2] = publishers(&ctx);
    hybrid_state(&a, &mut w1, &mut w2);
    expect_hybrid_state(&a);
    // The dump carries the groups in kvix's own fields, beside Dynamo's shape: the
    // worker's groups on the index, a block's groups on its stored event, and
    // nothing more for a block no other group holds.
    let dump = a.get_json("/dump");
    assert_eq!(
        dump["gemma:default"]["kvix_group_specs"],
        json!([{"worker_id": 1, "dp_rank": 0, "align": null, "groups": [
            {"group_idx": 0, "block_size": 4, "kind": "sliding_window", "sliding_window": 9}]}]),
        "{dump}"
    );
    let stored = |block: u32| {
        let events = dump["gemma:default"]["events"].as_array().unwrap();
        let ev = events
            .iter()
            .find(|e| e["event"]["data"]["stored"]["blocks"][0]["block_hash"] == json!(hash(block)))
            .unwrap();
        ev["event"]["data"]["stored"].clone()
    };
    assert_eq!(stored(5)["kvix_groups"], json!(1), "{dump}");
    assert!(stored(4).get("kvix_groups").is_none(), "{dump}");
    // B adopts A's workers (`/workers`), then seeds from A's `/dump`; nothing was
    // published since, so what B answers came from the dump.
    let b = Server::start(&[
        "--threads",
        "2",
        "--peers",
        &a.base,
        "--peer-wait-ms",
        "100",
    ]);
    b.wait_log("recovered from peer");
    w1.wait_subscriber();
    w2.wait_subscriber();
    expect_hybrid_state(&b);
    live_group_removals_apply(&[&a, &b], &mut w1, &mut w2);
    a.stop();
    b.stop();
}

#[test]
fn a_restart_from_a_snapshot_keeps_each_group() {
    let dir = support::dir_with("hybrid-snapshot", &[]);
    let path = dir.join("hybrid.snap");
    let p = path.to_str().unwrap();
    let flags = [
        "--threads",
        "2",
        "--snapshot-path",
        p,
        "--snapshot-interval",
        "0",
    ];
    let s = Server::start(&flags);
    let ctx = zmq::Context::new();
    let [mut w1, mut w2]: [Publisher; 2] = publishers(&ctx);
    hybrid_state(&s, &mut w1, &mut w2);
    expect_hybrid_state(&s);
    // SIGTERM writes the snapshot; the restart registers the workers from it.
    let (code, log) = s.terminate();
    assert_eq!(code, Some(0), "{log}");
    let s = Server::start(&flags);
    s.wait_log("loaded snapshot");
    w1.wait_subscriber();
    w2.wait_subscriber();
    expect_hybrid_state(&s);
    live_group_removals_apply(&[&s], &mut w1, &mut w2);
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
