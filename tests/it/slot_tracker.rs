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

use crate::support::{self, Dynamo, Engine, ReservedPort, Server, agent, metric_in, reply};
use serde_json::{Value, json};
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

/// kvix with a slot tracker on a port of its own choosing, and that tracker's URL.
fn slot_server(extra: &[&str]) -> (Server, String) {
    let mut flags = vec!["--slot-tracker-port", "0"];
    flags.extend_from_slice(extra);
    let s = Server::start(&flags);
    let url = s.slot_tracker_url();
    (s, url)
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
        let d = Dynamo::start(&bin, &[]);
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
    e.publish(&support::stored(
        &[1, 2],
        None,
        &[1, 2, 3, 4, 5, 6, 7, 8],
        4,
    ));
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
    // Each replica names the other's sync port before the other starts: both ports
    // are reserved first, and each replica binds its own beside the reservation.
    let (pa, pb) = (ReservedPort::new(), ReservedPort::new());
    let (a_port, b_port) = (pa.port.to_string(), pb.port.to_string());
    let (sa, a) = slot_server(&[
        "--slot-sync-port",
        &a_port,
        "--slot-sync-peers",
        &pb.endpoint(),
    ]);
    let (_b, b) = slot_server(&[
        "--slot-sync-port",
        &b_port,
        "--slot-sync-peers",
        &pa.endpoint(),
    ]);
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
    // Each names the other's sync port before the other starts (reserved ports, as
    // for two kvix replicas).
    let (pk, pd) = (ReservedPort::new(), ReservedPort::new());
    let k_port = pk.port.to_string();
    let (_k, k) = slot_server(&[
        "--slot-sync-port",
        &k_port,
        "--slot-sync-peers",
        &pd.endpoint(),
    ]);
    let d = Dynamo::start(
        &bin,
        &[
            "--replica-sync-port",
            &pd.port.to_string(),
            "--replica-sync-peers",
            &pk.endpoint(),
        ],
    );
    register_everywhere(&[&k, &d.base]);
    probe(&k, &d.base, "probe-k");
    probe(&d.base, &k, "probe-d");
    steps(&k, &d.base);
    settled(&k, &d.base);
}

/// The longest a query may wait while the slot tracker is loaded: generous for a
/// loaded two-core machine and a debug build.
const QUERY_WAIT: Duration = Duration::from_millis(250);

/// `/query`s on the index port from `conns` connections until [`Queries::finish`].
struct Queries(support::QueryLoop);

impl Queries {
    fn start(s: &Server, conns: usize) -> Queries {
        let body = json!({"token_ids": (1..=64).collect::<Vec<u32>>(), "model_name": MODEL});
        Queries(support::QueryLoop::start(&s.base, conns, body))
    }

    /// Asserts no query waited [`QUERY_WAIT`] or longer while `what`.
    fn finish(self, what: &str) {
        let (worst, n) = self.0.finish();
        eprintln!("{n} queries, the longest {worst:?}, while {what}");
        assert!(n >= 10, "{n} queries answered while {what}");
        assert!(worst < QUERY_WAIT, "a query waited {worst:?} while {what}");
    }
}

/// A slot tracker on two executors, with a worker of the index registered so
/// that queries have something to score.
fn loaded_server(extra: &[&str]) -> (Server, String, support::Publisher) {
    let mut flags = vec!["--threads", "2"];
    flags.extend_from_slice(extra);
    let (s, base) = slot_server(&flags);
    let [w] = support::workers::<1>(&s, &zmq::Context::new(), MODEL);
    (s, base, w)
}

fn add_body(id: &str, rank: u32, hashes: impl Iterator<Item = u64>, isl: u64) -> String {
    let hashes: Vec<String> = hashes.map(|h| (h as i64).to_string()).collect();
    format!(
        r#"{{"model_name":"{MODEL}","request_id":"{id}","worker_id":1,"dp_rank":{rank},"new_isl_tokens":{isl},"sequence_hashes":[{}]}}"#,
        hashes.join(",")
    )
}

fn post_raw(a: &ureq::Agent, url: &str, body: &str) -> (u16, String) {
    match a
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.as_bytes())
    {
        Ok(r) => reply(r),
        // A body refused before it is read: the server may close while it is sent.
        Err(e) => (0, e.to_string()),
    }
}

