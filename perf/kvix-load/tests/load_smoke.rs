//! Smoke test of the load tool against the real server: `kvix-load bench` on a
//! short trace must finish, see every event applied (its sentinels and the
//! indexer's tree sizes agree with its simulation) and get answers to every
//! query. No timing is enforced here; figures come from `perf/run.sh`.

// The service's black-box harness (server on a free port, its log).
#[path = "../../../tests/it/support/mod.rs"]
mod support;

use serde_json::Value;
use std::process::Command;
use support::Server;

#[test]
fn kvix_load_bench_runs_against_kvix() {
    let s = Server::start(&["--threads", "2"]);
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/mooncake_trace_head500.jsonl"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvix-load"))
        .args(["bench", "--url", &s.base, "--trace", trace])
        .args([
            "--requests",
            "150",
            "--workers-count",
            "4",
            "--capacity-blocks",
            "20000",
        ])
        .args([
            "--connections",
            "1,2",
            "--duration",
            "1",
            "--endpoint",
            "query,query-by-hash",
        ])
        .args(["--json", "--quiet"])
        .output()
        .expect("run kvix-load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kvix-load failed ({}):\n{stdout}\n{}\nserver log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    let r: Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    let ev = &r["events"];
    assert_eq!(ev["publish"]["all_sentinels_seen"], true, "{ev}");
    let live = ev["sim"]["live_pairs"].as_u64().unwrap();
    assert!(
        ev["sim"]["blocks_removed"].as_u64().unwrap() > 0,
        "LRU evicted: {ev}"
    );
    // One sentinel block per worker on top of the simulated live (block, worker) pairs.
    assert_eq!(
        ev["publish"]["indexer_tree_sizes_sum"].as_u64(),
        Some(live + 4)
    );
    let phases = r["queries"].as_array().unwrap();
    assert_eq!(phases.len(), 4);
    for q in phases {
        assert!(q["completed"].as_u64().unwrap() > 0, "{q}");
        assert_eq!(q["errors"], 0, "{q}");
        assert!(q["hits"].as_u64().unwrap() > 0, "{q}");
    }
}

/// A fresh clone: `kvix-load bench --url URL` and nothing else, run from a folder
/// with no trace in reach, runs the generated workload to the end.
#[test]
fn bench_runs_with_nothing_but_the_url() {
    let s = Server::start(&["--threads", "2"]);
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvix-load"))
        .current_dir(elsewhere.path())
        .args(["bench", "--url", &s.base])
        .output()
        .expect("run kvix-load");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "kvix-load failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        s.log()
    );
    assert!(stdout.contains("workload=SharedPrefix"), "{stdout}");

    // Asking for the trace without one is a clear error, not a missing file.
    let out = Command::new(env!("CARGO_BIN_EXE_kvix-load"))
        .current_dir(elsewhere.path())
        .args(["events", "--url", &s.base, "--workload", "trace"])
        .output()
        .expect("run kvix-load");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs --trace"), "{stderr}");
}
