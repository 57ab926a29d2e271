//! End to end over real ZMQ and HTTP: every event dialect (SGLang, Mooncake RFC
//! #1527, legacy Mooncake Store, tiers, LoRA, tenants) answered in both API
//! shapes (Dynamo's and Mooncake's conductor), the conductor spec's worked example, and
//! llm-d's three pods with llm-d scoring.

use crate::support::{Publisher, Server, fixture, fixture_with, publishers, register, workers};
use kvix::hash::{block_seed, chain, local_hash};
use serde_json::{Value, json};

fn toks(a: u32, b: u32) -> Vec<u32> {
    (a..=b).collect()
}

#[test]
fn every_dialect_in_both_shapes() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut sglang, mut rfc, mut master, mut legacy] = workers(&s, &ctx, "m");

    sglang.send(&fixture("e2e_sglang_store")); // attn_dp_rank 1, GPU
    sglang.send(&fixture("e2e_sglang_offload")); // the same blocks on CPU_PINNED
    rfc.send(&fixture("e2e_rfc_store_tokens")); // LoRA "sql", non-standard hashes + tokens
    rfc.send(&fixture("e2e_rfc_other_tenant")); // tenant "tenant-x"
    master.send(&fixture("e2e_rfc_seq_disk")); // standardized seq hashes, disk, no tokens
    legacy.send(&fixture("e2e_legacy_store")); // Mooncake Store host pool

    let q = json!({"token_ids": toks(1, 16), "model_name": "m"});
    s.wait_post_eq(
        "/query",
        &q,
        &json!({
            "scores": {"1": {"1": 8}},
            "frequencies": [1, 1],
            "tree_sizes": {"1": {"0": 0, "1": 2}, "2": {"0": 3}, "3": {"0": 4}, "4": {"0": 2}},
            // Dynamo's cumulative view: cpu and disk extend the device prefix.
            "instances": {
                "1": {"longest_matched": 8, "gpu": 8, "dp": {"0": 0, "1": 8}, "cpu": 8, "disk": 8,
                 "effective": {"0": 0, "1": 8}, "hit": {"0": "miss", "1": "full"}},
                "2": {"longest_matched": 0, "gpu": 0, "dp": {"0": 0}, "cpu": 0, "disk": 0,
                 "effective": {"0": 0}, "hit": {"0": "miss"}},
                "3": {"longest_matched": 16, "gpu": 0, "dp": {"0": 0}, "cpu": 0, "disk": 16,
                 "effective": {"0": 0}, "hit": {"0": "miss"}},
                "4": {"longest_matched": 8, "gpu": 0, "dp": {"0": 0}, "cpu": 8, "disk": 8,
                 "effective": {"0": 0}, "hit": {"0": "miss"}}
            }
        }),
    );
    let zero = json!({"longest_matched": 0, "GPU": 0, "DP": {"0": 0}, "CPU": 0, "DISK": 0});
    conductor_shape(&s, &zero);
    by_hashes(&s);
    lora_and_tenants(&s);

    // Tier-scoped removals and clears.
    sglang.send(&fixture("e2e_sglang_remove_gpu")); // block 2 leaves the GPU, stays on CPU
    master.send(&fixture("e2e_rfc_removed_disk")); // block 4 leaves the disk
    legacy.send(&fixture("e2e_legacy_remove_all")); // the store's pools are emptied
    s.wait_post_eq(
        "/query",
        &json!({"token_ids": toks(1, 16), "model": "m"}),
        &json!({"default": {
            "1": {"longest_matched": 8, "GPU": 4, "DP": {"0": 0, "1": 4}, "CPU": 8, "DISK": 0},
            "2": zero,
            "3": {"longest_matched": 12, "GPU": 0, "DP": {"0": 0}, "CPU": 0, "DISK": 12},
            "4": zero
        }}),
    );
    master.send(&fixture("e2e_rfc_cleared_disk"));
    s.eventually("disk cleared", || {
        let (_, v) = s.post_json("/query", &json!({"token_ids": toks(1, 16), "model": "m"}));
        (v["default"]["3"] == zero)
            .then_some(())
            .ok_or(v.to_string())
    });

    // Unregistering without a tenant removes the instance from every tenant.
    s.post_ok("/unregister", &json!({"instance_id": 2, "model_name": "m"}));
    let (st, _) = s.post_json(
        "/query",
        &json!({"token_ids": toks(1, 4), "model_name": "m", "tenant_id": "tenant-x"}),
    );
    assert_eq!(st, 404);
    let log = s.stop();
    assert!(!log.contains("malformed"), "{log}");
}

