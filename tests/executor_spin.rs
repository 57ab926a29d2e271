//! An executor's polling between queries, in a test binary of its own: the other
//! black-box tests (`tests/it`) load the cores, and a client the scheduler holds
//! back for longer than `--spin-us` lets the executor park whatever it does. Cargo
//! runs test binaries one after another, so this one runs alone.

// The black-box harness of `tests/it`.
#[path = "it/support/mod.rs"]
mod support;

use serde_json::json;
use std::time::Duration;
use support::Server;

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
#[cfg_attr(
    not(feature = "perf-checks"),
    ignore = "a scheduling figure: cargo test --features perf-checks --test executor_spin"
)]
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
