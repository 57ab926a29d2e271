//! Gap replay over real sockets: an engine drops chosen sequence numbers; kvix asks the
//! engine's replay ROUTER (vLLM's protocol) for them, holds live frames meanwhile, and
//! ends with the same `/dump` and query answers as a replica that lost nothing.

use crate::support::{
    self, Engine, ReservedPort, Server, Workload, dump_set, register, register_with, same_answers,
    wait_same_dump,
};
use serde_json::json;
use std::time::Duration;

const MODEL: &str = "m";

#[test]
fn dropped_batches_are_replayed_and_answers_match_a_lossless_run() {
    let ctx = zmq::Context::new();
    let lossy = Server::start(&["--threads", "2"]);
    let lossless = Server::start(&["--threads", "2"]);
    let mut e_lossy = Engine::start(&ctx);
    let mut e_ok = Engine::start(&ctx);
    let replay = json!({"replay_endpoint": e_lossy.replay_endpoint});
    register_with(&lossy, MODEL, 1, &e_lossy.publisher, replay);
    register(&lossless, MODEL, 1, &e_ok.publisher);
    // Dropped: two single frames, a run of three, and frames just before a replay-slow
    // window so live frames arrive while the replay is in flight.
    e_lossy.drop = [3, 10, 11, 12, 25, 40].into_iter().collect();
    e_lossy
        .replay_delay_ms
        .store(200, std::sync::atomic::Ordering::Relaxed);
    let mut w = Workload::new(7, 1000);
    for _ in 0..60 {
        let p = w.next();
        e_lossy.publish(&p);
        e_ok.publish(&p);
    }
    wait_same_dump(&lossy, &lossless, MODEL);
    same_answers(&lossy, &lossless, MODEL, &w.prompts(10));
    // Counted and logged. The slow first replay returns everything published by then,
    // so the live frames held meanwhile (and the later drops) are duplicates, skipped.
    let gaps = lossy.metric("kvix_sequence_gaps_total", &[]);
    assert!(gaps >= 1.0, "{gaps}");
    assert!(lossy.metric("kvix_replayed_batches_total", &[]) >= 6.0);
    assert!(lossy.metric("kvix_replay_duplicates_total", &[]) >= 1.0);

    // Paced, with a prompt engine: each drop is its own gap and its own replay.
    e_lossy
        .replay_delay_ms
        .store(0, std::sync::atomic::Ordering::Relaxed);
    e_lossy.drop = [62, 70, 71, 80].into_iter().collect();
    for _ in 60..90 {
        let p = w.next();
        e_lossy.publish(&p);
        e_ok.publish(&p);
        std::thread::sleep(Duration::from_millis(15));
    }
    wait_same_dump(&lossy, &lossless, MODEL);
    same_answers(&lossy, &lossless, MODEL, &w.prompts(10));
    assert_eq!(lossy.metric("kvix_sequence_gaps_total", &[]), gaps + 3.0);
    assert_eq!(lossless.metric("kvix_sequence_gaps_total", &[]), 0.0);
    let log = lossy.log();
    assert!(log.contains("sequence gap"), "{log}");
    assert!(log.contains("replayed missed batches"), "{log}");
    assert!(
        e_lossy
            .replay_requests
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 4
    );

    // last_seq survives unregister/register: batches published while the worker was
    // unregistered are replayed on the first frame the new listener hears.
    lossy.post_ok(
        "/unregister",
        &json!({"instance_id": 1, "model_name": MODEL}),
    );
    lossless.post_ok(
        "/unregister",
        &json!({"instance_id": 1, "model_name": MODEL}),
    );
    let mut w2 = Workload::new(8, 50_000);
    let lost: Vec<Vec<u8>> = (0..5).map(|_| w2.next()).collect();
    for p in &lost {
        e_lossy.lose(p);
    }
    let gaps = lossy.metric("kvix_sequence_gaps_total", &[]);
    let replay = json!({"replay_endpoint": e_lossy.replay_endpoint});
    register_with(&lossy, MODEL, 1, &e_lossy.publisher, replay);
    register(&lossless, MODEL, 1, &e_ok.publisher);
    for p in &lost {
        e_ok.publish(p);
    }
    let p = w2.next();
    e_lossy.publish(&p);
    e_ok.publish(&p);
    wait_same_dump(&lossy, &lossless, MODEL);
    same_answers(&lossy, &lossless, MODEL, &w2.prompts(5));
    assert_eq!(lossy.metric("kvix_sequence_gaps_total", &[]), gaps + 1.0);
}

