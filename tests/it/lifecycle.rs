//! The lifecycle and the control plane, black-box: control calls under an event flood,
//! replicas that answer only once recovered, replicas that adopt a peer's workers,
//! one export for `/dump` and snapshots, exact rollback of a failed registration.

use crate::support::{
    self, Publisher, Server, cleared_on, fixture, publishers, register, stored_on, worker_flags,
    workers,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const MODEL: &str = "m";

/// A fresh chain of `n` blocks (block size 4) starting at token `base`.
fn chain_batch(base: u32, first_hash: u64, n: usize) -> (Vec<u8>, Vec<u32>) {
    chain_batch_on(base, first_hash, n, None)
}

/// [`chain_batch`] stored on `medium` (`None`: the device).
fn chain_batch_on(
    base: u32,
    first_hash: u64,
    n: usize,
    medium: Option<&str>,
) -> (Vec<u8>, Vec<u32>) {
    let tokens: Vec<u32> = (0..n as u32 * 4).map(|i| base + i).collect();
    let hashes: Vec<u64> = (0..n as u64).map(|i| first_hash + i).collect();
    (stored_on(&hashes, None, &tokens, 4, medium), tokens)
}

/// Wait until `/query` with `q` scores `tokens` for `instance` (dp rank 0).
fn wait_scored(s: &Server, what: &str, q: &Value, instance: &str, tokens: u64) {
    s.eventually(what, || {
        let (_, v) = s.post_json("/query", q);
        (v["scores"][instance]["0"] == tokens)
            .then_some(())
            .ok_or(v.to_string())
    });
}

/// Flags that start kvix on two threads with `peer` as its one peer, waited for
/// `wait_ms`, then `extra`.
fn peer_flags<'a>(peer: &'a Server, wait_ms: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec![
        "--threads",
        "2",
        "--peers",
        &peer.base,
        "--peer-wait-ms",
        wait_ms,
    ];
    flags.extend_from_slice(extra);
    flags
}

/// Time one call; panic with the call's name if it took `limit` or more.
fn timed<T>(what: &str, limit: Duration, f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    assert!(took < limit, "{what} took {took:?} (limit {limit:?})");
    (r, took)
}

#[test]
fn control_calls_stay_fast_during_an_event_flood_with_tiny_rings() {
    let s = Server::start(&["--threads", "2", "--ring-capacity", "256"]);
    let ctx = zmq::Context::new();
    let [mut flood] = workers(&s, &ctx, MODEL);
    // Enough to keep a tiny ring full for a while, even in a debug build.
    let batches = 600usize;
    let payloads: Vec<(Vec<u8>, Vec<u32>)> = (0..batches)
        .map(|i| chain_batch(1_000_000 + i as u32 * 4096, (i as u64) << 20, 128))
        .collect();
    let last_prompt = payloads.last().unwrap().1.clone();
    let done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let done = done.clone();
        std::thread::spawn(move || {
            for (p, _) in &payloads {
                flood.send(p);
            }
            done.store(true, Ordering::Release);
            flood
        })
    };
    // Register, unregister, dump and query in a loop while the flood is applied.
    let limit = Duration::from_secs(2);
    let mut worst = Duration::ZERO;
    let mut rounds = 0;
    let other = Publisher::bind(&ctx);
    while !done.load(Ordering::Acquire) || rounds < 3 {
        let reg = json!({"instance_id": 2, "endpoint": other.endpoint, "model_name": MODEL, "block_size": 4});
        let ((st, v), t) = timed("/register", limit, || s.post_json("/register", &reg));
        assert_eq!(st, 201, "{v}");
        worst = worst.max(t);
        let unreg = json!({"instance_id": 2, "model_name": MODEL});
        let ((st, v), t) = timed("/unregister", limit, || s.post_json("/unregister", &unreg));
        assert_eq!(st, 200, "{v}");
        worst = worst.max(t);
        // A dump's size grows with the flood; what matters is that the other calls
        // are not held up by it.
        let ((st, _), t) = timed("/dump", Duration::from_secs(20), || {
            s.call("GET", "/dump", None)
        });
        assert_eq!(st, 200);
        eprintln!("dump {t:?}");
        let q = json!({"token_ids": last_prompt, "model_name": MODEL});
        let ((st, v), t) = timed("/query", limit, || s.post_json("/query", &q));
        assert_eq!(st, 200, "{v}");
        worst = worst.max(t);
        let ((st, _), _) = timed("/health", limit, || s.call("GET", "/health", None));
        assert_eq!(st, 200);
        rounds += 1;
    }
    let _flood = publisher.join().unwrap();
    // Nothing of the flood was lost: its last chain scores in full.
    let q = json!({"token_ids": last_prompt, "model_name": MODEL});
    s.eventually("the flood's last chain scores", || {
        let (_, v) = s.post_json("/query", &q);
        if v["scores"]["1"]["0"] == json!(last_prompt.len()) {
            Ok(())
        } else {
            Err(v.to_string())
        }
    });
    let stalls = s.metric("kvix_ring_full_stalls_total", &[]);
    eprintln!("{rounds} rounds of control calls, slowest {worst:?}, {stalls} ring-full stalls");
}

