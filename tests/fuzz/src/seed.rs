//! Writes the seed corpora of the fuzz targets, from what the repository already has:
//! the wire fixtures (`decode`), a snapshot image of a small State (`snapshot_load`),
//! dumps in Dynamo's and kvix's `/dump` shape (`dump_import`), and `--workers` /
//! `--peers` strings from README.md and the flags' help (`workers_flag`).
//!
//! Usage: `seed REPO_ROOT CORPUS_DIR`; writes `CORPUS_DIR/<target>/<name>`.

use kvix::ingest::feed::SeedBlock;
use kvix::recovery::{IndexState, ListenerState, State, WorkerBlocks, snapshot};
use kvix::registry::Endpoint;
use kvix::types::{BlockHash, EngineHash, SeqHash, Tier};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Snapshot header: magic, version, body length, checksum (see snapshot.rs).
const SNAPSHOT_HEADER: usize = 8 + 4 + 8 + 8;

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [root, out] = &args[..] else {
        eprintln!("usage: seed REPO_ROOT CORPUS_DIR");
        std::process::exit(2);
    };
    let mut total = 0;
    for (target, seeds) in [
        ("decode", wire_seeds(root)),
        ("snapshot_load", snapshot_seeds()),
        ("dump_import", dump_seeds()),
        ("workers_flag", flag_seeds(root)),
    ] {
        let dir = out.join(target);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (name, bytes) in &seeds {
            let p = dir.join(format!("seed-{name}"));
            std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
        println!("{target}: {} seeds in {}", seeds.len(), dir.display());
        total += seeds.len();
    }
    assert!(total > 0);
}

fn read(root: &Path, rel: &str) -> String {
    let p = root.join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every frame of tests/data/wire_fixtures.json (`{name: hex msgpack payload}`).
fn wire_seeds(root: &Path) -> Vec<(String, Vec<u8>)> {
    let all: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&read(root, "tests/data/wire_fixtures.json"))
            .expect("wire_fixtures.json: {name: hex}");
    all.into_iter()
        .map(|(name, hex)| {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (name, bytes)
        })
        .collect()
}

fn block(i: u64, tier: u8) -> SeedBlock {
    SeedBlock {
        engine: EngineHash(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        parent_engine: None,
        parent_seq: (i % 4 != 0).then_some(SeqHash(i * 1000 + 7)),
        local: BlockHash(i * 31 + 1),
        tier: Tier(tier),
    }
}

/// A small State touching every field and option of the format.
fn small_state() -> State {
    let listener =
        |instance, dp, port: u16, replay: bool, seq, publisher: Option<&str>| ListenerState {
            instance,
            dp,
            endpoint: Endpoint {
                endpoint: format!("tcp://127.0.0.1:{port}"),
                replay_endpoint: replay.then(|| format!("tcp://127.0.0.1:{}", port + 100)),
                publisher: publisher.map(str::to_string),
            },
            last_seq: seq,
        };
    State {
        indexes: vec![
            IndexState {
                model: "meta/llama:8b".into(),
                tenant: "default".into(),
                block_size: 16,
                listeners: vec![
                    listener(7, 0, 5557, true, Some(42), Some("vLLM")),
                    listener(7, 1, 5558, false, None, None),
                ],
                workers: vec![
                    WorkerBlocks {
                        instance: 7,
                        dp: 0,
                        blocks: (0..5).map(|i| block(i, (i % 3) as u8)).collect(),
                    },
                    WorkerBlocks {
                        instance: 7,
                        dp: 1,
                        blocks: vec![block(9, 3)],
                    },
                ],
            },
            IndexState {
                model: "m".into(),
                tenant: "tenant-x".into(),
                block_size: 4,
                listeners: vec![listener(u64::MAX, u32::MAX, 6000, true, Some(0), None)],
                workers: Vec::new(),
            },
        ],
    }
}

/// snapshot_load inputs: a mode byte, then the body (framed by the target) or, with
/// the low nibble of the mode clear, the whole image.
fn snapshot_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, state) in [("empty", State::default()), ("small", small_state())] {
        let image = snapshot::encode(&state);
        assert_eq!(snapshot::decode(&image).as_ref(), Ok(&state), "{name}");
        let mut framed = vec![1u8];
        framed.extend_from_slice(&image[SNAPSHOT_HEADER..]);
        let mut raw = vec![0u8];
        raw.extend_from_slice(&image);
        out.push((format!("{name}-body"), framed));
        out.push((format!("{name}-image"), raw));
    }
    out
}

