//! The HTTP API as Dynamo's standalone-indexer docs show it, curl
//! example by curl example, plus every kind of bad input the routes must refuse.

use crate::support::{self, Server};
use serde_json::{Value, json};

fn error_of(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field in {v}"))
}

#[test]
fn seed_000_curl_examples() {
    let s = Server::start(&["--threads", "2"]);
    assert_eq!(s.call("GET", "/health", None).0, 200);

    // Register: single model default tenant; with tenant isolation and dp rank.
    s.post_ok(
        "/register",
        &json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:5557", "model_name": "llama-3-8b", "block_size": 16}),
    );
    s.post_ok(
        "/register",
        &json!({"instance_id": 2, "endpoint": "tcp://127.0.0.1:5558", "model_name": "llama-3-8b",
                "tenant_id": "customer-a", "block_size": 16, "dp_rank": 0}),
    );
    s.post_ok(
        "/register",
        &json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:5559", "model_name": "llama-3-8b",
                "tenant_id": "customer-a", "block_size": 16, "dp_rank": 1}),
    );

    let w = s.get_json("/workers");
    let brief: Vec<(u64, Value, String)> = w
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["instance_id"].as_u64().unwrap(),
                x["endpoints"].clone(),
                x["tenant_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        brief,
        vec![
            (1, json!({"0": "tcp://127.0.0.1:5557"}), "default".into()),
            (1, json!({"1": "tcp://127.0.0.1:5559"}), "customer-a".into()),
            (2, json!({"0": "tcp://127.0.0.1:5558"}), "customer-a".into()),
        ]
    );

    let (st, v) = s.post_json(
        "/query",
        &json!({"token_ids": (1..=16).collect::<Vec<u32>>(), "model_name": "llama-3-8b"}),
    );
    assert_eq!(st, 200);
    assert_eq!(v["scores"], json!({}));
    assert_eq!(v["frequencies"], json!([]));
    assert_eq!(v["tree_sizes"], json!({"1": {"0": 0}}));
    let (st, v) = s.post_json(
        "/query_by_hash",
        &json!({"block_hashes": [123456, 789012], "model_name": "llama-3-8b"}),
    );
    assert_eq!((st, &v["scores"]), (200, &json!({})));
    // Tenants are separate indexes.
    let (st, v) = s.post_json(
        "/query",
        &json!({"token_ids": [1, 2], "model_name": "llama-3-8b", "tenant_id": "customer-a"}),
    );
    assert_eq!(st, 200);
    assert_eq!(v["tree_sizes"], json!({"1": {"1": 0}, "2": {"0": 0}}));

    let d = s.get_json("/dump");
    assert_eq!(
        d,
        json!({
            "llama-3-8b:default": {"block_size": 16, "events": []},
            "llama-3-8b:customer-a": {"block_size": 16, "events": []}
        })
    );

    // Peers.
    s.post_ok("/register_peer", &json!({"url": "http://peer:8091"}));
    assert_eq!(s.get_json("/peers"), json!(["http://peer:8091"]));
    s.post_ok("/deregister_peer", &json!({"url": "http://peer:8091"}));
    assert_eq!(s.get_json("/peers"), json!([]));
    let (st, v) = s.post_json("/deregister_peer", &json!({"url": "http://peer:8091"}));
    assert_eq!(st, 404, "{v}");

    // Unregister a specific dp rank, then a specific tenant, then from all tenants.
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 1, "model_name": "llama-3-8b", "tenant_id": "customer-a", "dp_rank": 1}),
    );
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 2, "model_name": "llama-3-8b", "tenant_id": "customer-a"}),
    );
    // customer-a has no worker left: like Dynamo, its indexer is gone.
    let (st, v) = s.post_json(
        "/query",
        &json!({"token_ids": [1], "model_name": "llama-3-8b", "tenant_id": "customer-a"}),
    );
    assert_eq!(st, 404, "{v}");
    s.post_ok(
        "/unregister",
        &json!({"instance_id": 1, "model_name": "llama-3-8b"}),
    );
    assert_eq!(s.get_json("/workers"), json!([]));
    assert_eq!(s.get_json("/dump"), json!({}));
}

