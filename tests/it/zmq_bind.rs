//! llm-d's centralized delivery over real ZMQ: kvix binds one SUB socket
//! (`--zmq-bind`), engines' publishers connect to it and name themselves in the
//! topic `kv@<pod>@<model>`. Pods appear on their first message and are workers
//! named by their pod identity everywhere.

use crate::support::{self, Server, stored};
use serde_json::{Value, json};

/// An engine's publisher that connects to kvix's bound socket (an XPUB, so the test
/// sees kvix's subscription arrive instead of sleeping through the slow joiner).
struct Pod {
    sock: zmq::Socket,
    topic: String,
    /// Next sequence number per dp rank: each rank is a stream of its own.
    next: [u64; 2],
}

impl Pod {
    fn connect(ctx: &zmq::Context, endpoint: &str, topic: &str) -> Pod {
        let sock = ctx.socket(zmq::XPUB).unwrap();
        sock.set_xpub_verbose(true).unwrap();
        sock.set_linger(0).unwrap();
        sock.set_rcvtimeo(10_000).unwrap();
        sock.connect(endpoint).unwrap();
        let msg = sock.recv_bytes(0).expect("kvix subscribed within 10 s");
        assert_eq!(msg.first(), Some(&1u8), "a subscribe message");
        Pod {
            sock,
            topic: topic.to_string(),
            next: [0; 2],
        }
    }

    /// Publish `batch` as dp rank `dp`'s next frame.
    fn send(&mut self, dp: u64, batch: &[u8]) {
        let seq = self.next[dp as usize];
        self.next[dp as usize] += 1;
        self.send_seq(seq, dp, batch);
    }

    fn send_seq(&self, seq: u64, dp: u64, batch: &[u8]) {
        let batch = with_dp(batch, dp);
        self.sock
            .send_multipart([self.topic.as_bytes(), &seq.to_be_bytes(), &batch], 0)
            .unwrap();
    }
}

/// A positional `[ts, events]` batch as `[ts, events, dp_rank]`.
fn with_dp(batch: &[u8], dp: u64) -> Vec<u8> {
    assert_eq!(batch[0], 0x92, "a two-element batch");
    let mut b = batch.to_vec();
    b[0] = 0x93;
    rmp::encode::write_uint(&mut b, dp).unwrap();
    b
}

fn query(model: &str, tokens: &[u32]) -> Value {
    json!({"model_name": model, "token_ids": tokens})
}

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";
const M1: &str = "llama";
/// A model name holding `@`: everything after the topic's second `@`.
const M2: &str = "org/mistral@v2";

/// `--zmq-bind`'s value: a port the system chooses when kvix binds.
const ANY_PORT: &str = "tcp://127.0.0.1:0";

/// kvix bound to a port of the system's choosing with block size 4 on `threads`
/// executors, `extra` flags after, and the endpoint it is bound to.
fn bound(threads: &str, extra: &[&str]) -> (Server, String) {
    let mut flags = vec![
        "--threads",
        threads,
        "--block-size",
        "4",
        "--zmq-bind",
        ANY_PORT,
    ];
    flags.extend_from_slice(extra);
    let s = Server::start(&flags);
    let endpoint = s.zmq_bind_endpoint();
    (s, endpoint)
}