/// A server with one executor and workers 1 and 2 registered, each publishing on its
/// own socket.
fn two_workers(ctx: &zmq::Context) -> (Server, Publisher, Publisher) {
    let s = Server::start(&["--threads", "1"]);
    let (one, two) = (Publisher::bind(ctx), Publisher::bind(ctx));
    register(&s, MODEL, 1, &one);
    register(&s, MODEL, 2, &two);
    (s, one, two)
}

/// Chains per worker in [`load_both`], and blocks per chain.
const BATCHES: usize = 300;
const PER_BATCH: usize = 128;

/// The same [`BATCHES`] chains stored by both workers (each also on the host tier
/// when `host`): a large index. The last chain's tokens.
fn load_both(one: &mut Publisher, two: &mut Publisher, host: bool) -> Vec<u32> {
    let mut last = Vec::new();
    for i in 0..BATCHES {
        let (base, first) = (1_000_000 + i as u32 * 4096, (i as u64) << 20);
        let (device, tokens) = chain_batch(base, first, PER_BATCH);
        let on_host = host.then(|| chain_batch_on(base, first, PER_BATCH, Some("CPU")).0);
        for p in [&mut *one, &mut *two] {
            p.send(&device);
            if let Some(h) = &on_host {
                p.send(h);
            }
        }
        last = tokens;
    }
    last
}

/// A worker's `AllBlocksCleared` over a large index: while the executor drops its
/// blocks in steps, every answer is already the one after the clear (never a
/// partly cleared worker), the other worker keeps its blocks, and the worker's
/// stores right after the clear count again.
#[test]
fn a_cleared_worker_is_gone_from_every_answer_while_its_blocks_are_dropped() {
    let ctx = zmq::Context::new();
    let (s, mut one, mut two) = two_workers(&ctx);
    let last = load_both(&mut one, &mut two, false);
    let held = (BATCHES * PER_BATCH) as u64;
    let q = json!({"token_ids": last, "model_name": MODEL});
    wait_scored(
        &s,
        "worker 1 holds the last chain",
        &q,
        "1",
        last.len() as u64,
    );
    wait_scored(
        &s,
        "worker 2 holds the last chain",
        &q,
        "2",
        last.len() as u64,
    );

    one.send(&support::all_cleared());
    let mut seen = std::collections::BTreeSet::new();
    let mut check = |v: &Value, after: u64| {
        let size = v["tree_sizes"]["1"]["0"].as_u64().unwrap_or(0);
        seen.insert(size);
        assert!(
            [held, after].contains(&size),
            "worker 1 partly cleared: tree size {size} in {v}"
        );
        assert_eq!(v["scores"]["2"]["0"], json!(last.len()), "{v}");
        assert_eq!(v["tree_sizes"]["2"]["0"], json!(held), "{v}");
        assert_eq!(
            size == held,
            v["scores"]["1"]["0"] == json!(last.len()),
            "worker 1's score and tree size disagree: {v}"
        );
        size
    };
    s.eventually("worker 1 holds nothing", || {
        let (_, v) = s.post_json("/query", &q);
        (check(&v, 0) == 0).then_some(()).ok_or(v.to_string())
    });
    let (again, again_tokens) = chain_batch(7, 1 << 40, 4);
    one.send(&again);
    let qa = json!({"token_ids": again_tokens, "model_name": MODEL});
    s.eventually("worker 1 holds what it stored after the clear", || {
        let (_, va) = s.post_json("/query", &qa);
        (va["scores"]["1"]["0"] == json!(16) && va["tree_sizes"]["1"]["0"] == json!(4))
            .then_some(())
            .ok_or(va.to_string())
    });
    let (_, v) = s.post_json("/query", &q);
    check(&v, 4);
    eprintln!("worker 1 tree sizes seen: {seen:?}");
}

