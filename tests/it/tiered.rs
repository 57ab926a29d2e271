//! `/query_tiered_by_hash` over real ZMQ and HTTP, as Dynamo's router reads it: the
//! answer must deserialize into dynamo-kv-router 1.6.1's `WireTieredMatchDetails`
//! shape (mirrored here field for field, unknown fields refused) and agree with
//! `/query_by_hash`'s per-instance summary over the same events.

use crate::support::{self, Server, publishers, register, stored_on};
use kvix::hash::{block_seed, local_hash};
use serde::Deserialize;
use serde_json::{Value, json};

const MODEL: &str = "m";

/// dynamo-kv-router 1.6.1 `protocols::WorkerWithDpRank`.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[serde(deny_unknown_fields)]
struct WorkerWithDpRank {
    worker_id: u64,
    dp_rank: u32,
}

/// dynamo-kv-router 1.6.1 `protocols::StorageTier`.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum StorageTier {
    Device,
    HostPinned,
    Disk,
    External,
}

/// `indexer::types::WireOverlapScores`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct WireOverlapScores {
    scores: Vec<(WorkerWithDpRank, u32)>,
    frequencies: Vec<usize>,
}

/// `indexer::types::WireLowerTierMatchDetails`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct WireLowerTierMatchDetails {
    hits: Vec<(WorkerWithDpRank, usize)>,
}

/// `indexer::types::WireTieredMatchDetails`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct WireTieredMatchDetails {
    device: WireOverlapScores,
    lower_tier: Vec<(StorageTier, WireLowerTierMatchDetails)>,
}

/// What the router parses: the block size and the tiered details.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct TieredAnswer {
    block_size: u32,
    tiered: WireTieredMatchDetails,
}

fn w(worker_id: u64) -> WorkerWithDpRank {
    WorkerWithDpRank {
        worker_id,
        dp_rank: 0,
    }
}

fn sorted<T: Ord + Copy, N: Copy>(v: &[(T, N)]) -> Vec<(T, N)> {
    let mut v = v.to_vec();
    v.sort_by_key(|x| x.0);
    v
}

#[test]
fn tiered_lookup_as_dynamos_router_reads_it() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut p1, mut p2, mut p3, mut p4] = publishers(&ctx);
    for (i, p) in [&p1, &p2, &p3].into_iter().enumerate() {
        register(&s, MODEL, i as u64 + 1, p);
    }
    // A worker registered by name: Dynamo's router has no id for it.
    s.post_ok(
        "/register",
        &json!({"instance_id": "named", "endpoint": p4.endpoint, "model_name": MODEL, "block_size": 4}),
    );
    p4.wait_subscriber();
    let t: Vec<u32> = (1..=16).collect();
    let b = |i: usize| &t[4 * i..4 * i + 4];
    // Worker 1: device 0-1, host 2, disk 3. Worker 2: host 0-1. Worker 3: device 0,
    // an external store 1-2. The named worker: device 0-3.
    p1.send(&stored_on(&[10, 11], None, &t[..8], 4, None));
    p1.send(&stored_on(&[12], Some(11), b(2), 4, Some("CPU")));
    p1.send(&stored_on(&[13], Some(12), b(3), 4, Some("DISK")));
    p2.send(&stored_on(&[20, 21], None, &t[..8], 4, Some("CPU_PINNED")));
    p3.send(&stored_on(&[30], None, b(0), 4, None));
    p3.send(&stored_on(
        &[31, 32],
        Some(30),
        &t[4..12],
        4,
        Some("EXTERNAL"),
    ));
    p4.send(&stored_on(&[40, 41, 42, 43], None, &t, 4, None));

    let locals: Vec<i64> = (0..4)
        .map(|i| local_hash(b(i), block_seed(None, None)).0 as i64)
        .collect();
    let by_hash = json!({"block_hashes": locals, "model_name": MODEL});
    // Every live worker is listed in `tree_sizes`, holding or not: wait for the
    // blocks, 4 + 2 + 3 + 4 of them.
    s.eventually("every store applied", || {
        let v = s.post_json("/query_by_hash", &by_hash).1;
        let held: u64 = v["tree_sizes"]
            .as_object()
            .into_iter()
            .flat_map(|t| t.values())
            .filter_map(|dp| dp.as_object())
            .flat_map(|dp| dp.values())
            .filter_map(Value::as_u64)
            .sum();
        (held == 13).then_some(()).ok_or(v.to_string())
    });
    let body = json!({"block_hashes": locals, "model_name": MODEL, "routing_group": "default"});
    let (st, v) = s.post_json("/query_tiered_by_hash", &body);
    assert_eq!(st, 200, "{v}");
    let a: TieredAnswer = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert_eq!(a.block_size, 4);
    assert_eq!(sorted(&a.tiered.device.scores), vec![(w(1), 2), (w(3), 1)]);
    assert_eq!(a.tiered.device.frequencies, vec![2, 1]);
    let tiers: Vec<StorageTier> = a.tiered.lower_tier.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        tiers,
        [
            StorageTier::HostPinned,
            StorageTier::Disk,
            StorageTier::External
        ]
    );
    let hits = |k: usize| sorted(&a.tiered.lower_tier[k].1.hits);
    // Each tier extends where the one before stopped; a worker is listed from the
    // first tier it holds the first block on.
    assert_eq!(hits(0), vec![(w(1), 1), (w(2), 2), (w(3), 0)]);
    assert_eq!(hits(1), vec![(w(1), 1), (w(2), 0), (w(3), 0)]);
    assert_eq!(hits(2), vec![(w(1), 0), (w(2), 0), (w(3), 2)]);

    // The same details behind /query_by_hash's summary, in tokens: cpu = gpu + host
    // hits, disk = cpu + disk + external hits.
    let summary = s.post_json("/query_by_hash", &by_hash).1;
    for id in [1u64, 2, 3] {
        let i = &summary["instances"][id.to_string()];
        let device = sorted(&a.tiered.device.scores)
            .iter()
            .find(|(x, _)| x.worker_id == id)
            .map_or(0, |x| x.1 as usize);
        let of = |k: usize| hits(k).iter().find(|(x, _)| x.worker_id == id).unwrap().1;
        assert_eq!(i["gpu"], json!(4 * device), "{id}: {summary}");
        assert_eq!(i["cpu"], json!(4 * (device + of(0))), "{id}: {summary}");
        assert_eq!(
            i["disk"],
            json!(4 * (device + of(0) + of(1) + of(2))),
            "{id}: {summary}"
        );
    }

    // Device only, as an IndexerQueryRequest may ask.
    let mut only = body.clone();
    only["device_only"] = json!(true);
    let a: TieredAnswer =
        serde_json::from_value(s.post_json("/query_tiered_by_hash", &only).1).unwrap();
    assert!(a.tiered.lower_tier.is_empty());
    assert_eq!(sorted(&a.tiered.device.scores), vec![(w(1), 2), (w(3), 1)]);

    // A non-2xx makes the router treat the indexer as offline: say why.
    let (st, v) = s.post_json(
        "/query_tiered_by_hash",
        &json!({"block_hashes": [1], "model_name": "nope"}),
    );
    assert_eq!(st, 404, "{v}");
    let (st, v) = s.post_json("/query_tiered_by_hash", &json!({"model_name": MODEL}));
    assert_eq!((st, &v["field"]), (422, &json!("block_hashes")), "{v}");
}