/// One stored RouterEvent as kvix's `/dump` writes it (Dynamo's fields plus
/// `kvix_parent_seq`); Dynamo's own dumps are the same without that field.
fn stored(
    worker: u64,
    dp: u64,
    tier: &str,
    id: u64,
    parent: Value,
    blocks: &[(i64, u64)],
) -> Value {
    json!({
        "worker_id": worker,
        "storage_tier": tier,
        "residency_domain": "worker",
        "event": {
            "event_id": id,
            "data": {"stored": {
                "parent_hash": parent,
                "kvix_parent_seq": parent,
                "start_position": null,
                "blocks": blocks.iter().map(|(b, t)| json!({
                    "block_hash": b, "tokens_hash": t, "mm_extra_info": null
                })).collect::<Vec<_>>(),
            }},
            "dp_rank": dp,
        }
    })
}

fn dump_seeds() -> Vec<(String, Vec<u8>)> {
    let kvix = json!({
        "m:default": {"block_size": 16, "events": [
            stored(1, 0, "device", 0, Value::Null, &[(10, 100)]),
            stored(1, 0, "device", 1, json!(10), &[(11, 101)]),
            stored(1, 0, "host_pinned", 2, json!(10), &[(11, 101)]),
            stored(2, 1, "disk", 3, Value::Null, &[(-5, 200)]),
        ]},
        "meta/llama:8b:tenant-x": {"block_size": 4, "events": []},
    });
    let mut dynamo = kvix.clone();
    for ev in dynamo["m:default"]["events"].as_array_mut().unwrap() {
        ev["event"]["data"]["stored"]
            .as_object_mut()
            .unwrap()
            .remove("kvix_parent_seq");
    }
    // Several chained blocks in one event, and the events a dump may carry besides.
    let mixed = json!({
        "m:x:default": {"block_size": 4, "events": [
            stored(1, 1, "gpu", 0, Value::Null, &[(10, 100), (-2, 200), (3, 300)]),
            {"worker_id": 1, "event": {"event_id": 1,
                "data": {"removed": {"block_hashes": [10]}}, "dp_rank": 1}},
            {"worker_id": 1, "event": {"event_id": 2, "data": "cleared", "dp_rank": 0}},
            stored(3, 0, "cpu", 3, json!(u64::MAX), &[(i64::MIN, u64::MAX)]),
            {"worker_id": "bad"},
        ]},
    });
    [("kvix", kvix), ("dynamo", dynamo), ("mixed", mixed)]
        .into_iter()
        .map(|(name, v)| {
            let bytes = serde_json::to_vec_pretty(&v).unwrap();
            kvix::recovery::dump::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name.to_string(), bytes)
        })
        .collect()
}

/// `--workers` / `--peers` values quoted in README.md, plus those of the flags' help
/// and a few edge cases the parser has branches for.
fn flag_seeds(root: &Path) -> Vec<(String, Vec<u8>)> {
    let readme = read(root, "README.md");
    let mut values: Vec<String> = Vec::new();
    for flag in ["--workers \"", "--workers=\"", "--peers \"", "--peers=\""] {
        for (at, _) in readme.match_indices(flag) {
            let rest = &readme[at + flag.len()..];
            if let Some(end) = rest.find('"') {
                values.push(rest[..end].to_string());
            }
        }
    }
    assert!(!values.is_empty(), "README.md quotes no --workers value");
    values.extend(
        [
            "1=tcp://host:5557,1:1=tcp://host:5558",
            "http://host1:8090,http://host2:8091",
            "1=tcp://host:5557, 2:1=tcp://host:5558,,",
            "3=tcp://[::1]:5557,4:2=ipc:///tmp/kv.sock,5=inproc://x",
            "18446744073709551615:4294967295=tcp://*:65535",
            "1=tcp://x,x=tcp://x:1,1:y=tcp://x:1,1=udp://x:1,1tcp://x:1",
        ]
        .map(str::to_string),
    );
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| (i.to_string(), v.into_bytes()))
        .collect()
}