/// A worker's `AllBlocksCleared` of its host tier over a large index, its next host
/// store right behind it: while the executor walks the blocks in steps, every
/// answer already has the worker's host tier empty and its device tier whole (never
/// a partly cleared tier), the other worker keeps both, and the store (which waits
/// for the walk) counts once the walk is done.
#[test]
fn a_tier_clear_is_answered_as_done_while_its_blocks_are_walked() {
    let ctx = zmq::Context::new();
    let (s, mut one, mut two) = two_workers(&ctx);
    let last = load_both(&mut one, &mut two, true);
    let n = last.len() as u64;
    let q = json!({"token_ids": last, "model": MODEL, "block_size": 4});
    let tiers = |v: &Value, inst: &str| {
        let o = &v["default"][inst];
        (
            o["GPU"].as_u64().unwrap_or(0),
            o["CPU"].as_u64().unwrap_or(0),
        )
    };
    s.eventually("both workers hold the last chain on both tiers", || {
        let (_, v) = s.post_json("/conductor/query", &q);
        (tiers(&v, "1") == (n, n) && tiers(&v, "2") == (n, n))
            .then_some(())
            .ok_or(v.to_string())
    });

    let tokens: Vec<u32> = (7..11).collect();
    one.send(&cleared_on("CPU"));
    one.send(&stored_on(&[1 << 40], None, &tokens, 4, Some("CPU")));
    let qa = json!({"token_ids": tokens, "model": MODEL, "block_size": 4});
    let mut seen = std::collections::BTreeSet::new();
    s.eventually(
        "worker 1's host tier is empty but for its new block",
        || {
            let (_, v) = s.post_json("/conductor/query", &q);
            let (gpu, cpu) = tiers(&v, "1");
            seen.insert(cpu);
            assert!(
                [n, 0].contains(&cpu),
                "worker 1's host tier partly cleared: {v}"
            );
            assert_eq!(gpu, n, "worker 1's device tier changed: {v}");
            assert_eq!(tiers(&v, "2"), (n, n), "{v}");
            let (_, va) = s.post_json("/conductor/query", &qa);
            (cpu == 0 && tiers(&va, "1") == (0, 4))
                .then_some(())
                .ok_or(format!("{v} {va}"))
        },
    );
    let (_, v) = s.post_json("/conductor/query", &q);
    assert_eq!((tiers(&v, "1"), tiers(&v, "2")), ((n, 0), (n, n)), "{v}");
    eprintln!("worker 1 host tokens seen: {seen:?}");
}