#[test]
fn an_engine_that_never_answers_leaves_the_gap_counted_not_recovered() {
    let ctx = zmq::Context::new();
    let s = Server::start(&["--threads", "2"]);
    let mut e = Engine::start(&ctx);
    // A replay endpoint nobody serves: requests time out, live frames go on.
    let dead = ReservedPort::new();
    let mut body = json!({
        "instance_id": 1, "endpoint": e.endpoint(), "model_name": MODEL, "block_size": 4,
        "replay_endpoint": dead.endpoint(),
    });
    s.post_ok("/register", &body);
    e.publisher.wait_subscriber();
    body["instance_id"] = json!(1);
    e.drop.insert(1);
    let mut w = Workload::new(3, 0);
    for _ in 0..3 {
        e.publish(&w.next());
    }
    s.eventually("gap given up", || {
        let f = s.metric("kvix_replay_failures_total", &[]);
        if f == 1.0 {
            Ok(())
        } else {
            Err(format!("{f}"))
        }
    });
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 1.0);
    assert!(s.log().contains("gap not recovered"));
    let (rows, _) = dump_set(&s, MODEL);
    assert!(!rows.is_empty());
}

/// An engine has published batches 0-9 (its replay ROUTER holds them) when kvix
/// registers it; its next live batch is 10. As Dynamo, kvix treats a first sequence
/// above 0 as missing batches from 0, replays them, and holds all 11 batches.
#[test]
fn a_cold_start_replays_the_engines_buffer_from_zero() {
    let ctx = zmq::Context::new();
    let s = Server::start(&["--threads", "2"]);
    let reference = Server::start(&["--threads", "2"]);
    let mut e = Engine::start(&ctx);
    let mut e_ok = Engine::start(&ctx);
    register(&reference, MODEL, 1, &e_ok.publisher);
    let mut w = Workload::new(21, 0);
    for _ in 0..10 {
        let p = w.next();
        e.lose(&p);
        e_ok.publish(&p);
    }
    let replay = json!({"replay_endpoint": e.replay_endpoint});
    register_with(&s, MODEL, 1, &e.publisher, replay);
    let p = w.next();
    assert_eq!(e.publish(&p), 10);
    e_ok.publish(&p);
    wait_same_dump(&s, &reference, MODEL);
    same_answers(&s, &reference, MODEL, &w.prompts(11));
    assert_eq!(s.metric("kvix_replay_cold_starts_total", &[]), 1.0);
    // The buffer holds the live batch too: replayed, and the live frame skipped.
    assert_eq!(s.metric("kvix_replayed_batches_total", &[]), 11.0);
    assert_eq!(s.metric("kvix_replay_duplicates_total", &[]), 1.0);
    // Not a gap in a stream kvix followed, and nothing was out of the buffer.
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 0.0);
    assert_eq!(s.metric("kvix_replay_unrecovered_batches_total", &[]), 0.0);

    // A buffer that no longer starts at 0: what it lacks is counted and logged.
    let s2 = Server::start(&["--threads", "2"]);
    let mut e2 = Engine::start(&ctx);
    e2.keep = 3;
    let mut w2 = Workload::new(22, 0);
    for _ in 0..10 {
        e2.lose(&w2.next());
    }
    let replay = json!({"replay_endpoint": e2.replay_endpoint});
    register_with(&s2, MODEL, 1, &e2.publisher, replay);
    e2.publish(&w2.next());
    s2.eventually("short replay counted", || {
        let n = s2.metric("kvix_replay_unrecovered_batches_total", &[]);
        (n > 0.0).then_some(()).ok_or(format!("{n}"))
    });
    assert!(s2.log().contains("replay incomplete"));
    assert_eq!(s2.metric("kvix_sequence_gap_batches_total", &[]), 0.0);
}

