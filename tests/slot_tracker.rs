//! The slot tracker (`--slot-tracker-port`) against Dynamo's: one scripted call
//! sequence (registration with dp ranges, adds sharing prefixes, prefill
//! completions, frees, unknown and duplicate requests, unregistration, malformed
//! bodies) must get Dynamo 1.6.1's answers, status and JSON alike.
//!
//! Dynamo's answers are recorded in `tests/data/dynamo_slot_tracker.json`, made by
//! running this script against `dynamo-slot-tracker` (scripts/dynamo_peer: the
//! published crate's own server). With `DYNAMO_SLOT_TRACKER=<that binary>` the
//! script also runs against it live and both are compared call by call;
//! `DYNAMO_SLOT_TRACKER_RECORD=<file>` then writes the recording.

mod common;

use common::{Engine, Server, agent, free_port, metric_in, reply};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One call of the script: method, path, content type (none: no header), body.
type Call = (&'static str, String, Option<&'static str>, String);

const JSON: Option<&str> = Some("application/json");

fn post(path: &str, body: Value) -> Call {
    ("POST", path.to_string(), JSON, body.to_string())
}

fn raw(path: &str, ct: Option<&'static str>, body: &str) -> Call {
    ("POST", path.to_string(), ct, body.to_string())
}

fn get(path: &str) -> Call {
    ("GET", path.to_string(), None, String::new())
}

fn reg(worker: u64, group: Option<&str>, bs: u32, start: u64, size: u64) -> Call {
    let mut b = json!({"worker_id": worker, "model_name": "m", "block_size": bs, "dp_start": start, "dp_size": size});
    if let Some(g) = group {
        b["routing_group"] = json!(g);
    }
    post("/register", b)
}

fn add(id: &str, worker: u64, rank: u32, hashes: Value, isl: Option<u64>) -> Call {
    let mut b = json!({"model_name": "m", "request_id": id, "worker_id": worker, "dp_rank": rank, "sequence_hashes": hashes});
    if let Some(n) = isl {
        b["new_isl_tokens"] = json!(n);
    }
    post("/add", b)
}

fn life(path: &str, id: &str) -> Call {
    post(path, json!({"model_name": "m", "request_id": id}))
}

fn potential(hashes: Value, isl: Option<u64>) -> Call {
    let mut b = json!({"model_name": "m", "sequence_hashes": hashes});
    if let Some(n) = isl {
        b["new_isl_tokens"] = json!(n);
    }
    post("/potential_loads", b)
}

fn unreg(worker: u64, group: Option<&str>) -> Call {
    let mut b = json!({"worker_id": worker, "model_name": "m"});
    if let Some(g) = group {
        b["routing_group"] = json!(g);
    }
    post("/unregister", b)
}

