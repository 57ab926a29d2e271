//! Nothing a client, a publisher or an operator's flag can send wedges kvix: hostile
//! input against the real binary over real HTTP and ZMQ on 127.0.0.1.

use crate::support::{self, Publisher, ReservedPort, Server, register, stored, workers};
use serde_json::{Value, json};
use std::time::Duration;

/// Wait until the service answers data routes.
fn ready(s: &Server) {
    s.eventually("/ready", || match s.call("GET", "/ready", None) {
        (200, _) => Ok(()),
        (st, b) => Err(format!("{st} {b}")),
    });
}

/// A JSON error body `{"error": "..."}`.
fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    assert!(v["error"].is_string(), "no error message: {body}");
    v
}

#[test]
fn trailing_data_after_a_json_body_is_a_400_on_every_post_route() {
    let s = Server::start(&["--threads", "1"]);
    ready(&s);
    let bodies = [
        (
            "/register",
            r#"{"instance_id":1,"endpoint":"tcp://127.0.0.1:1","model_name":"m","block_size":4}"#,
        ),
        ("/unregister", r#"{"instance_id":1,"model_name":"m"}"#),
        ("/query", r#"{"token_ids":[1,2,3,4],"model_name":"m"}"#),
        ("/query_by_hash", r#"{"block_hashes":[1],"model_name":"m"}"#),
        ("/register_peer", r#"{"url":"http://127.0.0.1:1"}"#),
        ("/deregister_peer", r#"{"url":"http://127.0.0.1:1"}"#),
        (
            "/conductor/register",
            r#"{"endpoint":"tcp://127.0.0.1:1","type":"vLLM","modelname":"m","instance_id":"a","block_size":4,"dp_rank":0}"#,
        ),
        (
            "/conductor/unregister",
            r#"{"modelname":"m","instance_id":"a"}"#,
        ),
        ("/conductor/query", r#"{"model":"m","token_ids":[1,2,3,4]}"#),
        (
            "/conductor/query_by_hash",
            r#"{"model":"m","seq_hashes":[1]}"#,
        ),
    ];
    for (path, body) in bodies {
        for tail in [" x", "{}", " {\"a\":1}", "]", "\u{0}", " 1"] {
            let sent = format!("{body}{tail}");
            let (st, text) = s.call("POST", path, Some(&sent));
            assert_eq!(st, 400, "POST {path} {sent:?}: {text}");
            error_of(&text);
        }
    }
    // Whitespace after the value is fine: the same bodies are judged on their merits.
    let (st, text) = s.call(
        "POST",
        "/register_peer",
        Some("{\"url\":\"http://127.0.0.1:1\"} \r\n\t "),
    );
    assert_eq!(st, 201, "{text}");
    let (st, text) = s.call(
        "POST",
        "/query",
        Some("{\"token_ids\":[1,2,3,4],\"model_name\":\"m\"}\n"),
    );
    assert_eq!(st, 404, "{text}");
    // Nothing was registered by the refused bodies.
    assert_eq!(s.get_json("/workers"), json!([]));
}

/// A map batch with one Mooncake RFC #1527 `stored` event declaring `block_size`:
/// standardized sequence hashes, and the tokens if any.
fn rfc_stored(seq_hashes: &[u64], tokens: &[u32], block_size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_map_len(&mut b, 2).unwrap();
    rmp::encode::write_str(&mut b, "ts").unwrap();
    rmp::encode::write_f64(&mut b, 1.0).unwrap();
    rmp::encode::write_str(&mut b, "events").unwrap();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    let n = if tokens.is_empty() { 3 } else { 4 };
    rmp::encode::write_map_len(&mut b, n).unwrap();
    rmp::encode::write_str(&mut b, "event_type").unwrap();
    rmp::encode::write_str(&mut b, "stored").unwrap();
    rmp::encode::write_str(&mut b, "seq_hashes").unwrap();
    rmp::encode::write_array_len(&mut b, seq_hashes.len() as u32).unwrap();
    for h in seq_hashes {
        rmp::encode::write_uint(&mut b, *h).unwrap();
    }
    rmp::encode::write_str(&mut b, "block_size").unwrap();
    rmp::encode::write_uint(&mut b, block_size as u64).unwrap();
    if !tokens.is_empty() {
        rmp::encode::write_str(&mut b, "token_ids").unwrap();
        rmp::encode::write_array_len(&mut b, tokens.len() as u32).unwrap();
        for t in tokens {
            rmp::encode::write_uint(&mut b, *t as u64).unwrap();
        }
    }
    b
}

#[test]
fn events_of_another_block_size_are_skipped_and_counted() {
    let s = Server::start(&["--threads", "1"]);
    ready(&s);
    let ctx = zmq::Context::new();
    let [mut p] = workers(&s, &ctx, "m");
    // Standardized hashes without tokens, declared with 16-token blocks.
    p.send(&rfc_stored(&[111, 222], &[], 16));
    // Tokens that fill whole 8-token blocks (and a multiple of the registered 4).
    p.send(&rfc_stored(&[333], &(1..=8).collect::<Vec<u32>>(), 8));
    // vLLM's BlockStored declaring 8 for 8 tokens of one block.
    p.send(&stored(&[7], None, &(1..=8).collect::<Vec<u32>>(), 8));
    // A matching store after them still applies.
    p.send(&rfc_stored(&[444], &[], 4));
    let q = json!({"model": "m", "seq_hashes": [444]});
    s.wait_post_eq(
        "/query_by_hash",
        &q,
        &json!({"default": {"1": {"longest_matched": 4, "GPU": 4, "DP": {"0": 4}, "CPU": 0, "DISK": 0}}}),
    );
    for h in [111u64, 222, 333] {
        let (st, v) = s.post_json("/query_by_hash", &json!({"model": "m", "seq_hashes": [h]}));
        assert_eq!(st, 200);
        assert_eq!(v["default"]["1"]["longest_matched"], 0, "{h}: {v}");
    }
    assert_eq!(s.metric("kvix_block_size_mismatch_total", &[]), 3.0);
    assert_eq!(s.metric("kvix_malformed_frames_total", &[]), 0.0);
}

#[test]
fn an_oversized_zmq_frame_is_skipped_and_its_stream_goes_on() {
    let s = Server::start(&["--threads", "1", "--zmq-max-msg-bytes", "1048576"]);
    ready(&s);
    let ctx = zmq::Context::new();
    let [mut p] = workers(&s, &ctx, "m");
    let query = |tokens: Vec<u32>| json!({"model_name": "m", "token_ids": tokens});
    let hit = |n: u64| json!({"1": {"0": n}});
    p.send(&stored(&[1], None, &[1, 2, 3, 4], 4)); // seq 0
    s.wait_scores(&query(vec![1, 2, 3, 4]), &hit(4));
    // seq 1: a 4 MiB frame of valid msgpack (a kvix without the limit would take it).
    let mut big = Vec::with_capacity(4 << 20);
    rmp::encode::write_bin(&mut big, &vec![0u8; 4 << 20]).unwrap();
    p.send(&big);
    p.send(&stored(&[2], Some(1), &[5, 6, 7, 8], 4)); // seq 2
    s.wait_scores(&query((1..=8).collect()), &hit(8));
    // The same connection carried on: nothing was lost but the big frame, which is
    // counted as malformed and never decoded.
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 0.0);
    assert_eq!(s.metric("kvix_malformed_frames_total", &[]), 1.0);
    assert!(
        s.log().contains("over --zmq-max-msg-bytes 1048576"),
        "{}",
        s.log()
    );
    assert_eq!(s.call("GET", "/health", None).0, 200);
}

/// Run the binary with `args` until it exits or `wait` passes; (exit code, stderr).
fn run_kvix(args: &[&str], wait: Duration) -> (Option<i32>, String) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let log = std::env::temp_dir().join(format!(
        "kvix-flags-{}-{}.log",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut child = std::process::Command::new(support::kvix_bin())
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + wait;
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (code, text)
}

#[test]
fn numeric_flags_are_refused_or_clamped_with_a_message() {
    for (args, says) in [
        (&["--snapshot-interval", "NaN"][..], "--snapshot-interval"),
        (&["--snapshot-interval=-1"][..], "--snapshot-interval"),
        (&["--block-size", "0"][..], "--block-size"),
        (&["--threads", "0"][..], "--threads"),
        (
            &["--attention-chunk-size", "llama4"][..],
            "--attention-chunk-size",
        ),
        (
            &["--hybrid-align-tokens", "m=0"][..],
            "--hybrid-align-tokens",
        ),
    ] {
        let (code, err) = run_kvix(args, Duration::from_secs(10));
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Out of range but usable: clamped, said so, and served.
    let s = Server::start(&[
        "--threads",
        "1",
        "--ingest-threads",
        "1000",
        "--snapshot-interval",
        "0.001",
        "--max-connections",
        "100000000000",
        "--zmq-max-msg-bytes",
        "1",
    ]);
    let log = s.log();
    for clamped in [
        "--ingest-threads 1000 is outside",
        "--snapshot-interval 0.001 is outside [0.1, 1000000000]; using 0.1",
        "--max-connections 100000000000 is outside",
        "--zmq-max-msg-bytes 1 is outside [4096,",
    ] {
        assert!(log.contains(clamped), "no `{clamped}` in:\n{log}");
    }
    assert_eq!(s.call("GET", "/health", None).0, 200);
}

#[test]
fn register_peer_takes_only_http_urls_of_other_instances() {
    let s = Server::start(&["--threads", "1"]);
    ready(&s);
    for bad in [
        "not a url",
        "ftp://x",
        "http://",
        "http://:8090",
        "peer:8091",
    ] {
        let (st, v) = s.post_json("/register_peer", &json!({"url": bad}));
        assert_eq!(st, 422, "{bad}: {v}");
        assert_eq!(v["field"], "url", "{bad}: {v}");
    }
    let port = s.port;
    for me in [
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}/"),
        format!("http://0.0.0.0:{port}"),
        format!("http://[::1]:{port}"),
    ] {
        let (st, v) = s.post_json("/register_peer", &json!({"url": me}));
        assert_eq!(st, 400, "{me}: {v}");
        assert!(v["error"].as_str().unwrap().contains("itself"), "{v}");
    }
    assert_eq!(s.get_json("/peers"), json!([]));
    // Another address, where nothing answers.
    let dead = ReservedPort::new();
    let other = dead.url();
    let (st, v) = s.post_json("/register_peer", &json!({"url": other}));
    assert_eq!(st, 201, "{v}");
    assert_eq!(s.get_json("/peers"), json!([other]));
}

/// `field` of every object in the array `list`, sorted by their JSON text.
fn sorted_field(list: &Value, field: &str) -> Vec<Value> {
    let mut values: Vec<Value> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o[field].clone())
        .collect();
    values.sort_by_key(|v| v.to_string());
    values
}

#[test]
fn instance_ids_of_the_whole_u64_range_round_trip() {
    let s = Server::start(&["--threads", "2"]);
    ready(&s);
    let ctx = zmq::Context::new();
    let (max, high) = (u64::MAX, 1u64 << 63);
    let mut pubs: Vec<Publisher> = (0..3).map(|_| Publisher::bind(&ctx)).collect();
    for (id, p) in [max, high].iter().zip(&pubs) {
        register(&s, "m", *id, p);
    }
    // A Mooncake instance named by a string, registered first by a name at that.
    s.post_ok(
        "/register",
        &json!({"endpoint": pubs[2].endpoint, "type": "vLLM", "modelname": "m",
                "instance_id": "vllm-1", "block_size": 4, "dp_rank": 0}),
    );
    pubs[2].wait_subscriber();
    let want = vec![json!("vllm-1"), json!(max), json!(high)];
    let workers = s.get_json("/workers");
    let ids = sorted_field(&workers, "instance_id");
    assert_eq!(ids, want, "{workers}");

    for p in &mut pubs {
        p.send(&stored(&[1], None, &[1, 2, 3, 4], 4));
    }
    let q = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    s.wait_post_eq(
        "/query",
        &q,
        &json!({
            "scores": {max.to_string(): {"0": 4}, high.to_string(): {"0": 4}, "vllm-1": {"0": 4}},
            "frequencies": [3],
            "tree_sizes": {max.to_string(): {"0": 1}, high.to_string(): {"0": 1}, "vllm-1": {"0": 1}},
            "instances": {
                max.to_string(): {"longest_matched": 4, "gpu": 4, "dp": {"0": 4}, "cpu": 4, "disk": 4,
                 "effective": {"0": 4}, "hit": {"0": "full"}},
                high.to_string(): {"longest_matched": 4, "gpu": 4, "dp": {"0": 4}, "cpu": 4, "disk": 4,
                 "effective": {"0": 4}, "hit": {"0": "full"}},
                "vllm-1": {"longest_matched": 4, "gpu": 4, "dp": {"0": 4}, "cpu": 4, "disk": 4,
                 "effective": {"0": 4}, "hit": {"0": "full"}}
            }
        }),
    );
    // /dump prints the same ids: integers as numbers, the name as a string.
    let dump = s.get_json("/dump");
    let in_dump = sorted_field(&dump["m:default"]["events"], "worker_id");
    assert_eq!(in_dump, want, "{dump}");
    // Every printed id is accepted back: narrowing a query, in either API.
    for id in &ids {
        let (st, v) = s.post_json(
            "/conductor/query",
            &json!({"model": "m", "token_ids": [1, 2, 3, 4], "instance_id": id}),
        );
        assert_eq!(st, 200, "{id}: {v}");
        let only = v["default"].as_object().unwrap();
        assert_eq!(only.len(), 1, "{id}: {v}");
    }
    // Unregistering by the printed values: a number, the same number as a string, a name.
    s.post_ok(
        "/unregister",
        &json!({"instance_id": max, "model_name": "m"}),
    );
    s.post_ok(
        "/unregister",
        &json!({"instance_id": high.to_string(), "model_name": "m"}),
    );
    let (st, v) = s.post_json(
        "/unregister",
        &json!({"instance_id": "vllm-1", "modelname": "m", "type": "vLLM", "dp_rank": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["removed_instances"], json!(["vllm-1|default|0"]));
    assert_eq!(s.get_json("/workers"), json!([]));
    // An unknown name is a 404, not a new instance.
    let (st, v) = s.post_json(
        "/unregister",
        &json!({"instance_id": "nobody", "model_name": "m"}),
    );
    assert_eq!(st, 404, "{v}");
}

/// `(status, WWW-Authenticate, body)` of a request with an optional bearer token.
fn with_token(
    s: &Server,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Option<String>, String) {
    let agent = support::agent(Some(Duration::from_secs(20)));
    let url = format!("{}{path}", s.base);
    let auth = token.map(|t| format!("Bearer {t}"));
    let resp = match (method, body) {
        ("GET", _) => {
            let mut r = agent.get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        (_, b) => {
            let mut r = agent.post(&url).header("Content-Type", "application/json");
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(b.map(Value::to_string).unwrap_or_default())
        }
    };
    let mut resp = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let www = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.body_mut().read_to_string().unwrap();
    (resp.status().as_u16(), www, text)
}

fn token_file(name: &str, content: &str) -> String {
    let dir = std::env::temp_dir().join(format!("kvix-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn tokens_guard_admin_and_read_routes() {
    let admin = token_file("admin", "adm-7f3e\n");
    let query = token_file("query", "  qry-91c2  \n");
    let s = Server::start(&[
        "--threads",
        "1",
        "--admin-token-file",
        &admin,
        "--query-token-file",
        &query,
    ]);
    ready(&s);
    let ctx = zmq::Context::new();
    let p = Publisher::bind(&ctx);
    let reg = json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": "m", "block_size": 4});
    let q = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    // Liveness and readiness stay open.
    for path in ["/health", "/ready", "/conductor/health"] {
        assert_eq!(with_token(&s, "GET", path, None, None).0, 200, "{path}");
    }
    // Missing or wrong tokens: 401, a JSON error, and the challenge.
    for token in [None, Some("nope"), Some("adm-7f3"), Some("qry-91c2 x")] {
        for (method, path, body) in [
            ("GET", "/workers", None),
            ("GET", "/metrics", None),
            ("GET", "/dump", None),
            ("GET", "/peers", None),
            ("POST", "/query", Some(&q)),
            (
                "POST",
                "/conductor/query_by_hash",
                Some(&json!({"model": "m", "seq_hashes": [1]})),
            ),
            ("POST", "/register", Some(&reg)),
            (
                "POST",
                "/conductor/unregister",
                Some(&json!({"modelname": "m", "instance_id": "a"})),
            ),
            (
                "POST",
                "/register_peer",
                Some(&json!({"url": "http://10.0.0.1:1"})),
            ),
        ] {
            let (st, www, text) = with_token(&s, method, path, body, token);
            assert_eq!(st, 401, "{method} {path} {token:?}: {text}");
            assert!(www.is_some_and(|w| w.starts_with("Bearer")), "{path}");
            error_of(&text);
        }
    }
    // The query token reads, but does not write.
    for path in ["/workers", "/metrics", "/dump", "/peers"] {
        let (st, _, text) = with_token(&s, "GET", path, None, Some("qry-91c2"));
        assert_eq!(st, 200, "{path}: {text}");
    }
    let (st, _, text) = with_token(&s, "POST", "/query", Some(&q), Some("qry-91c2"));
    assert_eq!(st, 404, "past the token check, no index yet: {text}");
    for (path, body) in [
        ("/register", &reg),
        ("/register_peer", &json!({"url": "http://10.0.0.1:1"})),
        ("/deregister_peer", &json!({"url": "http://10.0.0.1:1"})),
    ] {
        let (st, _, text) = with_token(&s, "POST", path, Some(body), Some("qry-91c2"));
        assert_eq!(st, 401, "{path}: {text}");
    }
    // The admin token writes, and reads too.
    let (st, _, text) = with_token(&s, "POST", "/register", Some(&reg), Some("adm-7f3e"));
    assert_eq!(st, 201, "{text}");
    p.wait_subscriber();
    let (st, _, text) = with_token(&s, "GET", "/workers", None, Some("adm-7f3e"));
    assert_eq!(st, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()[0]["instance_id"],
        1
    );
    let (st, _, text) = with_token(&s, "POST", "/query", Some(&q), Some("qry-91c2"));
    assert_eq!(st, 200, "{text}");
    let (st, _, text) = with_token(
        &s,
        "POST",
        "/unregister",
        Some(&json!({"instance_id": 1, "model_name": "m"})),
        Some("adm-7f3e"),
    );
    assert_eq!(st, 200, "{text}");
    // No token ever reaches the log.
    let log = s.log();
    assert!(
        !log.contains("adm-7f3e") && !log.contains("qry-91c2"),
        "{log}"
    );
}

#[test]
fn a_bad_token_file_stops_kvix_at_start() {
    let empty = token_file("empty", " \n");
    let (code, err) = run_kvix(&["--admin-token-file", &empty], Duration::from_secs(10));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--admin-token-file") && err.contains("empty"),
        "{err}"
    );
    let (code, err) = run_kvix(
        &["--query-token-file", "/nonexistent/kvix-token"],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--query-token-file"), "{err}");
    let (code, err) = run_kvix(
        &["--allow-endpoints", "10.0.0.0/33"],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--allow-endpoints"), "{err}");
}

#[test]
fn allow_list_refuses_endpoints_outside_it() {
    let s = Server::start(&[
        "--threads",
        "1",
        "--allow-endpoints",
        "127.0.0.1/32, engine-*.svc",
    ]);
    ready(&s);
    let ctx = zmq::Context::new();
    let p = Publisher::bind(&ctx);
    let dynamo = |ep: &str, replay: Option<&str>| {
        json!({"instance_id": 1, "endpoint": ep, "replay_endpoint": replay,
               "model_name": "m", "block_size": 4})
    };
    let conductor = |ep: &str, replay: Option<&str>| {
        json!({"endpoint": ep, "replay_endpoint": replay, "type": "vLLM", "modelname": "m",
               "instance_id": "a", "block_size": 4, "dp_rank": 0})
    };
    for shape in [&dynamo as &dyn Fn(&str, Option<&str>) -> Value, &conductor] {
        for (ep, replay, field) in [
            ("tcp://10.9.9.9:5557", None, "endpoint"),
            ("tcp://127.0.0.2:5557", None, "endpoint"),
            ("ipc:///tmp/kvix-engine.sock", None, "endpoint"),
            ("inproc://engine", None, "endpoint"),
            ("tcp://127.0.0.1:9;10.0.0.1:5557", None, "endpoint"),
            (
                p.endpoint.as_str(),
                Some("tcp://10.0.0.1:5558"),
                "replay_endpoint",
            ),
        ] {
            let (st, v) = s.post_json("/register", &shape(ep, replay));
            assert_eq!(st, 403, "{ep} {replay:?}: {v}");
            assert_eq!(v["field"], field, "{v}");
            assert!(v["error"].as_str().unwrap().contains("not allowed"), "{v}");
        }
    }
    assert_eq!(s.get_json("/workers"), json!([]));
    // Inside the list: registered and listened to.
    s.post_ok("/register", &dynamo(&p.endpoint, None));
    p.wait_subscriber();
    assert_eq!(s.get_json("/workers")[0]["instance_id"], 1);
}

#[test]
fn replicas_sharing_a_query_token_still_recover_from_each_other() {
    let query = token_file("peer-query", "qry-5d1a");
    let a = Server::start(&["--threads", "1", "--query-token-file", &query]);
    ready(&a);
    let ctx = zmq::Context::new();
    let mut p = Publisher::bind(&ctx);
    a.post_ok(
        "/register",
        &json!({"instance_id": 3, "endpoint": p.endpoint, "model_name": "m", "block_size": 4}),
    );
    p.wait_subscriber();
    p.send(&stored(&[1], None, &[1, 2, 3, 4], 4));
    let q = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    a.eventually("applied on a", || {
        let (st, _, text) = with_token(&a, "POST", "/query", Some(&q), Some("qry-5d1a"));
        (st == 200 && text.contains(r#""scores":{"3":{"0":4}}"#))
            .then_some(())
            .ok_or(text)
    });
    let b = Server::start(&[
        "--threads",
        "1",
        "--query-token-file",
        &query,
        "--peers",
        &a.base,
        "--peer-wait-ms",
        "0",
    ]);
    b.wait_log("recovery done");
    let log = b.log();
    assert!(log.contains("recovered from peer"), "{log}");
    let (st, _, text) = with_token(&b, "POST", "/query", Some(&q), Some("qry-5d1a"));
    assert_eq!(st, 200, "{text}");
    assert!(text.contains(r#""scores":{"3":{"0":4}}"#), "{text}");
}

/// A vLLM batch of one event whose tag is `tag` (a positional `BlockStored` shape).
fn event_tagged(tag: &str) -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_array_len(&mut b, 3).unwrap();
    rmp::encode::write_f64(&mut b, 0.0).unwrap();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    rmp::encode::write_array_len(&mut b, 7).unwrap();
    rmp::encode::write_str(&mut b, tag).unwrap();
    support::write_uints(&mut b, &[1]);
    rmp::encode::write_nil(&mut b).unwrap();
    support::write_uints(&mut b, &[1, 2, 3, 4]);
    rmp::encode::write_uint(&mut b, 4).unwrap();
    rmp::encode::write_nil(&mut b).unwrap();
    rmp::encode::write_nil(&mut b).unwrap();
    rmp::encode::write_uint(&mut b, 0).unwrap();
    b
}

/// The lines of a text log that a publisher forged: a line of its own that starts
/// with the fake text, or any raw control byte other than the line ends.
fn forged(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with("ERROR forged") || l.bytes().any(|c| c < 0x20 && c != b'\t'))
        .collect()
}

/// A publisher cannot write lines of its own into the text log: an unknown event tag
/// carrying a newline, a fake `ERROR` line and a terminal escape is logged escaped,
/// and its bytes are not in the message. 20,000 malformed frames write a few lines,
/// each with the count of those left out, while every frame is counted.
#[test]
fn a_publisher_can_neither_forge_nor_flood_the_log() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut p] = workers::<1>(&s, &ctx, "m");
    let lines_before = s.log().lines().count();
    p.send(&event_tagged(
        "BlockStored\nERROR forged by a publisher\u{1b}[2J",
    ));
    // In steps well under the subscriber's queue (--zmq-rcvhwm), so none is dropped.
    for step in 1..=10 {
        for _ in 0..2_000 {
            p.send(b"\xc1 not msgpack");
        }
        let want = 1.0 + 2_000.0 * step as f64;
        s.eventually("every malformed frame counted", || {
            let n = s.metric("kvix_malformed_frames_total", &[]);
            (n == want).then_some(()).ok_or(format!("{n}"))
        });
    }
    // The frames after them still index.
    p.send(&stored(&[7], None, &[1, 2, 3, 4], 4));
    s.wait_scores(
        &json!({"model_name": "m", "token_ids": [1, 2, 3, 4]}),
        &json!({"1": {"0": 4}}),
    );
    let log = s.log();
    assert_eq!(forged(&log), Vec::<&str>::new(), "{log}");
    assert!(
        !log.contains("forged by a publisher"),
        "payload bytes in the log:\n{log}"
    );
    assert!(log.contains("unknown event tag of"), "{log}");
    let written = log.lines().count() - lines_before;
    assert!(
        written < 200,
        "{written} lines for 20,001 bad frames:\n{log}"
    );
}

/// Names a client registers are bounded: a 1 MB model name, a tenant with a newline
/// or an empty model name is a 422 naming the field, and nothing is registered.
#[test]
fn registered_names_are_bounded_and_free_of_control_characters() {
    let s = Server::start(&["--threads", "1"]);
    ready(&s);
    let ctx = zmq::Context::new();
    let p = Publisher::bind(&ctx);
    let huge = "m".repeat(1 << 20);
    for (body, field) in [
        (
            json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": huge, "block_size": 4}),
            "model_name",
        ),
        (
            json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": "", "block_size": 4}),
            "model_name",
        ),
        (
            json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": "m", "block_size": 4, "tenant_id": "t\nERROR x"}),
            "tenant_id",
        ),
        (
            json!({"instance_id": "w\u{1b}[2J", "endpoint": p.endpoint, "model_name": "m", "block_size": 4}),
            "instance_id",
        ),
        (
            json!({"instance_id": "w", "endpoint": p.endpoint, "type": "vLLM", "modelname": huge, "block_size": 4, "dp_rank": 0}),
            "modelname",
        ),
    ] {
        let (st, v) = s.post_json("/register", &body);
        assert_eq!((st, v["field"].as_str()), (422, Some(field)), "{v}");
    }
    assert_eq!(s.get_json("/workers"), json!([]));
    // 256 bytes is the limit, not a refusal of long names.
    register(&s, &"m".repeat(256), 1, &p);
}

/// A wrongly typed field is named in the 422, also one of the fields a query shares
/// with other routes (its scope: tenant, routing group, loads).
#[test]
fn a_wrongly_typed_field_is_named_wherever_it_sits() {
    let s = Server::start(&["--threads", "1"]);
    ready(&s);
    for (extra, field) in [
        (json!({"routing_group": 5}), "routing_group"),
        (json!({"loads": "yes"}), "loads"),
        (json!({"tenant_id": 5}), "tenant_id"),
    ] {
        let mut body = json!({"model_name": "m", "token_ids": [1, 2, 3, 4]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (st, v) = s.post_json("/query", &body);
        assert_eq!((st, v["field"].as_str()), (422, Some(field)), "{v}");
    }
}
