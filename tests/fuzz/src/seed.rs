//! Writes the seed corpora of the fuzz targets, from what the repository already has:
//! the wire fixtures (`decode`), a snapshot image of a small State (`snapshot_load`),
//! dumps in Dynamo's and kvix's `/dump` shape (`dump_import`), `--workers` /
//! `--peers` strings from README.md and the flags' help (`workers_flag`), the JSON
//! request bodies written in README.md and the tests (`api_control`, `api_query`),
//! and `/workers` documents in kvix's and Dynamo's shape (`workers_import`). Writes
//! only under CORPUS_DIR; never runs kvix itself.
//!
//! Usage: `seed REPO_ROOT CORPUS_DIR`; writes `CORPUS_DIR/<target>/<name>`.

use kvix::ingest::feed::SeedBlock;
use kvix::recovery::{IndexState, ListenerState, State, WorkerBlocks, snapshot};
use kvix::registry::{Endpoint, InstanceKey};
use kvix::types::{BlockHash, EngineHash, SeqHash, Tier};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

// cargo-fuzz builds this binary with the targets' coverage instrumentation. Its hooks
// come from the sanitizer runtime, or with `--sanitizer none` from libFuzzer alone,
// which links only beside a target: hence this one, which never runs (main is ours).
libfuzzer_sys::fuzz_target!(|_data: &[u8]| {});

/// Snapshot header: magic, version, body length, checksum (see snapshot.rs).
const SNAPSHOT_HEADER: usize = 8 + 4 + 8 + 8;

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [root, out] = &args[..] else {
        eprintln!("usage: seed REPO_ROOT CORPUS_DIR");
        std::process::exit(2);
    };
    let mut total = 0;
    let (control, query) = body_seeds(root);
    for (target, seeds) in [
        ("decode", wire_seeds(root)),
        ("snapshot_load", snapshot_seeds()),
        ("dump_import", dump_seeds()),
        ("workers_flag", flag_seeds(root)),
        ("api_control", control),
        ("api_query", query),
        ("workers_import", workers_seeds(root)),
    ] {
        assert!(!seeds.is_empty(), "no seeds for {target}");
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
        groups: 0,
    }
}

/// A small State touching every field and option of the format.
fn small_state() -> State {
    let listener =
        |instance, dp, port: u16, replay: bool, seq, publisher: Option<&str>| ListenerState {
            instance: InstanceKey::parse(instance),
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
                    listener("7", 0, 5557, true, Some(42), Some("vLLM")),
                    listener("vllm-1", 1, 5558, false, None, None),
                ],
                workers: vec![
                    WorkerBlocks {
                        instance: InstanceKey::Id(7),
                        dp: 0,
                        blocks: (0..5).map(|i| block(i, (i % 3) as u8)).collect(),
                        groups: Default::default(),
                    },
                    WorkerBlocks {
                        instance: InstanceKey::Name("vllm-1".into()),
                        dp: 1,
                        blocks: vec![block(9, 3)],
                        groups: Default::default(),
                    },
                ],
            },
            IndexState {
                model: "m".into(),
                tenant: "tenant-x".into(),
                block_size: 4,
                listeners: vec![listener(
                    "18446744073709551615",
                    u32::MAX,
                    6000,
                    true,
                    Some(0),
                    None,
                )],
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
    // A version 1 body (mode bit 4): instances are bare u64 ids. One index "m"/"t" of
    // block size 4, one listener of instance 9, one worker of it with one block.
    let mut v1 = vec![0x11u8];
    let str = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    v1.extend_from_slice(&1u32.to_le_bytes());
    str(&mut v1, "m");
    str(&mut v1, "t");
    v1.extend_from_slice(&4u32.to_le_bytes());
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&9u64.to_le_bytes());
    v1.extend_from_slice(&0u32.to_le_bytes());
    str(&mut v1, "tcp://h:1");
    v1.extend_from_slice(&[0, 0, 0]);
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&9u64.to_le_bytes());
    v1.extend_from_slice(&0u32.to_le_bytes());
    v1.extend_from_slice(&1u64.to_le_bytes());
    v1.extend_from_slice(&5u64.to_le_bytes());
    v1.push(1 << 1);
    v1.extend_from_slice(&6u64.to_le_bytes());
    out.push(("v1-body".into(), v1));
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