/// The conductor shape of the same question lists every live instance; under
/// /conductor the shape is forced, and instance_id narrows the answer.
fn conductor_shape(s: &Server, zero: &Value) {
    let (st, v) = s.post_json("/query", &json!({"token_ids": toks(1, 16), "model": "m"}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"default": {
            "1": {"longest_matched": 8, "GPU": 8, "DP": {"0": 0, "1": 8}, "CPU": 8, "DISK": 0},
            "2": *zero,
            "3": {"longest_matched": 16, "GPU": 0, "DP": {"0": 0}, "CPU": 0, "DISK": 16},
            "4": {"longest_matched": 8, "GPU": 0, "DP": {"0": 0}, "CPU": 8, "DISK": 0}
        }})
    );
    let (_, v) = s.post_json(
        "/conductor/query",
        &json!({"token_ids": toks(1, 16), "model": "m", "instance_id": "3", "block_size": 4}),
    );
    assert_eq!(
        v,
        json!({"default": {"3": {"longest_matched": 16, "GPU": 0, "DP": {"0": 0}, "CPU": 0, "DISK": 16}}})
    );
}

/// By sequence hashes (conductor) and by local hashes (Dynamo) alike.
fn by_hashes(s: &Server) {
    let seed = block_seed(None, None);
    let mut seqs = Vec::new();
    let mut locals = Vec::new();
    let mut parent = None;
    for c in toks(1, 16).chunks(4) {
        let l = local_hash(c, seed);
        let q = chain(parent, l);
        locals.push(l.0);
        seqs.push(q.0);
        parent = Some(q);
    }
    let (_, v) = s.post_json("/query_by_hash", &json!({"seq_hashes": seqs, "model": "m"}));
    assert_eq!(v["default"]["3"]["DISK"], 16, "{v}");
    let hex: Vec<String> = seqs.iter().map(|h| format!("{h:#x}")).collect();
    let (_, v) = s.post_json("/query_by_hash", &json!({"block_hash": hex, "model": "m"}));
    assert_eq!(v["default"]["4"]["CPU"], 8, "{v}");
    let (_, v) = s.post_json(
        "/query_by_hash",
        &json!({"block_hashes": locals, "model_name": "m"}),
    );
    assert_eq!(v["scores"], json!({"1": {"1": 8}}));
}

/// LoRA namespaces: only the adapter's blocks match an adapter query. Tenants
/// named by events are separate indexes.
fn lora_and_tenants(s: &Server) {
    let (_, v) = s.post_json(
        "/query",
        &json!({"token_ids": toks(1, 16), "model_name": "m", "lora_name": "sql"}),
    );
    assert_eq!(v["scores"], json!({"2": {"0": 12}}), "{v}");
    let (st, v) = s.post_json(
        "/query",
        &json!({"token_ids": [1], "model": "m", "lora_name": "sql", "lora_id": 3}),
    );
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.post_json(
        "/query",
        &json!({"token_ids": [1], "model": "m", "block_size": 16}),
    );
    assert_eq!(st, 400, "{v}");

    let (_, v) = s.post_json(
        "/query",
        &json!({"token_ids": toks(1, 4), "model_name": "m", "tenant_id": "tenant-x"}),
    );
    assert_eq!(v["scores"], json!({"2": {"0": 4}}), "{v}");
}