#[test]
fn huge_adds_are_refused_at_once_and_queries_keep_answering() {
    let (s, base, _w) = loaded_server(&[]);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 1, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 1}),
    );
    // Five adds of a million hashes each (about 20 MB of body): over Dynamo's
    // 2 MB, refused before they are read.
    let queries = Queries::start(&s, 2);
    std::thread::sleep(Duration::from_millis(200));
    let adds: Vec<_> = (0..5)
        .map(|i| {
            let url = format!("{base}/add");
            std::thread::spawn(move || {
                let body = add_body(
                    &format!("big{i}"),
                    0,
                    (0..1u64 << 20).map(|h| h | 1 << 62),
                    0,
                );
                let t = Instant::now();
                let (st, text) = post_raw(&agent(Some(Duration::from_secs(30))), &url, &body);
                (st, text, t.elapsed())
            })
        })
        .collect();
    for a in adds {
        let (st, text, took) = a.join().unwrap();
        assert!(took < QUERY_WAIT, "a refused /add took {took:?}");
        if st != 0 {
            assert_eq!(st, 413, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["limit"], 2 * 1024 * 1024, "{v}");
            assert_eq!(v["flag"], "--slot-max-body-bytes", "{v}");
        }
    }
    queries.finish("five 1M-hash /adds were refused");
    assert_eq!(
        s.metric("kvix_slot_refused_total", &[("reason", "body")]),
        5.0
    );
    // Under the limit, the most one booking may hold is booked.
    let ok = add_body("most", 0, 0..100_000, 8);
    assert!(ok.len() < 2 * 1024 * 1024);
    let (st, text) = post_raw(&agent(None), &format!("{base}/add"), &ok);
    assert_eq!(st, 201, "{text}");
}

#[test]
fn bookings_over_the_bounds_get_413_and_429_naming_the_flag() {
    let (s, base) = slot_server(&[
        "--slot-max-booking-blocks",
        "4",
        "--slot-max-rank-blocks",
        "6",
        "--slot-max-bookings",
        "3",
    ]);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 1, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 2}),
    );
    let add = |id: &str, rank: u32, hashes: Value| {
        slot_call(
            &base,
            "/add",
            &json!({"model_name": MODEL, "request_id": id, "worker_id": 1, "dp_rank": rank, "sequence_hashes": hashes}),
        )
    };
    let (st, v) = add("a", 0, json!([1, 2, 3, 4, 5]));
    assert_eq!(st, 413, "{v}");
    assert_eq!(
        (&v["field"], &v["limit"], &v["flag"]),
        (
            &json!("sequence_hashes"),
            &json!(4),
            &json!("--slot-max-booking-blocks")
        ),
        "{v}"
    );
    assert_eq!(add("a", 0, json!([1, 2, 3, 4])).0, 201);
    // The shared prefix counts once on the rank: two more blocks fit, three do not.
    assert_eq!(add("b", 0, json!([1, 2, 7, 8])).0, 201);
    let (st, v) = add("c", 0, json!([1, 9]));
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["flag"], "--slot-max-rank-blocks", "{v}");
    assert_eq!(add("c", 1, json!([1, 9])).0, 201);
    let (st, v) = add("d", 1, json!([]));
    assert_eq!(st, 429, "{v}");
    assert_eq!(
        (&v["limit"], &v["flag"]),
        (&json!(3), &json!("--slot-max-bookings")),
        "{v}"
    );
    // A free makes room.
    slot_ok(
        &base,
        "/free",
        json!({"model_name": MODEL, "request_id": "c"}),
    );
    assert_eq!(add("d", 1, json!([])).0, 201);
    for (reason, n) in [
        ("booking_blocks", 1.0),
        ("rank_blocks", 1.0),
        ("bookings", 1.0),
        ("body", 0.0),
    ] {
        assert_eq!(
            s.metric("kvix_slot_refused_total", &[("reason", reason)]),
            n,
            "{reason}"
        );
    }
}

#[test]
fn prefill_tokens_saturate_and_are_given_back_exactly() {
    let (_s, base) = slot_server(&[]);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 1, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 1}),
    );
    let add = |id: &str, isl: u64| {
        slot_ok(
            &base,
            "/add",
            json!({"model_name": MODEL, "request_id": id, "worker_id": 1, "dp_rank": 0, "sequence_hashes": [1], "new_isl_tokens": isl}),
        )
    };
    add("max", u64::MAX);
    add("five", 5);
    let tokens = || loads_of(&base)[0]["active_prefill_tokens"].clone();
    assert_eq!(tokens(), json!(u64::MAX));
    let p = slot_ok(
        &base,
        "/potential_loads",
        json!({"model_name": MODEL, "sequence_hashes": [1], "new_isl_tokens": 3}),
    );
    assert_eq!(p[0]["potential_prefill_tokens"], json!(u64::MAX), "{p}");
    slot_ok(
        &base,
        "/prefill_complete",
        json!({"model_name": MODEL, "request_id": "max"}),
    );
    assert_eq!(tokens(), json!(5));
    add("again", u64::MAX);
    slot_ok(
        &base,
        "/free",
        json!({"model_name": MODEL, "request_id": "again"}),
    );
    assert_eq!(tokens(), json!(5));
}