/// An engine's counter going back (vLLM numbers from 0 at every start) is a
/// restart: the engine's blocks are kept, its stream starts over at the new number,
/// and the frame is indexed. `u64::MAX` then 0, 1, 2: one restart, no gap, all four
/// batches held; jumps near `u64::MAX` saturate the missing-batch counter, which
/// never goes down.
#[test]
fn a_sequence_that_goes_back_is_a_restart_and_nothing_wraps() {
    let ctx = zmq::Context::new();
    let s = Server::start(&["--threads", "2"]);
    let reference = Server::start(&["--threads", "2"]);
    let [p] = support::workers::<1>(&s, &ctx, MODEL);
    let [mut p_ok] = support::workers::<1>(&reference, &ctx, MODEL);
    let mut w = Workload::new(31, 0);
    for seq in [u64::MAX, 0, 1, 2] {
        let b = w.next();
        p.send_seq(seq, &b);
        p_ok.send(&b);
    }
    wait_same_dump(&s, &reference, MODEL);
    same_answers(&s, &reference, MODEL, &w.prompts(4));
    assert_eq!(s.metric("kvix_sequence_restarts_total", &[]), 1.0);
    assert_eq!(s.metric("kvix_sequence_gaps_total", &[]), 0.0);
    assert!(s.log().contains("engine restarted"));

    // 2 → MAX misses MAX - 3 batches; 0 restarts; 0 → MAX misses MAX - 1 more: the
    // total stops at u64::MAX instead of wrapping.
    let mut seen = 0.0;
    for (i, seq) in [u64::MAX, 0, u64::MAX].into_iter().enumerate() {
        let b = w.next();
        p.send_seq(seq, &b);
        p_ok.send(&b);
        let want = i as f64 + 5.0;
        s.eventually("frame counted", || {
            let n = s.metric("kvix_batches_received_total", &[]);
            (n == want).then_some(()).ok_or(format!("{n}"))
        });
        let missing = s.metric("kvix_sequence_gap_batches_total", &[]);
        assert!(missing >= seen, "{missing} < {seen}");
        seen = missing;
    }
    assert_eq!(seen, u64::MAX as f64);
    assert_eq!(s.metric("kvix_sequence_restarts_total", &[]), 2.0);
    wait_same_dump(&s, &reference, MODEL);
}

/// An engine that restarts right after a replay: the replay covered live frames up
/// to 9, which were then skipped as duplicates, and the restarted engine's 0, 1, 2
/// are no such duplicates: a restart, applied.
#[test]
fn a_restart_right_after_a_replay_is_not_taken_for_duplicates() {
    let ctx = zmq::Context::new();
    let s = Server::start(&["--threads", "2"]);
    let reference = Server::start(&["--threads", "2"]);
    let mut e = Engine::start(&ctx);
    let [mut p_ok] = support::workers::<1>(&reference, &ctx, MODEL);
    register_with(
        &s,
        MODEL,
        1,
        &e.publisher,
        json!({"replay_endpoint": e.replay_endpoint}),
    );
    // The replay of the gap at 5 answers late, with everything up to 9.
    e.replay_delay_ms
        .store(300, std::sync::atomic::Ordering::Relaxed);
    e.drop.insert(5);
    let mut w = Workload::new(41, 0);
    for _ in 0..10 {
        let b = w.next();
        e.publish(&b);
        p_ok.send(&b);
    }
    s.eventually("the gap replayed and the queued frames skipped", || {
        let d = s.metric("kvix_replay_duplicates_total", &[]);
        (d >= 3.0).then_some(()).ok_or(format!("{d}"))
    });
    e.restart();
    e.drop.clear();
    for _ in 0..3 {
        let b = w.next();
        e.publish(&b);
        p_ok.send_seq(0, &b);
    }
    wait_same_dump(&s, &reference, MODEL);
    same_answers(&s, &reference, MODEL, &w.prompts(13));
    assert_eq!(s.metric("kvix_sequence_restarts_total", &[]), 1.0);
}