/// Every JSON value in `text` that starts with `{` or `[` and parses on its own (the
/// literal bodies of README's curl examples, of raw strings and of `json!` calls
/// without Rust expressions in them), outermost only.
fn json_in(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let b = text.as_bytes()[i];
        if b == b'{' || b == b'[' {
            let mut it = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
            if let Some(Ok(v)) = it.next() {
                i += it.byte_offset();
                out.push(v);
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The files request bodies are written in: README.md and the tests' Rust files
/// (tests/*.rs and those of tests/it/, this crate's left out), sorted.
fn body_sources(root: &Path) -> Vec<String> {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut dirs = vec![root.join("tests")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("tests/ entry").path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "fuzz") {
                    dirs.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut out = vec![read(root, "README.md")];
    out.extend(
        files
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))),
    );
    out
}

fn has_any(v: &Value, keys: &[&str]) -> bool {
    keys.iter().any(|k| v.get(k).is_some())
}

const QUERY_KEYS: &[&str] = &[
    "token_ids",
    "prompt",
    "messages",
    "block_hashes",
    "seq_hashes",
    "block_hash",
];
const CONTROL_KEYS: &[&str] = &["instance_id", "endpoint", "modelname", "url"];

fn numbered(values: Vec<Value>) -> Vec<(String, Vec<u8>)> {
    let mut seen = std::collections::BTreeSet::new();
    values
        .into_iter()
        .map(|v| serde_json::to_vec(&v).unwrap())
        .filter(|b| seen.insert(b.clone()))
        .enumerate()
        .map(|(i, b)| (i.to_string(), b))
        .collect()
}

/// Request bodies for `api_control` (`/register`, `/unregister`, the peer routes) and
/// `api_query` (`/query`, `/query_by_hash`): every JSON object in README.md and
/// the tests with the fields of one, plus shapes those files only build in code.
fn body_seeds(root: &Path) -> (Vec<(String, Vec<u8>)>, Vec<(String, Vec<u8>)>) {
    let (mut control, mut query) = (Vec::new(), Vec::new());
    for text in body_sources(root) {
        for v in json_in(&text).into_iter().filter(Value::is_object) {
            if has_any(&v, QUERY_KEYS) {
                query.push(v);
            } else if has_any(&v, CONTROL_KEYS) {
                control.push(v);
            }
        }
    }
    assert!(
        control.len() >= 5 && query.len() >= 5,
        "README.md and the tests hold fewer bodies than expected"
    );
    control.extend([
        json!({"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5560",
               "type": "Mooncake", "modelname": "m", "lora_name": "a", "tenant_id": "t",
               "instance_id": "18446744073709551616", "block_size": 16, "dp_rank": 1,
               "additionalsalt": "s"}),
        json!({"instance_id": 18446744073709551615u64, "endpoint": "ipc:///tmp/x",
               "model_name": "m", "block_size": 1, "routing_group": "g", "dp_rank": 4294967295u32,
               "replay_endpoint": null}),
        json!({"modelname": "m", "instance_id": "007", "tenant_id": "t"}),
        json!({"url": "https://[fd00::1]:8443/base"}),
        json!({"url": "http://u:p@peer:1/?q"}),
    ]);
    query.extend([
        json!({"model_name": "m", "token_ids": [0, 4294967295u32, 1, 2], "cache_salt": "s",
               "block_mm_hashes": [null, [1, -1, "0xff", "42"]], "lora_name": "a",
               "tenant_id": "t", "instance_id": "vllm-1", "block_size": 2,
               "scoring": "llm-d", "tier_weights": {"GPU": 1.0, "CPU": 0.5}}),
        json!({"model": "m", "lora_id": 3, "routing_group": "g", "token_ids": []}),
        json!({"model": "m", "block_hash": ["0x1", "18446744073709551615", -5]}),
        json!({"model_name": "m", "block_hashes": [1], "cache_salt": null}),
    ]);
    // Bodies as clients write them, not as serde_json prints them: whitespace and
    // field order around the token ids (the fast path reads the text itself).
    let raw: [&[u8]; 4] = [
        b"{ \"token_ids\" :\n[ 1 ,2,\t3 ] , \"model_name\" : \"m\" }",
        br#"{"model_name":"\"token_ids\":[9]","token_ids":[1,2]}"#,
        br#"{"x":{"token_ids":[9]},"token_ids":[1],"model":"m"}"#,
        br#"{"token_ids":[1],"model_name":"m"} {"token_ids":[2]}"#,
    ];
    let mut query = numbered(query);
    query.extend(
        raw.iter()
            .enumerate()
            .map(|(i, b)| (format!("raw-{i}"), b.to_vec())),
    );
    (numbered(control), query)
}

/// `/workers` documents for `workers_import`: the arrays of workers in
/// src/recovery/workers.rs's tests, and one in each indexer's shape.
fn workers_seeds(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut docs: Vec<Value> = json_in(&read(root, "src/recovery/workers.rs"))
        .into_iter()
        .filter(|v| {
            v.as_array()
                .is_some_and(|a| a.iter().any(|w| w.get("model_name").is_some()))
        })
        .collect();
    docs.push(json!([
        {"instance_id": 7, "source": "zmq", "status": "active", "model_name": "m",
         "tenant_id": "t", "routing_group": "t", "block_size": 16,
         "endpoints": {"0": "tcp://a:1", "1": "tcp://a:2"},
         "listeners": {
            "0": [{"endpoint": "tcp://a:1", "type": "vLLM", "replay_endpoint": "tcp://a:9",
                   "status": "active"},
                  {"endpoint": "tcp://a:3", "type": "Mooncake", "replay_endpoint": null,
                   "status": "active"}],
            "1": [{"endpoint": "tcp://a:2", "type": null, "replay_endpoint": null}]}},
        {"instance_id": "vllm-1", "model_name": "m:x", "block_size": 4,
         "endpoints": {"4294967295": "ipc:///tmp/x"}},
    ]));
    // Dynamo's: integer ids, routing groups, no listeners.
    docs.push(json!([
        {"instance_id": 18446744073709551615u64, "model_name": "m", "routing_group": "g",
         "block_size": 1, "endpoints": {"0": "tcp://b:1"}},
        {"instance_id": "18446744073709551616", "model_name": "m", "block_size": 2,
         "endpoints": {}},
    ]));
    assert!(
        docs.len() >= 3,
        "src/recovery/workers.rs holds no /workers body"
    );
    for d in &docs[docs.len() - 2..] {
        let bytes = serde_json::to_vec(d).unwrap();
        kvix::recovery::workers::parse(&bytes).unwrap_or_else(|e| panic!("{d}: {e}"));
    }
    numbered(docs)
}
