//! Local snapshots over real sockets and the real binary: kill -9 under load, restart
//! from the snapshot, and the state equals the last snapshot plus the engine's replay
//! (checked against a replica that saw everything). A corrupt or truncated snapshot is
//! rejected whole with a clear log line. SIGTERM writes a final snapshot and exits 0.

use crate::support::{
    self, Engine, Server, Workload, dump_set, register_with, same_answers, wait_same_dump,
};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

const MODEL: &str = "m";

/// The registration fields that point kvix at `e`'s replay ROUTER.
fn replay(e: &Engine) -> serde_json::Value {
    json!({"replay_endpoint": e.replay_endpoint})
}

fn snap_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvix-snap-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

/// kvix on two threads with its snapshot at `path`, written every `interval`
/// seconds (0: only on SIGTERM).
fn snapshotting(path: &str, interval: &str) -> Server {
    Server::start(&[
        "--threads",
        "2",
        "--snapshot-path",
        path,
        "--snapshot-interval",
        interval,
    ])
}

/// An engine with a replay buffer, registered as worker 1 of a kvix that writes its
/// snapshot to a fresh file `name` on SIGTERM only; and that file's path.
fn engine_and_snapshotting(ctx: &zmq::Context, name: &str) -> (Engine, Server, PathBuf) {
    let path = snap_path(name);
    let e = Engine::start(ctx);
    let s = snapshotting(path.to_str().unwrap(), "0");
    register_with(&s, MODEL, 1, &e.publisher, replay(&e));
    (e, s, path)
}

fn snapshots(s: &Server) -> f64 {
    s.metric("kvix_snapshots_written_total", &[])
}

#[test]
fn kill_9_then_restart_from_snapshot_plus_replay() {
    let ctx = zmq::Context::new();
    let path = snap_path("kill9.snap");
    let p = path.to_str().unwrap();
    let mut e = Engine::start(&ctx);
    let reference = Server::start(&["--threads", "2"]);
    let s = snapshotting(p, "0.2");
    register_with(&reference, MODEL, 1, &e.publisher, replay(&e));
    register_with(&s, MODEL, 1, &e.publisher, replay(&e));
    let mut w = Workload::new(11, 0);
    for _ in 0..200 {
        e.publish(&w.next());
    }
    wait_same_dump(&s, &reference, MODEL);
    // Let at least two snapshots cover that state, then keep loading and kill -9 mid-way.
    let n0 = snapshots(&s);
    s.eventually("two more snapshots", || {
        let n = snapshots(&s);
        if n >= n0 + 2.0 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    let mut s = Some(s);
    for i in 0..300 {
        e.publish(&w.next());
        if i == 150 {
            s.take().unwrap().stop(); // SIGKILL
        }
    }
    // Published while the replica is down: only the engine's replay buffer has these.
    for _ in 0..100 {
        e.publish(&w.next());
    }
    let t0 = std::time::Instant::now();
    let s2 = snapshotting(p, "0");
    s2.wait_log("loaded snapshot");
    s2.wait_log("recovery done");
    eprintln!("restart to recovered: {:?}", t0.elapsed());
    // The workers came back from the snapshot (no /register), and caught up via replay.
    assert_eq!(s2.get_json("/workers")[0]["instance_id"], json!(1));
    wait_same_dump(&s2, &reference, MODEL);
    same_answers(&s2, &reference, MODEL, &w.prompts(20));
    assert!(s2.metric("kvix_replayed_batches_total", &[]) >= 100.0);
    // Live frames keep applying on top.
    for _ in 0..20 {
        e.publish(&w.next());
    }
    wait_same_dump(&s2, &reference, MODEL);

    // SIGTERM: final snapshot, exit 0; the file then loads into the same state.
    let before = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (code, log) = s2.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("snapshot written"), "{log}");
    assert!(std::fs::metadata(&path).unwrap().modified().unwrap() > before);
    let s3 = snapshotting(p, "0");
    wait_same_dump(&s3, &reference, MODEL);
}

#[test]
fn corrupt_or_truncated_snapshots_are_rejected_whole() {
    let ctx = zmq::Context::new();
    let (mut e, s, path) = engine_and_snapshotting(&ctx, "corrupt.snap");
    let p = path.to_str().unwrap();
    let mut w = Workload::new(5, 0);
    for _ in 0..50 {
        e.publish(&w.next());
    }
    s.eventually("applied", || {
        let (rows, _) = dump_set(&s, MODEL);
        if rows.len() > 20 {
            Ok(())
        } else {
            Err(format!("{}", rows.len()))
        }
    });
    let (code, log) = s.terminate();
    assert_eq!(code, Some(0), "{log}");
    let good = std::fs::read(&path).unwrap();

    for (what, bad) in [
        ("checksum mismatch", {
            let mut b = good.clone();
            let i = b.len() / 2;
            b[i] ^= 0x40;
            b
        }),
        ("truncated", good[..good.len() - 7].to_vec()),
        ("not a kvix snapshot", b"garbage".to_vec()),
    ] {
        std::fs::write(&path, &bad).unwrap();
        let s = snapshotting(p, "0");
        s.wait_log("snapshot rejected");
        s.wait_log("recovery done");
        let log = s.log();
        assert!(log.contains(what), "{what}: {log}");
        // Nothing half-applied: no index, no worker.
        assert_eq!(s.get_json("/dump"), json!({}));
        assert_eq!(s.get_json("/workers"), json!([]));
        assert_eq!(s.metric("kvix_snapshots_rejected_total", &[]), 1.0);
        // SIGTERM writes a fresh snapshot; the refused one is kept aside, intact.
        let (code, log) = s.terminate();
        assert_eq!(code, Some(0), "{log}");
        assert!(log.contains("snapshot written"), "{log}");
        let kept = rejected_beside(&path);
        assert!(
            kept.iter().any(|k| std::fs::read(k).unwrap() == bad),
            "{what}: the refused bytes are not kept aside: {kept:?}"
        );
        assert_ne!(std::fs::read(&path).unwrap(), bad);
    }
}

/// The files a refused snapshot at `path` was moved to (`<path>.rejected-*`).
fn rejected_beside(path: &std::path::Path) -> Vec<PathBuf> {
    let name = format!("{}.rejected-", path.file_name().unwrap().to_str().unwrap());
    std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&name))
        .collect()
}