#[test]
fn twenty_thousand_bookings_expiring_together_stall_no_query() {
    const BOOKINGS: u64 = 20_000;
    const TTL: Duration = Duration::from_secs(15);
    let (s, base, _w) = loaded_server(&["--slot-request-ttl-secs", "15"]);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 1, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 8}),
    );
    // Bookings of 100 blocks each, 2 million in all, from four connections.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let url = format!("{base}/add");
            std::thread::spawn(move || {
                let a = agent(Some(Duration::from_secs(30)));
                for i in (t..BOOKINGS).step_by(4) {
                    let body = add_body(
                        &format!("r{i}"),
                        (i % 8) as u32,
                        (0..100).map(|b| i * 1000 + b),
                        16,
                    );
                    let (st, text) = post_raw(&a, &url, &body);
                    assert_eq!(st, 201, "{text}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Held still past the TTL, then let go: every booking is due at once.
    let last = Instant::now();
    s.signal("STOP");
    std::thread::sleep(
        (last + TTL + Duration::from_millis(500)).saturating_duration_since(Instant::now()),
    );
    s.signal("CONT");
    let queries = Queries::start(&s, 2);
    s.eventually("every booking expired", || {
        match s.metric("kvix_slot_requests_expired_total", &[]) {
            n if n == BOOKINGS as f64 => Ok(()),
            n => Err(format!("{n} expired")),
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    queries.finish("20,000 bookings expired");
    let l = loads_of(&base);
    assert!(
        l.as_array()
            .unwrap()
            .iter()
            .all(|r| r["active_decode_blocks"] == 0),
        "{l}"
    );
}

#[test]
fn twenty_registrations_of_4096_ranks_keep_metrics_small_and_queries_quick() {
    let (s, base, _w) = loaded_server(&[]);
    let queries = Queries::start(&s, 2);
    for w in 0..20 {
        slot_ok(
            &base,
            "/register",
            json!({"worker_id": w, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 4096}),
        );
    }
    slot_ok(
        &base,
        "/add",
        json!({"model_name": MODEL, "request_id": "a", "worker_id": 3, "dp_rank": 7, "sequence_hashes": [1, 2], "new_isl_tokens": 9}),
    );
    let t = Instant::now();
    let (st, text) = s.call("GET", "/metrics", None);
    let took = t.elapsed();
    queries.finish("20 workers of 4,096 ranks registered");
    assert_eq!(st, 200);
    eprintln!("/metrics: {} bytes in {took:?}", text.len());
    assert!(text.len() < 5 << 20, "/metrics is {} bytes", text.len());
    let tracker = [("model", MODEL), ("routing_group", "default")];
    for (name, want) in [
        ("kvix_slot_tracker_ranks", 81_920.0),
        ("kvix_slot_tracker_active_requests", 1.0),
        ("kvix_slot_tracker_active_blocks", 2.0),
        ("kvix_slot_tracker_prefill_tokens", 9.0),
    ] {
        assert_eq!(metric_in(&text, name, &tracker), want, "{name}");
    }
    assert!(
        !text.contains("kvix_slot_active_requests{"),
        "per-rank series above the bound"
    );
}

#[test]
fn few_ranks_keep_their_per_rank_series() {
    let (s, base) = slot_server(&["--slot-metrics-max-ranks", "4"]);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 1, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 4}),
    );
    let rank = [
        ("model", MODEL),
        ("routing_group", "default"),
        ("worker_id", "1"),
        ("dp_rank", "3"),
    ];
    assert_eq!(s.metric("kvix_slot_active_requests", &rank), 0.0);
    slot_ok(
        &base,
        "/register",
        json!({"worker_id": 2, "model_name": MODEL, "block_size": 16, "dp_start": 0, "dp_size": 1}),
    );
    let (_, text) = s.call("GET", "/metrics", None);
    assert!(!text.contains("kvix_slot_active_requests{"), "{text}");
}