/// A loaded peer A, and B started against it: B answers data routes only once
/// recovered, and then as A does.
#[test]
fn a_replica_answers_503_until_it_has_recovered() {
    let ctx = zmq::Context::new();
    let mut engine = Publisher::bind(&ctx);
    let workers = format!("1={}", engine.endpoint);
    let a = Server::start(&worker_flags(MODEL, &workers, &[]));
    engine.wait_subscriber();
    let (batch, prompt) = chain_batch(1, 100, 8);
    engine.send(&batch);
    let q = json!({"token_ids": prompt, "model_name": MODEL});
    wait_scored(&a, "A indexed the chain", &q, "1", 32);
    let want = a.post_json("/query", &q).1;

    let b = Server::start_recovering(&worker_flags(
        MODEL,
        &workers,
        &["--peers", &a.base, "--peer-wait-ms", "1500"],
    ));
    // Recovering: liveness yes, readiness no, data routes 503 with the phase.
    let (st, _) = b.call("GET", "/health", None);
    assert_eq!(st, 200);
    let (st, body) = b.call("GET", "/ready", None);
    assert_eq!((st, body.contains("recovering")), (503, true), "{body}");
    let (st, v) = b.post_json("/query", &q);
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["phase"], "recovering", "{v}");
    // A recovering node's dump is refused, so its own peers try the next one.
    let (st, _) = b.call("GET", "/dump", None);
    assert_eq!(st, 503);
    // Never an empty score: until Ready every answer is a 503.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, v) = b.post_json("/query", &q);
        match st {
            503 => {}
            200 => {
                assert_eq!(v, want, "first answer after recovery");
                break;
            }
            _ => panic!("{st} {v}"),
        }
        assert!(Instant::now() < deadline, "never ready; log:\n{}", b.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, body) = b.call("GET", "/ready", None);
    assert_eq!((st, body.contains("ready")), (200, true), "{body}");
}

#[test]
fn a_replica_given_only_peers_adopts_the_workers_and_stays_live() {
    let ctx = zmq::Context::new();
    let mut engine = Publisher::bind(&ctx);
    let a = Server::start(&["--threads", "2"]);
    register(&a, MODEL, 7, &engine);
    let (batch, prompt) = chain_batch(1, 100, 8);
    engine.send(&batch);
    let q = json!({"token_ids": prompt, "model_name": MODEL});
    wait_scored(&a, "A indexed the chain", &q, "7", 32);
    // B: nothing but the peer (no --workers, no --block-size).
    let b = Server::start(&peer_flags(&a, "300", &[]));
    engine.wait_subscriber();
    b.wait_log("recovery done");
    let workers: Value = b.get_json("/workers");
    assert_eq!(workers[0]["instance_id"], 7, "{workers}");
    assert_eq!(workers[0]["block_size"], 4, "{workers}");
    assert_eq!(
        workers[0]["endpoints"]["0"],
        json!(engine.endpoint),
        "{workers}"
    );
    let (st, v) = b.post_json("/query", &q);
    assert_eq!((st, &v["scores"]["7"]["0"]), (200, &json!(32)), "{v}");
    // Live after bootstrap: a new chain reaches B through its own subscription.
    let (batch, prompt) = chain_batch(5000, 900, 4);
    engine.send(&batch);
    let q = json!({"token_ids": prompt, "model_name": MODEL});
    wait_scored(
        &b,
        "B indexed a chain published after its bootstrap",
        &q,
        "7",
        16,
    );

    // With adoption off, B2 creates the index from the dump (no 404) but listens to
    // nobody, so it seeds nothing it could not keep true.
    let b2 = Server::start(&peer_flags(&a, "100", &["--adopt-workers", "false"]));
    b2.wait_log("recovery done");
    let (st, v) = b2.post_json("/query", &q);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["scores"], json!({}), "{v}");
    assert_eq!(b2.get_json("/workers"), json!([]));
}

