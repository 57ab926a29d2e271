//! An executor's polling between queries, alone in its binary: the other black-box
//! tests load both cores, and a client the scheduler holds back for longer than
//! `--spin-us` lets the executor park whatever it does.

mod common;

use common::Server;
use serde_json::json;
use std::time::Duration;

const MODEL: &str = "m";

/// Context switches of the executor threads (`kvix-core-*`): (voluntary,
/// involuntary). An executor switches voluntarily only to park; involuntarily when
/// another thread takes its core, which also ends its polling until the next query.
fn executor_switches(pid: u32) -> (u64, u64) {
    let field = |status: &str, name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("kvix-core"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|status| {
            (
                field(&status, "voluntary_ctxt_switches:"),
                field(&status, "nonvoluntary_ctxt_switches:"),
            )
        })
        .fold((0, 0), |(v, i), (dv, di)| (v + dv, i + di))
}

#[test]
fn an_executor_polls_while_queries_come_and_parks_once_they_stop() {
    let s = Server::start(&["--threads", "1", "--spin-us", "2000"]);
    let query = json!({"token_ids": (0..64).collect::<Vec<u32>>(), "model_name": MODEL});
    s.post_json("/query", &query);
    // One keep-alive connection, one query after another: the executor sees the next
    // one well within --spin-us of the last, so it should never park between them.
    let n = 2000;
    let (parks, taken) = executor_switches(s.pid());
    for _ in 0..n {
        s.post_json("/query", &query);
    }
    let (parks_after, taken_after) = executor_switches(s.pid());
    // A park that follows another thread taking the core (this client, a leftover
    // process, a kernel thread) is what the executor should do; any other park
    // between back-to-back queries is a failure to poll.
    let (while_busy, taken) = (parks_after - parks, taken_after - taken);
    assert!(
        while_busy < n / 20 + taken,
        "the executor parked {while_busy} times during {n} back-to-back queries \
         (its core taken {taken} times)"
    );
    // Quiet: it naps and parks instead of spinning on.
    let (parks, _) = executor_switches(s.pid());
    std::thread::sleep(Duration::from_millis(300));
    let while_quiet = executor_switches(s.pid()).0 - parks;
    assert!(
        while_quiet >= 10,
        "the executor parked only {while_quiet} times in 300 ms without queries"
    );
}

/// The time slices (ns) of the executor threads as `/proc` shows them; none where
/// the kernel does not show them.
fn executor_slices(pid: u32) -> Option<Vec<u64>> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("kvix-core"))
        })
        .map(|t| {
            std::fs::read_to_string(t.path().join("sched"))
                .ok()?
                .lines()
                .find_map(|l| {
                    l.strip_prefix("se.slice")?
                        .split(':')
                        .nth(1)?
                        .trim()
                        .parse()
                        .ok()
                })
        })
        .collect()
}

#[test]
fn an_executor_runs_on_a_short_slice_while_queries_come_and_on_the_default_after() {
    let s = Server::start(&["--threads", "1", "--slice-us", "150"]);
    let query = json!({"token_ids": (0..64).collect::<Vec<u32>>(), "model_name": MODEL});
    s.post_json("/query", &query);
    let Some(slices) = executor_slices(s.pid()) else {
        eprintln!("this kernel does not show se.slice: nothing to check");
        return;
    };
    // glommio names the executor and its blocking thread alike: the executor is the
    // one that took the slice.
    assert!(
        slices.contains(&150_000),
        "no executor thread runs on the 150 µs slice after a query: {slices:?}"
    );
    // No query for a second: the next heartbeat gives the default back.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while executor_slices(s.pid()).unwrap().contains(&150_000) {
        assert!(
            std::time::Instant::now() < deadline,
            "the executor kept its short slice 15 s after the last query"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