#[test]
fn pods_publish_to_one_bound_socket() {
    let (s, endpoint) = bound("2", &[]);
    let ctx = zmq::Context::new();
    let mut a = Pod::connect(&ctx, &endpoint, &format!("kv@{A}@{M1}"));
    let mut b = Pod::connect(&ctx, &endpoint, &format!("kv@{B}@{M1}"));
    let mut c = Pod::connect(&ctx, &endpoint, &format!("kv@{C}@{M2}"));

    // Pod A: dp rank 0 holds two blocks, rank 1 one (each rank numbers its own frames).
    a.send(0, &stored(&[11], None, &[1, 2, 3, 4], 4));
    a.send(1, &stored(&[21], None, &[1, 2, 3, 4], 4));
    a.send(0, &stored(&[12], Some(11), &[5, 6, 7, 8], 4));
    b.send(0, &stored(&[31], None, &[1, 2, 3, 4], 4));
    c.send(0, &stored(&[41, 42], None, &[1, 2, 3, 4, 5, 6, 7, 8], 4));

    let prompt = [1, 2, 3, 4, 5, 6, 7, 8];
    s.wait_scores(
        &query(M1, &prompt),
        &json!({A: {"0": 8, "1": 4}, B: {"0": 4}}),
    );
    // Models stay apart: the same tokens on the other model's pod.
    s.wait_scores(&query(M2, &prompt), &json!({C: {"0": 8}}));

    // /workers lists the pods by identity, at the bound endpoint (as --zmq-bind names
    // it), per dp rank.
    let workers = s.get_json("/workers");
    let mut listed: Vec<(String, String, Vec<String>)> = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let eps = w["endpoints"].as_object().unwrap();
            assert!(eps.values().all(|e| e == ANY_PORT), "{w}");
            let listeners = w["listeners"]["0"].as_array().unwrap();
            assert_eq!(listeners[0]["type"], "llm-d", "{w}");
            (
                w["instance_id"].as_str().unwrap().to_string(),
                w["model_name"].as_str().unwrap().to_string(),
                eps.keys().cloned().collect(),
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            (A.into(), M1.into(), vec!["0".into(), "1".into()]),
            (B.into(), M1.into(), vec!["0".into()]),
            (C.into(), M2.into(), vec!["0".into()]),
        ]
    );
    // /dump names them too.
    let dump = s.get_json("/dump");
    let holders = |key: &str| -> Vec<(Value, Value)> {
        let mut v: Vec<(Value, Value)> = dump[key]["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["worker_id"].clone(), e["event"]["dp_rank"].clone()))
            .collect();
        v.sort_by_key(|x| x.0.to_string() + &x.1.to_string());
        v.dedup();
        v
    };
    assert_eq!(
        holders(&format!("{M1}:default")),
        vec![
            (json!(A), json!(0)),
            (json!(A), json!(1)),
            (json!(B), json!(0))
        ],
        "{dump}"
    );
    assert_eq!(
        holders(&format!("{M2}:default")),
        vec![(json!(C), json!(0))]
    );
    assert_eq!(
        s.metric(
            "kvix_listener_last_sequence",
            &[("instance", A), ("dp", "0")]
        ),
        1.0
    );
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 0.0);

    // A malformed topic is counted and skipped; the pods go on.
    b.sock
        .send_multipart([&b"kv@no-model"[..], &7u64.to_be_bytes(), b"\xc0"], 0)
        .unwrap();
    // A gap on pod B's stream: its frame 1 never arrives.
    b.send_seq(2, 0, &stored(&[32], Some(31), &[5, 6, 7, 8], 4));
    // Pod A's ranks keep numbering their own frames: no gap there.
    a.send(1, &stored(&[22], Some(21), &[5, 6, 7, 8], 4));
    s.wait_scores(
        &query(M1, &prompt),
        &json!({A: {"0": 8, "1": 8}, B: {"0": 8}}),
    );
    assert_eq!(s.metric("kvix_malformed_topics_total", &[]), 1.0);
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 1.0);
    assert_eq!(s.metric("kvix_sequence_gap_batches_total", &[]), 1.0);
    assert_eq!(s.metric("kvix_replay_requests_total", &[]), 0.0);

    // Unregistering one pod removes its blocks and leaves the others'.
    s.post_ok("/unregister", &json!({"instance_id": B, "model_name": M1}));
    s.wait_scores(&query(M1, &prompt), &json!({A: {"0": 8, "1": 8}}));
    s.wait_scores(&query(M2, &prompt), &json!({C: {"0": 8}}));
    // ... until it publishes again: a pod appears on its next message.
    b.send_seq(3, 0, &stored(&[33], None, &[9, 9, 9, 9], 4));
    s.wait_scores(&query(M1, &[9, 9, 9, 9]), &json!({B: {"0": 4}}));
    let log = s.stop();
    assert!(log.contains("topic is not kv@<pod>@<model>"), "{log}");
}