#[test]
fn blocks_stored_by_sequence_hash_beside_engine_events_survive_peer_recovery() {
    let ctx = zmq::Context::new();
    let [mut engine, mut store] = publishers(&ctx);
    let a = Server::start(&["--threads", "2"]);
    for (p, kind) in [(&engine, "vLLM"), (&store, "Mooncake")] {
        a.post_ok(
            "/register",
            &json!({"endpoint": p.endpoint, "type": kind, "modelname": MODEL, "instance_id": "1",
                    "block_size": 4, "dp_rank": 0}),
        );
        p.wait_subscriber();
    }
    let (batch, prompt) = chain_batch(500, 100, 2);
    engine.send(&batch);
    // Standardized seq hashes on disk, no tokens: tokens 1..=16 (four blocks).
    store.send(&fixture("e2e_rfc_seq_disk"));
    let disk_q = json!({"token_ids": (1..=16).collect::<Vec<u32>>(), "model": MODEL});
    let engine_q = json!({"token_ids": prompt, "model": MODEL});
    let answers = |s: &Server| {
        (
            s.post_json("/query", &disk_q).1,
            s.post_json("/query", &engine_q).1,
        )
    };
    a.eventually("A indexed both publishers", || {
        let (d, e) = answers(&a);
        (d["default"]["1"]["DISK"] == 16 && e["default"]["1"]["GPU"] == 8)
            .then_some(())
            .ok_or(format!("{d} {e}"))
    });
    let b = Server::start(&peer_flags(&a, "100", &[]));
    b.wait_log("recovery done");
    assert_eq!(answers(&b), answers(&a));
}

#[test]
fn a_failed_register_undoes_only_itself() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let engine = Publisher::bind(&ctx);
    s.post_ok(
        "/register",
        &json!({"endpoint": engine.endpoint, "type": "vLLM", "modelname": MODEL, "instance_id": "1",
                "block_size": 4, "dp_rank": 0}),
    );
    // A second publisher kind for the same (instance, dp) whose socket cannot connect
    // (an ipc path longer than a socket address holds).
    let long = format!("ipc:///tmp/{}", "x".repeat(300));
    let (st, v) = s.post_json(
        "/register",
        &json!({"endpoint": long, "type": "Mooncake", "modelname": MODEL, "instance_id": "1",
                "block_size": 4, "dp_rank": 0}),
    );
    assert_eq!(st, 400, "{v}");
    let w = s.get_json("/workers");
    let listeners = &w[0]["listeners"]["0"];
    assert_eq!(listeners.as_array().map(Vec::len), Some(1), "{w}");
    assert_eq!(listeners[0]["endpoint"], json!(engine.endpoint), "{w}");
}

#[test]
fn event_data_cannot_grow_the_registry_past_its_caps() {
    let s = Server::start(&["--threads", "2", "--max-event-slots", "4"]);
    let ctx = zmq::Context::new();
    let [mut p] = workers(&s, &ctx, MODEL);
    // vLLM's batch envelope with a third element, the batch's dp rank.
    for dp in 1..=20u8 {
        let (mut batch, _) = chain_batch(100 * dp as u32, 1000 * dp as u64, 1);
        assert_eq!(batch[0], 0x92);
        batch[0] = 0x93;
        batch.push(dp);
        p.send(&batch);
    }
    s.eventually("refusals counted", || {
        let n = s.metric("kvix_event_refusals_total", &[]);
        (n >= 16.0).then_some(()).ok_or(n.to_string())
    });
    // The registered rank plus three ranks from the wire: four slots, no more.
    let (_, v) = s.post_json(
        "/query",
        &json!({"token_ids": [1, 2, 3, 4], "model_name": MODEL}),
    );
    let ranks = v["tree_sizes"]["1"].as_object().map(|m| m.len());
    assert_eq!(ranks, Some(4), "{v}");
    assert_eq!(
        s.log().matches("event data refused").count(),
        1,
        "logged once per interval"
    );
}

