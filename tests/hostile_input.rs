//! Nothing a client, a publisher or an operator's flag can send wedges kvix: hostile
//! input against the real binary over real HTTP and ZMQ on 127.0.0.1.

mod common;

use common::{Publisher, Server, stored};
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