#[test]
fn zmq_bind_needs_a_block_size_and_a_free_endpoint() {
    let out = std::process::Command::new(support::kvix_bin())
        .args(["--port", "0", "--zmq-bind", "tcp://127.0.0.1:5999"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--block-size is required when --zmq-bind"),
        "{err}"
    );

    let (_first, endpoint) = bound("1", &[]);
    let out = std::process::Command::new(support::kvix_bin())
        .args(["--port", "0", "--block-size", "4", "--zmq-bind", &endpoint])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot bind {endpoint}")), "{err}");
}

/// One pod publishing far faster than kvix applies does not cost another pod on
/// the same socket its frames: each publisher has a pipe of its own, bounded by
/// `--zmq-rcvhwm`, and the socket takes from the pipes in turn.
#[test]
fn a_flooding_pod_loses_only_its_own_frames() {
    let (s, endpoint) = bound("1", &["--zmq-rcvhwm", "16"]);
    let ctx = zmq::Context::new();
    let mut flood = Pod::connect(&ctx, &endpoint, &format!("kv@{A}@{M1}"));
    flood.sock.set_sndhwm(16).unwrap();
    let mut quiet = Pod::connect(&ctx, &endpoint, &format!("kv@{B}@{M1}"));
    const FLOOD: u32 = 20_000;
    for i in 0..FLOOD {
        let t = 1000 + 4 * i;
        flood.send(
            0,
            &stored(&[i as u64 + 1], None, &[t, t + 1, t + 2, t + 3], 4),
        );
        if i == FLOOD / 2 {
            quiet.send(0, &stored(&[7], None, &[1, 2, 3, 4], 4));
        }
    }
    quiet.send(0, &stored(&[8], Some(7), &[5, 6, 7, 8], 4));
    // Both of the quiet pod's frames, one sent amid the flood, one after it.
    s.wait_scores(&query(M1, &[1, 2, 3, 4, 5, 6, 7, 8]), &json!({B: {"0": 8}}));
    assert_eq!(
        s.metric(
            "kvix_listener_last_sequence",
            &[("instance", B), ("dp", "0")]
        ),
        1.0
    );
    // The flood outran its 16-frame pipes: what it lost shows as its own gaps.
    assert!(s.metric("kvix_sequence_gaps_total", &[]) > 0.0);
    let log = s.stop();
    assert!(
        !log.lines()
            .any(|l| l.contains("sequence gap") && l.contains(B)),
        "the quiet pod lost nothing:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("sequence gap") && l.contains(A)),
        "{log}"
    );
}

/// A restart from a snapshot does not take pods over (there is nothing to connect
/// to); a pod comes back with its next message.
#[test]
fn pods_come_back_after_a_restart_with_their_next_message() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("kvix.snap");
    let flags = [
        "--threads",
        "1",
        "--block-size",
        "4",
        "--zmq-bind",
        ANY_PORT,
        "--snapshot-path",
        snap.to_str().unwrap(),
        "--snapshot-interval",
        "0",
    ];
    let s = Server::start(&flags);
    let ctx = zmq::Context::new();
    let mut a = Pod::connect(&ctx, &s.zmq_bind_endpoint(), &format!("kv@{A}@{M1}"));
    a.send(0, &stored(&[11], None, &[1, 2, 3, 4], 4));
    s.wait_scores(&query(M1, &[1, 2, 3, 4]), &json!({A: {"0": 4}}));
    let (code, log) = s.terminate();
    assert_eq!(code, Some(0), "{log}");
    drop(a);

    let s = Server::start(&flags);
    assert_eq!(s.get_json("/workers"), json!([]));
    let mut a = Pod::connect(&ctx, &s.zmq_bind_endpoint(), &format!("kv@{A}@{M1}"));
    a.send(0, &stored(&[12], None, &[5, 6, 7, 8], 4));
    s.wait_scores(&query(M1, &[5, 6, 7, 8]), &json!({A: {"0": 4}}));
    let log = s.stop();
    assert!(!log.contains("cannot connect"), "{log}");
}

/// A pod's stream follows the listeners' rule: `u64::MAX` then 0, 1, 2 is one
/// restart and all four batches are indexed; a jump back to `u64::MAX` is a gap
/// whose count stops at the top instead of wrapping.
#[test]
fn a_pods_sequence_that_goes_back_is_a_restart() {
    let (s, endpoint) = bound("2", &[]);
    let ctx = zmq::Context::new();
    let a = Pod::connect(&ctx, &endpoint, &format!("kv@{A}@{M1}"));
    for (i, seq) in [u64::MAX, 0, 1, 2].into_iter().enumerate() {
        let t = 100 + 4 * i as u32;
        a.send_seq(seq, 0, &stored(&[i as u64 + 1], None, &[t, t, t, t], 4));
    }
    for i in 0..4u32 {
        let t = 100 + 4 * i;
        s.wait_scores(&query(M1, &[t, t, t, t]), &json!({A: {"0": 4}}));
    }
    assert_eq!(s.metric("kvix_sequence_restarts_total", &[]), 1.0);
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 0.0);
    for seq in [u64::MAX, 0, u64::MAX] {
        a.send_seq(seq, 0, &stored(&[50], None, &[9, 9, 9, 9], 4));
    }
    s.eventually("gaps counted", || {
        let n = s.metric("kvix_sequence_gaps_total", &[]);
        (n == 2.0).then_some(()).ok_or(format!("{n}"))
    });
    assert_eq!(
        s.metric("kvix_sequence_gap_batches_total", &[]),
        u64::MAX as f64
    );
    assert_eq!(s.metric("kvix_sequence_restarts_total", &[]), 2.0);
}