/// Figures for the README: what a million-block `/dump` costs concurrent queries and
/// memory. Run against a release build:
/// `cargo build --release && KVIX_TEST_BIN=target/release/kvix cargo test --test it lifecycle:: -- --ignored --nocapture`
/// (`KVIX_DUMP_CHAINS` of 100 blocks, default 10,000; `KVIX_DUMP_THREADS`, default 2).
#[test]
#[ignore]
fn million_block_dump_under_queries() {
    let ctx = zmq::Context::new();
    let mut p = Publisher::bind(&ctx);
    let threads = support::env_u64("KVIX_DUMP_THREADS", 2).to_string();
    let s = Server::start(&["--threads", &threads]);
    register(&s, MODEL, 1, &p);
    let chains = support::env_u64("KVIX_DUMP_CHAINS", 10_000);
    const LEN: usize = 100;
    let mut prompt = Vec::new();
    for c in 0..chains {
        let (batch, tokens) = chain_batch((c as u32) << 12, c << 20, LEN);
        p.send(&batch);
        if c == 0 {
            prompt = tokens;
        }
    }
    let want = (chains as usize * LEN) as f64;
    s.eventually("a million blocks applied", || {
        let n = s.metric("kvix_shard_blocks", &[]);
        (n >= want).then_some(()).ok_or(n.to_string())
    });
    let q = json!({"token_ids": prompt, "model_name": MODEL});
    let stop = Arc::new(AtomicBool::new(false));
    let dumping = Arc::new(AtomicBool::new(false));
    let querier = {
        let (stop, dumping, base) = (stop.clone(), dumping.clone(), s.base.clone());
        let body = q.to_string();
        std::thread::spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
            let (mut before, mut during) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Acquire) {
                let t = Instant::now();
                let r = agent
                    .post(format!("{base}/query"))
                    .header("Content-Type", "application/json")
                    .send(&body);
                assert!(r.is_ok());
                let us = t.elapsed().as_micros() as u64;
                if dumping.load(Ordering::Acquire) {
                    during.push(us);
                } else {
                    before.push(us);
                }
            }
            (before, during)
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let rss0 = support::rss_mib(s.pid());
    dumping.store(true, Ordering::Release);
    let t = Instant::now();
    let sampler = {
        let (pid, dumping) = (s.pid(), dumping.clone());
        std::thread::spawn(move || {
            let mut peak = 0f64;
            while dumping.load(Ordering::Acquire) {
                peak = peak.max(support::rss_mib(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let (st, body) = s.call("GET", "/dump", None);
    let took = t.elapsed();
    dumping.store(false, Ordering::Release);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    let peak = sampler.join().unwrap();
    let (mut before, mut during) = querier.join().unwrap();
    assert_eq!(st, 200);
    before.sort_unstable();
    during.sort_unstable();
    let pct = |v: &[u64], p: f64| {
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    eprintln!(
        "DUMP: {} bytes in {took:?}; RSS {rss0:.0} MiB before, peak {peak:.0} MiB during\n\
         queries before: n={} p50={}us p99={}us max={}us\n\
         queries during: n={} p50={}us p99={}us max={}us",
        body.len(),
        before.len(),
        pct(&before, 0.5),
        pct(&before, 0.99),
        before.last().unwrap_or(&0),
        during.len(),
        pct(&during, 0.5),
        pct(&during, 0.99),
        during.last().unwrap_or(&0),
    );
}

/// What a burst of events grew (block tables, engine-hash maps, libzmq's frames) goes
/// back to the OS once the worker is unregistered and the indexer is idle: freed
/// memory is held only briefly, to be reused while a burst lasts.
#[test]
fn memory_a_burst_grew_goes_back_once_idle() {
    let s = Server::start(&["--threads", "1"]);
    let ctx = zmq::Context::new();
    let [mut p] = workers(&s, &ctx, MODEL);
    let rss0 = support::rss_mib(s.pid());
    // 400k blocks in chains of 100.
    let (chains, n) = (4_000u64, 100usize);
    for c in 0..chains {
        let (batch, _) = chain_batch((c as u32) << 12, c << 16, n);
        p.send(&batch);
    }
    let want = (chains as usize * n) as f64;
    s.eventually("every block applied", || {
        let b = s.metric("kvix_shard_blocks", &[]);
        (b == want).then_some(()).ok_or(format!("{b} of {want}"))
    });
    let grown = support::rss_mib(s.pid()) - rss0;
    // 400k blocks take about 16 MiB of nodes and engine names (less in a release
    // build): enough growth that a quarter of it left over is a real finding.
    assert!(grown > 10.0, "the index grew only {grown:.1} MiB");
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 1, "model_name": MODEL}),
    );
    s.eventually("memory returned", || {
        let left = support::rss_mib(s.pid()) - rss0;
        (left < grown / 4.0)
            .then_some(())
            .ok_or(format!("{left:.1} of {grown:.1} MiB still held"))
    });
}
