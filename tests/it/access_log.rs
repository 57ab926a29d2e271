//! The access log over real HTTP: one JSON line per request with Dynamo 1.6's
//! fields, `/metrics` left out, and logrotate's move + `POST /reopen_logs`.

use crate::support::{self, Server, agent};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// The lines of `path` once it holds at least `n` of them.
fn lines(path: &Path, n: usize) -> Vec<Value> {
    lines_but_ready(path, n, true)
}

/// The lines of `path` once it holds at least `n` of them (counting the harness's
/// `/ready` polls at start only if `count_ready`).
fn lines_but_ready(path: &Path, n: usize, count_ready: bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let counted = v
            .iter()
            .filter(|l| count_ready || l["path"] != "/ready")
            .count();
        if counted >= n {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{} holds {} lines, not {n}:\n{text}",
            path.display(),
            v.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// POST `body` to `path` with a `header` of `trace`; the status.
fn post_traced(s: &Server, path: &str, header: &str, trace: &str, body: &Value) -> u16 {
    agent(Some(Duration::from_secs(20)))
        .post(format!("{}{path}", s.base))
        .header(header, trace)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap()
        .status()
        .as_u16()
}

#[test]
fn access_log_lines_and_reopen_after_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let s = Server::start(&[
        "--threads",
        "2",
        "--access-log",
        path.to_str().unwrap(),
        "--trace-id-header",
        "x-request-trace",
    ]);
    let q = json!({"token_ids": [1, 2, 3, 4], "model_name": "no-such-model"});
    assert_eq!(
        post_traced(&s, "/query", "x-request-trace", "abc-123", &q),
        404
    );
    let c = json!({"model": "conductor-model", "token_ids": [1, 2]});
    assert_eq!(
        post_traced(&s, "/conductor/query", "x-other", "ignored", &c),
        404
    );
    assert_eq!(s.call("GET", "/metrics", None).0, 200);
    assert_eq!(s.call("GET", "/nowhere/at/all", None).0, 404);
    assert_eq!(s.call("GET", "/workers", None).0, 200);

    // The harness's /ready polls at start come first; the requests above follow.
    let all = lines_but_ready(&path, 4, false);
    let ours: Vec<&Value> = all.iter().filter(|l| l["path"] != "/ready").collect();
    assert_eq!(ours.len(), 4, "{all:#?}");
    let q = ours[0];
    assert_eq!(
        (
            &q["trace_id"],
            &q["method"],
            &q["path"],
            &q["model"],
            &q["status"]
        ),
        (
            &json!("abc-123"),
            &json!("POST"),
            &json!("/query"),
            &json!("no-such-model"),
            &json!(404)
        ),
        "{q}"
    );
    let ts = q["ts"].as_str().unwrap();
    // RFC 3339, UTC, milliseconds: 2026-11-27T14:14:09.123Z
    assert_eq!(ts.len(), 24, "{ts}");
    assert!(ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "{ts}");
    let ms = q["duration_ms"].as_f64().unwrap();
    assert!((0.0..20_000.0).contains(&ms), "{q}");
    let c = ours[1];
    assert_eq!(
        (&c["trace_id"], &c["path"], &c["model"]),
        (
            &json!("-"),
            &json!("/conductor/query"),
            &json!("conductor-model")
        ),
        "{c}"
    );
    // /metrics is not logged; a path kvix does not serve is logged as `unknown`.
    assert_eq!(
        (&ours[2]["path"], &ours[2]["status"]),
        (&json!("unknown"), &json!(404))
    );
    assert_eq!(
        (&ours[3]["path"], &ours[3]["model"], &ours[3]["method"]),
        (&json!("/workers"), &json!("-"), &json!("GET"))
    );
    let before = all.len();

    // logrotate: move the file, ask kvix to reopen, and new lines go to a new file.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    let v = s.post_ok("/reopen_logs", &json!({}));
    assert_eq!(v, json!({"status": "ok", "reopened": true}));
    let q = json!({"token_ids": [5, 6, 7, 8], "model_name": "after-rotation"});
    assert_eq!(post_traced(&s, "/query", "x-request-trace", "t-2", &q), 404);
    let new = lines(&path, 2);
    let last = new.last().unwrap();
    assert_eq!(
        (&last["model"], &last["trace_id"]),
        (&json!("after-rotation"), &json!("t-2")),
        "{new:#?}"
    );
    assert!(new.iter().any(|l| l["path"] == "/reopen_logs"), "{new:#?}");
    // The moved file kept what was written before, and got nothing after the reopen.
    let old = lines(&rotated, before);
    assert_eq!(old.len(), before);
    assert!(old.iter().all(|l| l["model"] != "after-rotation"));
    assert_eq!(s.metric("kvix_access_log_dropped_total", &[]), 0.0);
    assert!(s.metric("kvix_access_log_lines_total", &[]) >= (before + 2) as f64);
}

#[test]
fn local_time_carries_an_offset_and_no_log_means_nothing_to_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let _s = Server::start(&[
        "--threads",
        "1",
        "--access-log",
        path.to_str().unwrap(),
        "--access-log-local-time",
    ]);
    let ts = lines(&path, 1)[0]["ts"].as_str().unwrap().to_string();
    // 2026-11-27T14:14:09.123+00:00
    assert_eq!(ts.len(), 29, "{ts}");
    assert!(matches!(ts.as_bytes()[23], b'+' | b'-'), "{ts}");

    let plain = Server::start(&["--threads", "1"]);
    let v = plain.post_ok("/reopen_logs", &json!({}));
    assert_eq!(v, json!({"status": "ok", "reopened": false}));
}

#[test]
fn an_unwritable_access_log_stops_kvix_with_a_message() {
    let out = std::process::Command::new(support::kvix_bin())
        .args(["--port", "0", "--access-log", "/nonexistent-dir/access.log"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--access-log /nonexistent-dir/access.log"),
        "{err}"
    );
}
