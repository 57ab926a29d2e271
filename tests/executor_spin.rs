//! An executor's polling between queries, alone in its binary: the other black-box
//! tests load both cores, and a client the scheduler holds back for longer than
//! `--spin-us` lets the executor park whatever it does.

mod common;

use common::Server;
use serde_json::json;
use std::time::Duration;

const MODEL: &str = "m";

/// Times the executor threads (`kvix-core-*`) blocked: an executor blocks only to
/// park.
fn executor_parks(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("kvix-core"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

#[test]
fn an_executor_polls_while_queries_come_and_parks_once_they_stop() {
    let s = Server::start(&["--threads", "1", "--spin-us", "2000"]);
    let query = json!({"token_ids": (0..64).collect::<Vec<u32>>(), "model_name": MODEL});
    s.post_json("/query", &query);
    // One keep-alive connection, one query after another: the executor sees the next
    // one well within --spin-us of the last, so it should never park between them.
    let n = 2000;
    let parks = executor_parks(s.pid());
    for _ in 0..n {
        s.post_json("/query", &query);
    }
    let while_busy = executor_parks(s.pid()) - parks;
    assert!(
        while_busy < n / 20,
        "the executor parked {while_busy} times during {n} back-to-back queries"
    );
    // Quiet: it naps and parks instead of spinning on.
    let parks = executor_parks(s.pid());
    std::thread::sleep(Duration::from_millis(300));
    let while_quiet = executor_parks(s.pid()) - parks;
    assert!(
        while_quiet >= 10,
        "the executor parked only {while_quiet} times in 300 ms without queries"
    );
}