#[test]
fn bad_input_gets_clear_errors() {
    let s = Server::start(&["--threads", "1"]);
    let reg = json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:5557", "model_name": "m", "block_size": 16});
    s.post_ok("/register", &reg);

    // Block size differs from the existing indexer's.
    let mut other = reg.clone();
    other["instance_id"] = json!(2);
    other["block_size"] = json!(32);
    let (st, v) = s.post_json("/register", &other);
    assert_eq!(st, 400, "{v}");
    assert!(error_of(&v).contains("block_size"), "{v}");

    // The same (instance, dp) twice.
    let (st, v) = s.post_json("/register", &reg);
    assert_eq!(st, 409, "{v}");

    // A missing field and a field of the wrong type are named.
    let (st, v) = s.post_json(
        "/register",
        &json!({"instance_id": 3, "model_name": "m", "block_size": 16}),
    );
    assert_eq!((st, v["field"].as_str()), (422, Some("endpoint")), "{v}");
    let (st, v) = s.post_json(
        "/register",
        &json!({"instance_id": 3, "endpoint": "tcp://127.0.0.1:1", "model_name": "m", "block_size": "16"}),
    );
    assert_eq!((st, v["field"].as_str()), (422, Some("block_size")), "{v}");
    // Token ids are read by a fast path; the error still names the element.
    for bad in [json!([1, "two"]), json!([1, -2])] {
        let (st, v) = s.post_json("/query", &json!({"token_ids": bad, "model_name": "m"}));
        assert_eq!((st, v["field"].as_str()), (422, Some("token_ids")), "{v}");
        assert!(error_of(&v).contains("element [1]"), "{v}");
    }
    let (st, v) = s.post_json("/query_by_hash", &json!({"model_name": "m"}));
    assert_eq!(
        (st, v["field"].as_str()),
        (422, Some("block_hashes")),
        "{v}"
    );

    // Not JSON at all.
    let (st, body) = s.call("POST", "/query", Some("{\"token_ids\": [1,"));
    assert_eq!(st, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(error_of(&v).contains("malformed JSON"), "{v}");
    let (st, _) = s.call("POST", "/register", None);
    assert_eq!(st, 400);

    // A bad ZMQ endpoint.
    let (st, v) = s.post_json(
        "/register",
        &json!({"instance_id": 4, "endpoint": "udp://x:1", "model_name": "m", "block_size": 16}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(error_of(&v).contains("udp"), "{v}");

    // Unknown model, tenant or instance.
    let (st, v) = s.post_json("/query", &json!({"token_ids": [1], "model_name": "nope"}));
    assert_eq!(st, 404, "{v}");
    assert!(error_of(&v).contains("nope"));
    let (st, _) = s.post_json(
        "/query_by_hash",
        &json!({"block_hashes": [1], "model_name": "m", "tenant_id": "t"}),
    );
    assert_eq!(st, 404);
    let (st, _) = s.post_json("/unregister", &json!({"instance_id": 9, "model_name": "m"}));
    assert_eq!(st, 404);

    // Routes and methods.
    assert_eq!(s.call("GET", "/query", None).0, 405);
    assert_eq!(s.call("PUT", "/health", None).0, 405);
    assert_eq!(s.call("GET", "/nope", None).0, 404);

    // After all that the server still answers.
    let (st, _) = s.post_json("/query", &json!({"token_ids": [1], "model_name": "m"}));
    assert_eq!(st, 200);
    let log = s.stop();
    assert!(!log.contains("panicked"), "{log}");
}

/// kvix turns transparent huge pages off for itself (its tables are written at
/// random positions, so a huge page would be resident whole for one entry), unless
/// mimalloc's `MIMALLOC_ALLOW_THP` asks for them.
#[test]
fn transparent_huge_pages_are_off_unless_asked_for() {
    let thp = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:").map(|v| v.trim().to_string()))
    };
    let s = Server::start(&["--threads", "1"]);
    let Some(off) = thp(s.pid()) else {
        return; // a kernel without the field (before 6.x) cannot say
    };
    assert_eq!(off, "0");
    drop(s);

    let log = std::env::temp_dir().join(format!("kvix-thp-{}.log", std::process::id()));
    let mut child = std::process::Command::new(support::kvix_bin())
        .args(["--host", "127.0.0.1", "--port", "0", "--threads", "1"])
        .env("MIMALLOC_ALLOW_THP", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&log).unwrap().contains("listening") {
        assert!(std::time::Instant::now() < deadline, "kvix did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let on = thp(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(on.as_deref(), Some("1"));
}