/// The conductor spec's worked example: block size 2, dp2; H1 on GPU (dp0, dp1), CPU and DISK; H2 on GPU
/// (dp0) and CPU; H3 on DISK → longest_matched 6, GPU 4, DP {0: 4, 1: 2}, CPU 4, DISK 4.
#[test]
fn seed_001_worked_example_over_the_conductor_api() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut engine, mut store] = publishers(&ctx);
    let reg = |p: &Publisher, kind: &str| {
        let (st, v) = s.post_json(
            "/register",
            &json!({"endpoint": p.endpoint, "type": kind, "modelname": "deepseek", "tenant_id": "default",
                    "instance_id": "vllm-1", "block_size": 2, "dp_rank": 0}),
        );
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v,
            json!({"status": "registered successfully", "instance_id": "vllm-1"})
        );
        p.wait_subscriber();
    };
    reg(&engine, "vLLM");
    reg(&store, "Mooncake");
    engine.send(&fixture("conductor_gpu_dp0"));
    engine.send(&fixture("conductor_gpu_dp1"));
    engine.send(&fixture("conductor_cpu_dp0"));
    store.send(&fixture("conductor_disk_rfc"));
    let want = json!({"default": {"vllm-1": {
        "longest_matched": 6, "GPU": 4, "DP": {"0": 4, "1": 2}, "CPU": 4, "DISK": 4
    }}});
    s.wait_post_eq(
        "/query",
        &json!({"model": "deepseek", "token_ids": [101, 15, 100, 55, 89, 63], "block_size": 2}),
        &want,
    );
    let workers = s.get_json("/workers");
    assert_eq!(workers[0]["instance_id"], "vllm-1", "{workers}");
    assert_eq!(workers[0]["listeners"]["0"].as_array().unwrap().len(), 2);
    // The same registration again is refused.
    let (st, _) = s.post_json(
        "/register",
        &json!({"endpoint": engine.endpoint, "type": "vLLM", "modelname": "deepseek",
                "instance_id": "vllm-1", "block_size": 2, "dp_rank": 0}),
    );
    assert_eq!(st, 409);
    let (st, v) = s.post_json(
        "/unregister",
        &json!({"type": "vLLM", "modelname": "deepseek", "tenant_id": "default",
                "instance_id": "vllm-1", "block_size": 2, "dp_rank": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"status": "unregistered successfully", "removed_instances": ["vllm-1|default|0"]})
    );
}

/// One event: (tag, engine hashes, parent, token ids, medium).
type Ev<'a> = (&'a str, &'a [u64], Option<u64>, &'a [u32], &'a str);

/// vLLM positional `BlockStored` / `BlockRemoved` batch, as msgspec writes it.
fn vllm_batch(events: &[Ev<'_>]) -> Vec<u8> {
    use rmp::encode::*;
    let mut b = Vec::new();
    write_array_len(&mut b, 2).unwrap();
    write_f64(&mut b, 1.7e9).unwrap();
    write_array_len(&mut b, events.len() as u32).unwrap();
    for (tag, hashes, parent, tokens, medium) in events {
        let stored = *tag == "BlockStored";
        write_array_len(&mut b, if stored { 7 } else { 3 }).unwrap();
        write_str(&mut b, tag).unwrap();
        write_array_len(&mut b, hashes.len() as u32).unwrap();
        for h in *hashes {
            write_uint(&mut b, *h).unwrap();
        }
        if stored {
            match parent {
                Some(p) => write_uint(&mut b, *p).map(|_| ()).unwrap(),
                None => write_nil(&mut b).unwrap(),
            }
            write_array_len(&mut b, tokens.len() as u32).unwrap();
            for t in *tokens {
                write_uint(&mut b, *t as u64).unwrap();
            }
            write_uint(&mut b, 4).unwrap();
            write_nil(&mut b).unwrap();
        }
        write_str(&mut b, medium).unwrap();
    }
    b
}

/// llm-d's indexer docs' three pods: blocks B0..B4; pod A holds B0..B3, pod B holds B0, B1 (and B3 after
/// losing B2), pod C holds only B3, B4 → llm-d scores 4, 2, 0, normalized 1, 0.5, 0.
#[test]
fn seed_004_three_pods_llm_d_scoring() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let mut pods: Vec<Publisher> = (0..4).map(|_| Publisher::bind(&ctx)).collect();
    for (i, p) in pods.iter().enumerate() {
        register(&s, "m", 10 + i as u64, p);
    }
    let t = toks(1, 20);
    let all: Vec<u32> = t.clone();
    pods[0].send(&vllm_batch(&[(
        "BlockStored",
        &[1, 2, 3, 4],
        None,
        &all[..16],
        "GPU",
    )]));
    pods[1].send(&vllm_batch(&[
        ("BlockStored", &[1, 2, 3, 4], None, &all[..16], "GPU"),
        ("BlockRemoved", &[3], None, &[], "GPU"),
    ]));
    pods[2].send(&vllm_batch(&[
        ("BlockStored", &[1, 2, 3, 4, 5], None, &all, "GPU"),
        ("BlockRemoved", &[1, 2, 3], None, &[], "GPU"),
    ]));
    // A fourth pod holds B0, B1 on the host tier only: weight 0.8 each by default.
    pods[3].send(&vllm_batch(&[(
        "BlockStored",
        &[1, 2],
        None,
        &all[..8],
        "CPU",
    )]));
    let want = json!({
        "10": {"0": {"score": 4.0, "normalized": 1.0}},
        "11": {"0": {"score": 2.0, "normalized": 0.5}},
        "12": {"0": {"score": 0.0, "normalized": 0.0}},
        "13": {"0": {"score": 1.6, "normalized": 0.4}}
    });
    s.eventually("llm-d scores", || {
        let (_, v) = s.post_json(
            "/query",
            &json!({"token_ids": t, "model_name": "m", "scoring": "llm-d"}),
        );
        (v["llm_d"] == want).then_some(()).ok_or(v.to_string())
    });
    let (_, v) = s.post_json(
        "/query",
        &json!({"token_ids": t, "model_name": "m", "scoring": "llm-d"}),
    );
    assert_eq!(v["scores"], json!({"10": {"0": 16}, "11": {"0": 8}}), "{v}");
    // Configurable weights: the host tier counts fully.
    let (_, v) = s.post_json(
        "/query",
        &json!({"token_ids": t, "model_name": "m", "tier_weights": {"GPU": 1.0, "CPU": 1.0}}),
    );
    assert_eq!(v["llm_d"]["13"]["0"]["score"], 2.0, "{v}");
    let (st, v) = s.post_json(
        "/query",
        &json!({"token_ids": t, "model_name": "m", "tier_weights": {"CPU": 2.0}}),
    );
    assert_eq!(
        (st, v["field"].as_str()),
        (422, Some("tier_weights.CPU")),
        "{v}"
    );
}

