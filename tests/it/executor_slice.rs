//! An executor's time slice while requests come: the executor shortens it for a
//! request and gives it back once requests stop. The slice is the server's own
//! setting, so other tests running beside this one do not disturb it (unlike the
//! executor's polling, `tests/executor_spin.rs`).

use crate::support::Server;
use kvix::runtime::slice::shown;
use serde_json::json;
use std::time::{Duration, Instant};

const MODEL: &str = "m";

/// Every thread of the process with its name and its time slice as `/proc` shows
/// them; none where the kernel does not show slices.
fn slices(pid: u32) -> Option<Vec<(String, Duration)>> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| {
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((name.trim().to_string(), shown(&t.path())?))
        })
        .collect()
}

/// The threads running on a 150 µs slice.
fn on_short(pid: u32) -> Vec<String> {
    slices(pid)
        .unwrap()
        .into_iter()
        .filter(|(_, s)| *s == Duration::from_micros(150))
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn an_executor_runs_on_a_short_slice_while_requests_come_and_on_the_default_after() {
    let s = Server::start(&["--threads", "1", "--slice-us", "150"]);
    let query = json!({"token_ids": (0..64).collect::<Vec<u32>>(), "model_name": MODEL});
    s.post_json("/query", &query);
    if slices(s.pid()).is_none() {
        eprintln!("this kernel does not show se.slice: nothing to check");
        return;
    }
    // The one executor, and no other thread (its blocking thread, the ingest
    // threads, the main thread), runs on the short slice.
    let short = on_short(s.pid());
    assert!(
        short.len() == 1 && short[0].starts_with("kvix-core"),
        "threads on the 150 µs slice after a query: {short:?}"
    );
    // No request for a second: the default comes back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !on_short(s.pid()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the executor kept its short slice 10 s after the last request"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the next request shortens it again.
    s.post_json("/query", &query);
    assert_eq!(on_short(s.pid()).len(), 1, "short again after a query");
}