/// Differential: the stores of `tests/data/dynamo_tiered_vectors.json` published
/// over ZMQ, and kvix's answer equal to what Dynamo's own tiered lookup (its radix
/// tree and lower-tier indexers, `scripts/dynamo_vectors --bin tiered`) gave for them.
#[test]
fn tiered_lookup_equals_dynamos() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/dynamo_tiered_vectors.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let block_size = v["block_size"].as_u64().unwrap() as usize;
    let tokens: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap();
    let locals: Vec<u64> = serde_json::from_value(v["local_block_hashes"].clone()).unwrap();
    for (i, l) in locals.iter().enumerate() {
        let b = &tokens[i * block_size..(i + 1) * block_size];
        assert_eq!(local_hash(b, block_seed(None, None)).0, *l, "block {i}");
    }
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let mut engines: Vec<((u64, u32), support::Publisher)> = Vec::new();
    let stores = v["stores"].as_array().unwrap();
    for st in stores {
        let key = (
            st["worker_id"].as_u64().unwrap(),
            st["dp_rank"].as_u64().unwrap() as u32,
        );
        if !engines.iter().any(|(k, _)| *k == key) {
            let p = support::Publisher::bind(&ctx);
            support::register_with(&s, MODEL, key.0, &p, json!({"dp_rank": key.1}));
            engines.push((key, p));
        }
        let p = &mut engines.iter_mut().find(|(k, _)| *k == key).unwrap().1;
        let hashes: Vec<u64> = serde_json::from_value(st["block_hashes"].clone()).unwrap();
        let first = st["first_block"].as_u64().unwrap() as usize;
        let t = &tokens[first * block_size..(first + hashes.len()) * block_size];
        let medium = match st["storage_tier"].as_str().unwrap() {
            "device" => None,
            "host_pinned" => Some("CPU_PINNED"),
            "disk" => Some("DISK"),
            "external" => Some("EXTERNAL"),
            other => panic!("tier {other}"),
        };
        let parent = st["parent_hash"].as_u64();
        p.send(&stored_on(&hashes, parent, t, block_size as u32, medium));
    }
    s.eventually("every store applied", || {
        let n = s.metric("kvix_events_applied_total", &[]);
        (n == stores.len() as f64)
            .then_some(())
            .ok_or(format!("{n}"))
    });
    let (st, got) = s.post_json(
        "/query_tiered_by_hash",
        &json!({"block_hashes": locals.iter().map(|&h| h as i64).collect::<Vec<_>>(),
                "model_name": MODEL, "routing_group": "default"}),
    );
    assert_eq!(st, 200, "{got}");
    let got: TieredAnswer = serde_json::from_value(got).unwrap();
    let want: WireTieredMatchDetails = serde_json::from_value(v["tiered"].clone()).unwrap();
    assert_eq!(got.block_size as usize, block_size);
    assert_eq!(
        sorted(&got.tiered.device.scores),
        sorted(&want.device.scores)
    );
    // Dynamo's tiered details leave the frequencies empty; kvix gives those of
    // /query_by_hash (Dynamo's find_matches), as a client reading them expects.
    assert!(want.device.frequencies.is_empty());
    let by_hash = s
        .post_json(
            "/query_by_hash",
            &json!({"block_hashes": locals, "model_name": MODEL}),
        )
        .1;
    assert_eq!(json!(got.tiered.device.frequencies), by_hash["frequencies"]);
    // Dynamo lists the tiers it has seen events for (all three here), in no order.
    let tier = |d: &WireTieredMatchDetails, t: StorageTier| {
        d.lower_tier
            .iter()
            .find(|(x, _)| *x == t)
            .map(|(_, h)| sorted(&h.hits))
    };
    for t in [
        StorageTier::HostPinned,
        StorageTier::Disk,
        StorageTier::External,
    ] {
        assert!(tier(&want, t).is_some(), "{t:?} in the vectors");
        assert_eq!(tier(&got.tiered, t), tier(&want, t), "{t:?}");
    }
    assert!(tier(&want, StorageTier::Device).is_none());
}