#[test]
fn malformed_dialect_frames_are_skipped() {
    let s = Server::start(&["--threads", "1"]);
    let ctx = zmq::Context::new();
    let [mut p] = workers(&s, &ctx, "m");
    let bad_rfc = fixture_with("e2e_rfc_seq_disk", b"stored", b"storex");
    let mut bad_legacy = fixture("e2e_legacy_store");
    bad_legacy.truncate(bad_legacy.len() - 3);
    // A batch declaring 2^32-1 events with nothing behind it.
    let huge = [
        0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff,
    ];
    for f in [&bad_rfc[..], &bad_legacy[..], &huge[..]] {
        p.send(f);
    }
    p.send(&fixture("e2e_legacy_store"));
    let want: Value = json!({"longest_matched": 8, "GPU": 0, "DP": {"0": 0}, "CPU": 8, "DISK": 0});
    s.eventually("the good frame after the bad ones", || {
        let (_, v) = s.post_json("/query", &json!({"token_ids": toks(1, 8), "model": "m"}));
        (v["default"]["1"] == want)
            .then_some(())
            .ok_or(v.to_string())
    });
    assert_eq!(s.metric("kvix_malformed_frames_total", &[]), 3.0);
    // Counted each; logged once (a warning per 10 s, with the count left out).
    let log = s.stop();
    assert_eq!(log.matches("malformed frame skipped").count(), 1, "{log}");
}

/// Multimodal blocks: vLLM's `extra_keys` markers fold into the block hash as
/// Dynamo folds them, so a query naming the same image matches and one without
/// it stops before the image block. Both extra_keys forms (plain and pair) agree.
#[test]
fn multimodal_extra_keys_fold_into_block_hashes() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut a, mut b] = workers(&s, &ctx, "m");
    a.send(&fixture("e2e_vllm_mm"));
    b.send(&fixture("e2e_vllm_mm_pairs"));
    let image = json!({"token_ids": toks(1, 12), "model_name": "m",
                       "block_mm_hashes": [null, [0xdead_beef_u64], null]});
    s.wait_scores(&image, &json!({"1": {"0": 12}, "2": {"0": 12}}));
    let (_, v) = s.post_json(
        "/query",
        &json!({"token_ids": toks(1, 12), "model_name": "m"}),
    );
    assert_eq!(v["scores"], json!({"1": {"0": 4}, "2": {"0": 4}}), "{v}");
    // The reference implementation's local hashes for the same blocks.
    let vectors: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/dynamo_mm_vectors.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let locals = &vectors["cases"][0]["local_block_hashes"];
    let (_, v) = s.post_json(
        "/query_by_hash",
        &json!({"block_hashes": locals, "model_name": "m"}),
    );
    assert_eq!(v["scores"], json!({"1": {"0": 12}, "2": {"0": 12}}), "{v}");
}