/// Figures for the README: snapshot write and warm restart with ~1M blocks.
/// `cargo test --release --test it snapshot:: -- --ignored --nocapture`
#[test]
#[ignore]
fn million_blocks_write_and_warm_restart() {
    let ctx = zmq::Context::new();
    let (mut e, s, path) = engine_and_snapshotting(&ctx, "million.snap");
    let p = path.to_str().unwrap();
    const CHAINS: u64 = 10_000;
    const LEN: u64 = 100;
    for c in 0..CHAINS {
        let hashes: Vec<u64> = (0..LEN).map(|i| c * LEN + i + 1).collect();
        let tokens: Vec<u32> = (0..LEN as u32 * 4).map(|i| (c as u32) << 12 | i).collect();
        e.publish(&support::stored(&hashes, None, &tokens, 4));
    }
    let want = (CHAINS * LEN) as f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while s.metric("kvix_shard_blocks", &[]) < want {
        assert!(std::time::Instant::now() < deadline, "{}", s.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, log) = s.terminate();
    assert_eq!(code, Some(0));
    let line = log
        .lines()
        .find(|l| l.contains("snapshot written"))
        .unwrap()
        .to_string();
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!("WRITE: {line}\nsize: {size} bytes");
    let t0 = std::time::Instant::now();
    let s2 = snapshotting(p, "0");
    let healthy = t0.elapsed();
    s2.wait_log("recovery done");
    let recovered = t0.elapsed();
    let log = s2.log();
    let line = log
        .lines()
        .find(|l| l.contains("loaded snapshot"))
        .unwrap()
        .to_string();
    eprintln!("LOAD: {line}\nhealthy after {healthy:?}, recovered after {recovered:?}");
    assert_eq!(s2.metric("kvix_shard_blocks", &[]), want);
}