/// A topic is bounded at the door: 40 pods named by 1 MB each, and a topic carrying
/// a newline, a fake `ERROR` line and a terminal escape, are malformed topics,
/// counted and skipped. Nothing of them is kept (RSS, `/workers`), and the log shows
/// one escaped line for them all.
#[test]
fn huge_or_forged_topics_are_skipped_and_never_kept() {
    let (s, endpoint) = bound("2", &[]);
    let ctx = zmq::Context::new();
    let mut ok = Pod::connect(&ctx, &endpoint, &format!("kv@{A}@{M1}"));
    ok.send(0, &stored(&[1], None, &[1, 2, 3, 4], 4));
    s.wait_scores(&query(M1, &[1, 2, 3, 4]), &json!({A: {"0": 4}}));
    let rss0 = support::rss_mib(s.pid());
    let mut bad: Vec<String> = (0..40)
        .map(|i| format!("kv@{}{i}@{M1}", "p".repeat(1 << 20)))
        .collect();
    bad.push(format!("kv@{}@{M1}", "p".repeat(257)));
    bad.push(format!("kv@pod\nERROR forged by a publisher\u{1b}[2J@{M1}"));
    for topic in &bad {
        let batch = with_dp(&stored(&[2], None, &[5, 6, 7, 8], 4), 0);
        ok.sock
            .send_multipart([topic.as_bytes(), &0u64.to_be_bytes(), &batch], 0)
            .unwrap();
    }
    s.eventually("every bad topic counted", || {
        let n = s.metric("kvix_malformed_topics_total", &[]);
        (n == bad.len() as f64).then_some(()).ok_or(format!("{n}"))
    });
    // The pod with a good name goes on.
    ok.send(0, &stored(&[3], Some(1), &[9, 9, 9, 9], 4));
    s.wait_scores(&query(M1, &[1, 2, 3, 4, 9, 9, 9, 9]), &json!({A: {"0": 8}}));
    let grown = support::rss_mib(s.pid()) - rss0;
    assert!(grown < 100.0, "RSS grew {grown:.0} MiB");
    let (_, workers) = s.call("GET", "/workers", None);
    assert!(
        workers.len() < 1 << 20,
        "/workers is {} bytes",
        workers.len()
    );
    assert!(!workers.contains("ppp"), "{workers}");
    let log = s.log();
    assert!(
        !log.lines().any(|l| l.starts_with("ERROR forged")) && !log.contains('\u{1b}'),
        "{log}"
    );
    assert_eq!(
        log.matches("topic is not kv@<pod>@<model>").count(),
        1,
        "{log}"
    );
}

#[test]
fn ten_thousand_pods_on_one_bound_socket_are_all_listed_and_scored() {
    // `KVIX_PODS=1000` for the larger fleet in BENCHMARKS.md.
    const MODELS: usize = 20;
    let pods = support::env_u64("KVIX_PODS", 500) as usize;
    let (s, endpoint) = bound("2", &["--max-event-slots", "100000"]);
    let ctx = zmq::Context::new();
    // One connection may carry many pods: the topic names the pod. Unbounded, so
    // that the burst below is not dropped at the sender.
    let p = ctx.socket(zmq::XPUB).unwrap();
    p.set_sndhwm(0).unwrap();
    p.set_linger(0).unwrap();
    p.set_rcvtimeo(10_000).unwrap();
    p.connect(&endpoint).unwrap();
    assert_eq!(
        p.recv_bytes(0).unwrap().first(),
        Some(&1u8),
        "kvix subscribed"
    );
    let t0 = std::time::Instant::now();
    for m in 0..MODELS {
        for pod in 0..pods {
            let topic = format!("kv@pod-{pod}@model-{m}");
            let batch = with_dp(
                &stored(
                    &[7, pod as u64 + 100],
                    None,
                    &[1, 2, 3, 4, 5, 6, 7, pod as u32],
                    4,
                ),
                0,
            );
            p.send_multipart([topic.as_bytes(), &0u64.to_be_bytes(), &batch], 0)
                .unwrap();
        }
    }
    let last = format!("/workers?model_name=model-{}", MODELS - 1);
    s.eventually("the last model's pods listed", || {
        let n = s.get_json(&last).as_array().map_or(0, |w| w.len());
        (n == pods).then_some(()).ok_or(format!("{n} listed"))
    });
    eprintln!("{} pods listed after {:?}", MODELS * pods, t0.elapsed());
    let t = std::time::Instant::now();
    let workers = s.get_json("/workers");
    eprintln!(
        "/workers: {:?}, {} bytes",
        t.elapsed(),
        workers.to_string().len()
    );
    assert_eq!(workers.as_array().map(|w| w.len()), Some(MODELS * pods));
    let t = std::time::Instant::now();
    let dump = s.get_json("/dump");
    eprintln!("/dump: {:?}", t.elapsed());
    assert!(dump.to_string().contains(&format!("pod-{}", pods - 1)));
    // Every pod of every model holds the shared first block.
    for m in [0, MODELS - 1] {
        let v = s.post_ok("/query", &query(&format!("model-{m}"), &[1, 2, 3, 4]));
        let scores = v["scores"].as_object().unwrap();
        assert_eq!(scores.len(), pods, "model-{m}");
        assert!(scores.values().all(|d| d["0"] == 4), "{v}");
    }
}