fn script() -> Vec<Call> {
    vec![
        get("/health"),
        get("/workers"),
        get("/loads"),
        // No tracker yet.
        add("r1", 1, 0, json!([1]), Some(4)),
        life("/free", "r1"),
        life("/prefill_complete", "r1"),
        potential(json!([1]), None),
        unreg(1, None),
        // Registration and its checks.
        reg(1, None, 16, 0, 2),
        reg(2, Some("default"), 16, 4, 1),
        reg(1, None, 16, 2, 1),
        reg(3, None, 32, 0, 1),
        reg(3, None, 0, 0, 1),
        reg(3, None, 16, 0, 0),
        reg(3, None, 16, 0, 5000),
        reg(3, None, 16, 4294967295, 1),
        reg(1, Some("g2"), 32, 0, 1),
        get("/workers"),
        get("/workers?model_name=m&routing_group=g2"),
        get("/workers?model_name=other"),
        get("/loads"),
        // Adds that share prefixes, on two ranks of one worker and on another.
        add("r1", 1, 0, json!([1, 2, 3]), Some(48)),
        add("r2", 1, 0, json!([1, 2, 4, 5]), Some(64)),
        add("r3", 1, 1, json!([1, 2, 3]), None),
        add("r3b", 1, 1, json!([1, 2, 3]), Some(0)),
        add("r1", 2, 4, json!([9]), Some(8)),
        add("r1", 1, 0, json!([1, 2, 3]), Some(48)),
        add("r4", 1, 2, json!([1]), Some(8)),
        add("r5", 9, 0, json!([1]), Some(8)),
        add("r6", 2, 4, json!([-1, -2]), Some(16)),
        add("r7", 2, 4, json!([]), Some(16)),
        add("r8", 2, 4, json!([u64::MAX]), Some(16)),
        get("/loads"),
        get("/loads?routing_group=default"),
        get("/loads?model_name=m&routing_group=g2"),
        potential(json!([1, 2, 3, 7]), Some(10)),
        potential(json!([]), None),
        potential(json!([-1, -2, -3]), Some(1)),
        // Prefill completions and frees, known, repeated and unknown.
        life("/prefill_complete", "r1"),
        life("/prefill_complete", "r1"),
        life("/prefill_complete", "nobody"),
        get("/loads"),
        life("/free", "r1"),
        life("/free", "r1"),
        life("/free", "nobody"),
        get("/loads"),
        potential(json!([1, 2, 4, 5]), Some(3)),
        life("/prefill_complete", "r1"),
        add("r1", 1, 0, json!([1, 2]), Some(5)),
        get("/loads"),
        // Unregistering drops the worker's requests.
        unreg(2, None),
        unreg(2, None),
        unreg(1, Some("nowhere")),
        add("r6", 1, 0, json!([8]), Some(2)),
        get("/workers"),
        get("/loads"),
        // Bodies it cannot take.
        raw("/add", JSON, "{"),
        raw("/add", JSON, ""),
        raw("/add", JSON, "{}"),
        raw("/add", JSON, "[]"),
        raw(
            "/add",
            JSON,
            r#"{"model_name":"m","request_id":"x","worker_id":"one","dp_rank":0,"sequence_hashes":[]}"#,
        ),
        raw(
            "/add",
            JSON,
            r#"{"model_name":"m","request_id":"x","worker_id":1,"dp_rank":0,"sequence_hashes":"abc"}"#,
        ),
        raw(
            "/add",
            JSON,
            r#"{"model_name":"m","request_id":"x","worker_id":1,"dp_rank":0,"sequence_hashes":[1.5]}"#,
        ),
        raw(
            "/add",
            JSON,
            r#"{"model_name":"m","request_id":"x","worker_id":1,"dp_rank":-1,"sequence_hashes":[]}"#,
        ),
        raw(
            "/register",
            None,
            r#"{"worker_id":5,"model_name":"m","block_size":16,"dp_start":0,"dp_size":1}"#,
        ),
        raw(
            "/register",
            Some("text/plain"),
            r#"{"worker_id":5,"model_name":"m","block_size":16,"dp_start":0,"dp_size":1}"#,
        ),
        raw(
            "/register",
            Some("application/json; charset=utf-8"),
            r#"{"worker_id":5,"model_name":"m","block_size":16,"dp_start":0,"dp_size":1} trailing"#,
        ),
        raw(
            "/potential_loads",
            JSON,
            r#"{"model_name":"m","sequence_hashes":[1],"new_isl_tokens":-1}"#,
        ),
        raw("/free", JSON, r#"{"model_name":"m"}"#),
        get("/register"),
        get("/nope"),
        raw("/nope", JSON, "{}"),
        raw("/health", JSON, "{}"),
        // The last worker of a tracker takes it along.
        unreg(1, None),
        unreg(5, None),
        get("/workers"),
        add("r9", 1, 0, json!([1]), Some(1)),
        reg(1, None, 64, 0, 1),
        get("/loads"),
    ]
}

/// `(status, body)`: the body as JSON when it is JSON; `/potential_loads` lists
/// sorted by (worker, rank) (Dynamo lists them in hash-map order).
fn run(base: &str, calls: &[Call]) -> Vec<Value> {
    let a = agent(Some(Duration::from_secs(10)));
    calls
        .iter()
        .map(|(method, path, ct, body)| {
            let url = format!("{base}{path}");
            let resp = if *method == "GET" {
                a.get(&url).call()
            } else {
                let mut r = a.post(&url);
                if let Some(ct) = ct {
                    r = r.header("Content-Type", *ct);
                }
                r.send(body.as_bytes())
            };
            let (status, text) = reply(resp.unwrap_or_else(|e| panic!("{method} {path}: {e}")));
            let mut v = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if path == "/potential_loads"
                && let Value::Array(items) = &mut v
            {
                items.sort_by_key(|l| (l["worker_id"].as_u64(), l["dp_rank"].as_u64()));
            }
            json!({"call": format!("{method} {path} {body}"), "status": status, "body": v})
        })
        .collect()
}

/// Dynamo's slot tracker, started from the binary `bin`; killed on drop.
struct Dynamo {
    child: Child,
    base: String,
}

impl Dynamo {
    fn start(bin: &str) -> Dynamo {
        Self::start_with(bin, &[])
    }

    fn start_with(bin: &str, extra: &[&str]) -> Dynamo {
        let port = free_port();
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--runtime-threads", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let d = Dynamo {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let a = agent(Some(Duration::from_secs(1)));
        let deadline = Instant::now() + Duration::from_secs(30);
        while a.get(format!("{}/health", d.base)).call().is_err() {
            assert!(Instant::now() < deadline, "{bin} did not start serving");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn slot_server(extra: &[&str]) -> (Server, String) {
    let port = free_port().to_string();
    let mut flags = vec!["--slot-tracker-port", &port];
    flags.extend_from_slice(extra);
    let s = Server::start(&flags);
    (s, format!("http://127.0.0.1:{port}"))
}

fn compare(who: &str, want: &[Value], got: &[Value]) {
    assert_eq!(want.len(), got.len(), "{who}: a different script");
    for (w, g) in want.iter().zip(got) {
        assert_eq!(w, g, "{who} answers differently");
    }
}

#[test]
fn answers_every_call_as_dynamos_slot_tracker() {
    let calls = script();
    let (_s, base) = slot_server(&[]);
    let kvix = run(&base, &calls);
    let recorded: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/dynamo_slot_tracker.json"
        ))
        .unwrap(),
    )
    .unwrap();
    if let Ok(bin) = std::env::var("DYNAMO_SLOT_TRACKER") {
        let d = Dynamo::start(&bin);
        let live = run(&d.base, &calls);
        if let Ok(out) = std::env::var("DYNAMO_SLOT_TRACKER_RECORD") {
            std::fs::write(out, serde_json::to_string_pretty(&live).unwrap()).unwrap();
        }
        compare("kvix (against live Dynamo)", &live, &kvix);
    }
    compare("kvix (against recorded Dynamo)", &recorded, &kvix);
}

const MODEL: &str = "m";

/// Sequence hashes of `tokens` as a router sends them to the slot tracker
/// (signed 64-bit JSON integers).
fn seqs(tokens: &[u32]) -> Value {
    let mut out = Vec::new();
    kvix::hash::seq_hashes_for_tokens(tokens, 4, kvix::hash::block_seed(None, None), &mut out);
    json!(out.iter().map(|h| h.0 as i64).collect::<Vec<_>>())
}

/// `/potential_loads`'s list as `/query` nests it: worker → dp rank → load.
fn nested(list: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for l in list.as_array().unwrap() {
        let w = out
            .entry(l["worker_id"].to_string())
            .or_insert_with(|| json!({}));
        w[l["dp_rank"].to_string()] = json!({
            "potential_prefill_tokens": l["potential_prefill_tokens"],
            "potential_decode_blocks": l["potential_decode_blocks"],
            "active_requests": l["active_requests"],
        });
    }
    Value::Object(out)
}

fn slot_call(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let (st, text) = reply(
        agent(Some(Duration::from_secs(10)))
            .post(format!("{base}{path}"))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap(),
    );
    (st, serde_json::from_str(&text).unwrap())
}

fn slot_ok(base: &str, path: &str, body: Value) -> Value {
    let (st, v) = slot_call(base, path, &body);
    assert!((200..300).contains(&st), "{path} {body}: {st} {v}");
    v
}

#[test]
fn query_with_loads_answers_what_potential_loads_answers() {
    let (s, base) = slot_server(&[]);
    let ctx = zmq::Context::new();
    let mut e = Engine::registered(&ctx, &s, 3, MODEL);
    e.publish(&common::stored(&[1, 2], None, &[1, 2, 3, 4, 5, 6, 7, 8], 4));
    let tokens: Vec<u32> = (1..=12).collect();
    let q = json!({"token_ids": tokens, "model_name": MODEL, "loads": true});
    s.eventually("blocks stored", || {
        let v = s.post_ok("/query", &q);
        (v["scores"]["3"]["0"] == 8)
            .then_some(())
            .ok_or(v.to_string())
    });

    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 3, "model_name": MODEL, "block_size": 4, "dp_start": 0, "dp_size": 2}),
    );
    slot_ok(
        &base,
        "/add",
        json!({"model_name": MODEL, "request_id": "a", "worker_id": 3, "dp_rank": 0, "sequence_hashes": seqs(&tokens[..8]), "new_isl_tokens": 8}),
    );
    slot_ok(
        &base,
        "/add",
        json!({"model_name": MODEL, "request_id": "b", "worker_id": 3, "dp_rank": 1, "sequence_hashes": seqs(&[1, 2, 3, 4, 9, 9, 9, 9]), "new_isl_tokens": 0}),
    );

    let want = slot_ok(
        &base,
        "/potential_loads",
        json!({"model_name": MODEL, "sequence_hashes": seqs(&tokens), "new_isl_tokens": 12}),
    );
    let v = s.post_ok("/query", &q);
    assert_eq!(v["scores"], json!({"3": {"0": 8}}), "{v}");
    assert_eq!(v["loads"], nested(&want), "{v}");
    // Rank 0 holds the prompt's first two blocks; rank 1 the first one.
    assert_eq!(
        v["loads"]["3"],
        json!({
            "0": {"potential_prefill_tokens": 20, "potential_decode_blocks": 3, "active_requests": 1},
            "1": {"potential_prefill_tokens": 12, "potential_decode_blocks": 4, "active_requests": 1}
        })
    );
    // Not asked: not there.
    let plain = s.post_ok("/query", &json!({"token_ids": tokens, "model_name": MODEL}));
    assert!(plain.get("loads").is_none(), "{plain}");

    // By hash: the same, with the blocks' tokens as the prompt's by default.
    let locals: Vec<u64> = tokens
        .chunks(4)
        .map(|c| kvix::hash::local_hash(c, kvix::hash::block_seed(None, None)).0)
        .collect();
    let by_hash = s.post_ok(
        "/query_by_hash",
        &json!({"block_hashes": locals, "model_name": MODEL, "loads": true}),
    );
    assert_eq!(by_hash["loads"], nested(&want), "{by_hash}");
    let fewer = s.post_ok(
        "/query_by_hash",
        &json!({"block_hashes": locals, "model_name": MODEL, "loads": true, "new_isl_tokens": 1}),
    );
    let want = slot_ok(
        &base,
        "/potential_loads",
        json!({"model_name": MODEL, "sequence_hashes": seqs(&tokens), "new_isl_tokens": 1}),
    );
    assert_eq!(fewer["loads"], nested(&want), "{fewer}");

    // A model the slot tracker does not know answers no loads.
    slot_ok(
        &base,
        "/unregister",
        json!({"worker_id": 3, "model_name": MODEL}),
    );
    assert_eq!(s.post_ok("/query", &q)["loads"], json!({}));
}

