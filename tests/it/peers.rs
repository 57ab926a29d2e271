//! P2P recovery over real sockets: replica B starts with `--peers` pointing at a loaded
//! replica A while A keeps ingesting; after convergence their `/dump`s are equal as sets.
//! Also: an unreachable peer (start empty, say so) and a Dynamo-shaped peer dump.

use crate::support::{
    Engine, ReservedPort, Server, Workload, dump_set, same_answers, stored, wait_same_dump,
    worker_flags,
};
use serde_json::json;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MODEL: &str = "m";

#[test]
fn replica_bootstraps_from_a_loaded_peer_while_it_keeps_ingesting() {
    let ctx = zmq::Context::new();
    let engines: Vec<Engine> = (0..2).map(|_| Engine::start(&ctx)).collect();
    let workers = format!("1={},2={}", engines[0].endpoint(), engines[1].endpoint());
    let a = Server::start(&worker_flags(MODEL, &workers, &[]));
    for e in &engines {
        e.publisher.wait_subscriber();
    }
    // Load: both engines publish continuously from here on.
    let stop = Arc::new(AtomicBool::new(false));
    let prompts = Arc::new(Mutex::new(Vec::new()));
    let load = {
        let (stop, prompts) = (stop.clone(), prompts.clone());
        std::thread::spawn(move || {
            let mut engines = engines;
            let mut ws = [Workload::new(1, 0), Workload::new(2, 1 << 40)];
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                for (e, w) in engines.iter_mut().zip(ws.iter_mut()) {
                    e.publish(&w.next());
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            *prompts.lock().unwrap() = ws.iter().flat_map(|w| w.prompts(10)).collect();
            (engines, n)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let b = Server::start(&worker_flags(MODEL, &workers, &["--peers", &a.base]));
    // B waits ~1 s after connecting, then fetches A's dump; keep loading past that.
    b.wait_log("recovered from peer");
    b.wait_log("recovery done");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (_engines, batches) = load.join().unwrap();
    assert!(batches > 100, "{batches}");
    wait_same_dump(&a, &b, MODEL);
    same_answers(&a, &b, MODEL, &prompts.lock().unwrap());
    assert!(b.metric("kvix_bootstrap_blocks_total", &[]) > 0.0);
    // /peers lists the peer; it can be removed and added again.
    assert_eq!(b.get_json("/peers"), json!([a.base]));
    b.post_ok("/deregister_peer", &json!({"url": a.base}));
    assert_eq!(b.get_json("/peers"), json!([]));
    b.post_ok("/register_peer", &json!({"url": a.base}));
    assert_eq!(b.get_json("/peers"), json!([a.base]));
}

/// kvix with engine `e` as worker 1 and `peer` as its one peer (waited for 100 ms).
fn started_with_peer(e: &Engine, peer: &str) -> Server {
    let workers = format!("1={}", e.endpoint());
    let s = Server::start(&worker_flags(
        MODEL,
        &workers,
        &["--peers", peer, "--peer-wait-ms", "100"],
    ));
    e.publisher.wait_subscriber();
    s
}

#[test]
fn unreachable_peers_mean_an_empty_start_said_in_the_log() {
    let ctx = zmq::Context::new();
    let mut e = Engine::start(&ctx);
    let dead = ReservedPort::new();
    let s = started_with_peer(&e, &dead.url());
    s.wait_log("no peer reachable");
    s.wait_log("recovery done");
    // Live events still apply afterwards.
    e.publish(&stored(&[1], None, &[1, 2, 3, 4], 4));
    s.eventually("live event applied", || {
        let (rows, _) = dump_set(&s, MODEL);
        if rows.len() == 1 {
            Ok(())
        } else {
            Err(format!("{rows:?}"))
        }
    });
}

/// A one-shot HTTP server answering every request with `body` (a Dynamo indexer stand-in).
fn fake_peer(body: String) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                body.len(),
                body
            );
        }
    });
    url
}

#[test]
fn bootstraps_from_a_dynamo_indexer_dump() {
    use kvix::hash::{block_seed, local_hash};
    let l = |t: &[u32]| local_hash(t, block_seed(None, None)).0;
    // Dynamo 1.6.1 shape: several blocks per stored event, engine (external) hashes,
    // plus removed/cleared events, a worker kvix does not listen to and another model.
    let dump = json!({
        "m:default": {"block_size": 4, "events": [
            {"worker_id": 1, "storage_tier": "device", "event": {"event_id": 0, "data": {"stored": {
                "parent_hash": null, "start_position": null,
                "blocks": [{"block_hash": 11, "tokens_hash": l(&[1, 2, 3, 4]), "mm_extra_info": null},
                           {"block_hash": 12, "tokens_hash": l(&[5, 6, 7, 8]), "mm_extra_info": null}]}},
                "dp_rank": 0}},
            {"worker_id": 1, "storage_tier": "host_pinned", "event": {"event_id": 1, "data": {"stored": {
                "parent_hash": 11, "blocks": [{"block_hash": 12, "tokens_hash": l(&[5, 6, 7, 8])}]}},
                "dp_rank": 0}},
            {"worker_id": 1, "event": {"event_id": 2, "data": {"removed": {"block_hashes": [99]}}, "dp_rank": 0}},
            {"worker_id": 1, "event": {"event_id": 3, "data": "cleared", "dp_rank": 0}},
            {"worker_id": 9, "storage_tier": "device", "event": {"event_id": 4, "data": {"stored": {
                "parent_hash": null, "blocks": [{"block_hash": 91, "tokens_hash": l(&[1, 2, 3, 4])}]}},
                "dp_rank": 0}}
        ]},
        "other:default": {"block_size": 16, "events": []}
    });
    let peer = fake_peer(dump.to_string());
    let ctx = zmq::Context::new();
    let mut e = Engine::start(&ctx);
    let s = started_with_peer(&e, &peer);
    s.wait_log("recovered from peer");
    s.wait_log("recovery done");
    // A live event whose parent is a block known only from the peer's dump resolves.
    e.publish(&stored(&[13], Some(12), &[9, 10, 11, 12], 4));
    let q = json!({"token_ids": (1..=12).collect::<Vec<u32>>(), "model_name": MODEL});
    s.wait_post_eq(
        "/query",
        &q,
        &json!({
            "scores": {"1": {"0": 12}},
            "frequencies": [1, 1, 1],
            "tree_sizes": {"1": {"0": 3}},
            "instances": {"1": {"longest_matched": 12, "gpu": 12, "dp": {"0": 12}, "cpu": 12, "disk": 12,
                 "effective": {"0": 12}, "hit": {"0": "full"}}}
        }),
    );
    let (rows, _) = dump_set(&s, MODEL);
    assert!(
        rows.iter().any(|r| r.2 == 12 && r.5 == "host_pinned"),
        "{rows:?}"
    );
    assert!(
        rows.iter().all(|r| r.0 == 1),
        "worker 9 is not listened to: {rows:?}"
    );
}