#[test]
fn requests_never_freed_expire_and_metrics_show_the_load() {
    let (s, base) = slot_server(&["--slot-request-ttl-secs", "1"]);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 7, "model_name": MODEL, "block_size": 4, "dp_start": 0, "dp_size": 1}),
    );
    slot_ok(
        &base,
        "/add",
        json!({"model_name": MODEL, "request_id": "a", "worker_id": 7, "dp_rank": 0, "sequence_hashes": [1, 2, 3], "new_isl_tokens": 9}),
    );
    slot_ok(
        &base,
        "/add",
        json!({"model_name": MODEL, "request_id": "b", "worker_id": 7, "dp_rank": 0, "sequence_hashes": [1, 2, 4]}),
    );
    let labels = [
        ("model", MODEL),
        ("routing_group", "default"),
        ("worker_id", "7"),
        ("dp_rank", "0"),
    ];
    let (_, t) = s.call("GET", "/metrics", None);
    assert_eq!(metric_in(&t, "kvix_slot_active_requests", &labels), 2.0);
    assert_eq!(metric_in(&t, "kvix_slot_active_blocks", &labels), 4.0);
    assert_eq!(metric_in(&t, "kvix_slot_prefill_tokens", &labels), 9.0);
    assert_eq!(metric_in(&t, "kvix_slot_requests_expired_total", &[]), 0.0);

    std::thread::sleep(Duration::from_millis(1500));
    let (st, v) = slot_call(
        &base,
        "/prefill_complete",
        &json!({"model_name": MODEL, "request_id": "a"}),
    );
    assert_eq!((st, v), (404, json!({"error": "Request a not found"})));
    let (_, t) = s.call("GET", "/metrics", None);
    assert_eq!(metric_in(&t, "kvix_slot_active_requests", &labels), 0.0);
    assert_eq!(metric_in(&t, "kvix_slot_active_blocks", &labels), 0.0);
    assert_eq!(metric_in(&t, "kvix_slot_requests_expired_total", &[]), 2.0);
    // The worker stays; its ids book again.
    slot_ok(
        &base,
        "/add",
        json!({"model_name": MODEL, "request_id": "a", "worker_id": 7, "dp_rank": 0, "sequence_hashes": [1], "new_isl_tokens": 1}),
    );
}

fn loads_of(base: &str) -> Value {
    let (_, text) = reply(
        agent(Some(Duration::from_secs(10)))
            .get(format!("{base}/loads"))
            .call()
            .unwrap(),
    );
    serde_json::from_str(&text).unwrap()
}

/// Poll until `base`'s `/loads` equals `want`.
fn converges(base: &str, want: &Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = loads_of(base);
        if got == *want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{base} /loads stayed {got}, not {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Register the same worker on every tracker of `bases`.
fn register_everywhere(bases: &[&str]) {
    for b in bases {
        slot_ok(
            b,
            "/register",
            json!({"worker_id": 1, "model_name": MODEL, "block_size": 4, "dp_start": 0, "dp_size": 2}),
        );
    }
}

/// The same steps, on whichever replica: adds sharing a prefix, a prefill
/// completion, a free.
fn steps(a: &str, b: &str) {
    slot_ok(
        a,
        "/add",
        json!({"model_name": MODEL, "request_id": "x", "worker_id": 1, "dp_rank": 0, "sequence_hashes": [1, 2, 3], "new_isl_tokens": 12}),
    );
    slot_ok(
        b,
        "/add",
        json!({"model_name": MODEL, "request_id": "y", "worker_id": 1, "dp_rank": 0, "sequence_hashes": [1, 2, 4, -5], "new_isl_tokens": 16}),
    );
    slot_ok(
        b,
        "/add",
        json!({"model_name": MODEL, "request_id": "z", "worker_id": 1, "dp_rank": 1, "sequence_hashes": [7], "new_isl_tokens": 4}),
    );
    slot_ok(
        a,
        "/prefill_complete",
        json!({"model_name": MODEL, "request_id": "x"}),
    );
    slot_ok(b, "/free", json!({"model_name": MODEL, "request_id": "z"}));
}

fn settled(a: &str, b: &str) {
    let want = json!([
        {"model_name": MODEL, "routing_group": "default", "worker_id": 1, "dp_rank": 0, "active_prefill_tokens": 16, "active_decode_blocks": 5},
        {"model_name": MODEL, "routing_group": "default", "worker_id": 1, "dp_rank": 1, "active_prefill_tokens": 0, "active_decode_blocks": 0}
    ]);
    converges(a, &want);
    converges(b, &want);
}

/// ZMQ's slow joiner: steps are lost until the subscriptions are up, so probe
/// until a booking made on `from` shows on `to`, then its free.
fn probe(from: &str, to: &str, tag: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = |id: &str| {
        slot_call(
            to,
            "/prefill_complete",
            &json!({"model_name": MODEL, "request_id": id}),
        )
        .0
    };
    for attempt in 0.. {
        let id = format!("{tag}-{attempt}");
        slot_ok(
            from,
            "/add",
            json!({"model_name": MODEL, "request_id": id, "worker_id": 1, "dp_rank": 1, "sequence_hashes": []}),
        );
        let seen = (0..20).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            done(&id) == 200
        });
        slot_ok(
            from,
            "/free",
            json!({"model_name": MODEL, "request_id": id}),
        );
        if seen {
            while done(&id) != 404 {
                assert!(
                    Instant::now() < deadline,
                    "{to} never heard the free of {id}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        assert!(Instant::now() < deadline, "{from} never reached {to}");
    }
}

#[test]
fn replicas_converge_on_the_same_loads() {
    let (pa, pb) = (free_port(), free_port());
    let peer = |p: u16| format!("tcp://127.0.0.1:{p}");
    let (a_port, b_port) = (pa.to_string(), pb.to_string());
    let (a_peer, b_peer) = (peer(pb), peer(pa));
    let (sa, a) = slot_server(&["--slot-sync-port", &a_port, "--slot-sync-peers", &a_peer]);
    let (_b, b) = slot_server(&["--slot-sync-port", &b_port, "--slot-sync-peers", &b_peer]);
    register_everywhere(&[&a, &b]);
    probe(&a, &b, "probe-a");
    probe(&b, &a, "probe-b");
    steps(&a, &b);
    settled(&a, &b);
    let (_, t) = sa.call("GET", "/metrics", None);
    assert!(
        metric_in(
            &t,
            "kvix_slot_sync_events_total",
            &[("outcome", "published")]
        ) >= 3.0
    );
    assert!(
        metric_in(
            &t,
            "kvix_slot_sync_events_total",
            &[("outcome", "received")]
        ) >= 3.0
    );
    assert_eq!(
        metric_in(
            &t,
            "kvix_slot_sync_events_total",
            &[("outcome", "dropped_in")]
        ),
        0.0
    );
}

/// kvix and Dynamo's own slot tracker as replicas of each other, in Dynamo's
/// replica-sync format. Needs `DYNAMO_SLOT_TRACKER=<dynamo-slot-tracker binary>`.
#[test]
#[ignore = "needs DYNAMO_SLOT_TRACKER (scripts/dynamo_peer)"]
fn shares_requests_with_dynamos_replicas() {
    let bin =
        std::env::var("DYNAMO_SLOT_TRACKER").expect("DYNAMO_SLOT_TRACKER=<dynamo-slot-tracker>");
    let (pk, pd) = (free_port(), free_port());
    let (k_port, k_peer) = (pk.to_string(), format!("tcp://127.0.0.1:{pd}"));
    let (_k, k) = slot_server(&["--slot-sync-port", &k_port, "--slot-sync-peers", &k_peer]);
    let d = Dynamo::start_with(
        &bin,
        &[
            "--replica-sync-port",
            &pd.to_string(),
            "--replica-sync-peers",
            &format!("tcp://127.0.0.1:{pk}"),
        ],
    );
    register_everywhere(&[&k, &d.base]);
    probe(&k, &d.base, "probe-k");
    probe(&d.base, &k, "probe-d");
    steps(&k, &d.base);
    settled(&k, &d.base);
}
