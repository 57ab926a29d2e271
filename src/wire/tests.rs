//! Decoder tests over msgspec-generated fixtures of every dialect
//! (scripts/gen_vllm_fixtures.py), malformed variants, and a never-panics proptest.

use super::*;
use crate::types::{EngineHash, Tier};
use proptest::prelude::*;

fn all_fixtures() -> Vec<(String, Vec<u8>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/wire_fixtures.json");
    let all: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all.into_iter()
        .map(|(k, hex)| {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (k, bytes)
        })
        .collect()
}

fn fixture(name: &str) -> Vec<u8> {
    all_fixtures()
        .into_iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
        .1
}

fn decoded(name: &str) -> (Batch, Vec<u8>) {
    let p = fixture(name);
    let mut b = Batch::default();
    decode(&p, &mut b).unwrap_or_else(|e| panic!("{name}: {e}"));
    (b, p)
}

/// What an event is: its operation, dialect and kind of hashes.
fn kind(e: &Event<'_>) -> (EventOp, Dialect, HashKind) {
    (e.op, e.dialect, e.hash_kind)
}

fn reject(bytes: &[u8]) -> WireError {
    let mut b = Batch::default();
    let e = decode(bytes, &mut b).expect_err("must be rejected");
    assert!(
        b.events.is_empty() && b.hashes.is_empty() && b.tokens.is_empty() && b.replicas.is_empty()
    );
    e
}

fn h(v: u64) -> EngineHash {
    EngineHash(v)
}

#[test]
fn every_fixture_decodes() {
    for (name, p) in all_fixtures() {
        let mut a = Batch::default();
        decode(&p, &mut a).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn vllm_oldest_layout() {
    let (b, p) = decoded("vllm_array_v0");
    assert_eq!(b.dp_rank, None);
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev[0].hashes, &[h(11), h(12)]);
    assert_eq!(ev[0].block_size, Some(4));
    assert_eq!(ev[0].medium, None);
    assert_eq!(ev[1].op, EventOp::Removed);
    assert_eq!(ev[1].hashes, &[h(12)]);
    assert_eq!(ev[1].medium, None);
}

#[test]
fn vllm_every_tail_field() {
    let (b, p) = decoded("vllm_array_tail");
    assert_eq!(b.dp_rank, Some(0));
    assert_eq!(b.ignored, 0);
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev.len(), 3);
    assert_eq!(ev[0].op, EventOp::Stored);
    assert_eq!(ev[0].dialect, Dialect::Engine);
    assert_eq!(ev[0].hash_kind, HashKind::Engine);
    assert_eq!(ev[0].parent, Some(h(20)));
    assert_eq!(ev[0].lora_id, Some(7));
    assert_eq!(ev[0].lora_name, Some("my-lora"));
    assert_eq!(ev[0].medium, Some("GPU"));
    assert_eq!(ev[0].group_idx, Some(0));
    assert_eq!(ev[1].hashes, &[h(22)]);
    assert_eq!(ev[1].medium, Some("GPU"));
    assert_eq!(ev[1].group_idx, Some(0));
    assert_eq!(ev[2].op, EventOp::Cleared);
}

#[test]
fn vllm_kv_groups_carry_their_kind_and_window() {
    let (b, p) = decoded("vllm_array_aux_group");
    assert_eq!(b.ignored, 0);
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev.len(), 3);
    assert_eq!(ev[0].hashes, &[h(31)]);
    assert_eq!(
        (ev[0].group_idx, ev[0].group_kind),
        (Some(0), GroupKind::Full)
    );
    assert_eq!(ev[1].group_kind, GroupKind::SlidingWindow);
    assert_eq!((ev[1].group_idx, ev[1].group_window), (Some(1), Some(128)));
    // A removal names its group only: its kind is what the group's stores said.
    assert_eq!(
        (ev[2].group_idx, ev[2].group_kind),
        (Some(1), GroupKind::Named)
    );
}

#[test]
fn vllm_current_map_events_with_bytes_hashes() {
    let (b, p) = decoded("vllm_map_current");
    assert_eq!(b.dp_rank, Some(1));
    let ev: Vec<_> = b.events(&p).collect();
    let tail = |s: u8| {
        h(u64::from_be_bytes(std::array::from_fn(|i| {
            s + 24 + i as u8
        })))
    };
    assert_eq!(ev[0].hashes, &[tail(0), tail(32)]);
    assert_eq!(ev[0].group_idx, Some(0));
    assert_eq!(ev[1].hashes, &[tail(32)]);
}

#[test]
fn sglang_media_metadata_maps_and_bigrams() {
    let (b, p) = decoded("sglang_array_medium");
    assert_eq!(b.dp_rank, Some(2), "attn_dp_rank is the 3rd batch element");
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev[0].medium, Some("CPU_PINNED"));
    assert_eq!(Tier::well_known(ev[0].medium), Some(Tier::HOST));
    assert_eq!(ev[0].parent, Some(h(40)));
    assert_eq!(ev[1].medium, Some("DISK"));

    let (b, p) = decoded("sglang_array_metadata");
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(
        (ev[0].medium, ev[0].cache_salt, ev[0].lora_name),
        (Some("GPU"), Some("tenant-a"), None)
    );

    let (b, p) = decoded("sglang_map_events");
    assert_eq!(b.dp_rank, Some(3));
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(
        (ev[0].medium, ev[0].cache_salt),
        (Some("EXTERNAL"), Some("tenant-b"))
    );
    assert_eq!(Tier::well_known(Some("EXTERNAL")), None);
    assert_eq!(ev[1].op, EventOp::Removed);

    let (b, p) = decoded("sglang_bigram_tokens");
    let ev: Vec<_> = b.events(&p).collect();
    assert!(ev[0].bigram_tokens);
    assert_eq!(ev[0].tokens, &[10, 11, 12, 13]);
}

#[test]
fn rfc_stored_with_aliases_counts_hashes_once() {
    let (b, p) = decoded("mc_rfc_stored_seq");
    assert_eq!(b.dp_rank, Some(0));
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev.len(), 1);
    let e = &ev[0];
    assert_eq!(kind(e), (EventOp::Stored, Dialect::Rfc1527, HashKind::Seq));
    assert_eq!(e.hashes, &[h(1234567890), h(9876543210), h(1122334455)]);
    assert_eq!(b.hashes.len(), 3, "aliases must not add hashes");
    assert_eq!(e.parent, Some(h(9999999999)));
    assert_eq!(e.base_block_idx, Some(5));
    assert_eq!(e.event_id, Some(42));
    assert_eq!(e.timestamp_ms, Some(1739145600000));
    assert_eq!(e.model_name, Some("llama-3.1-8b"));
    assert_eq!(e.block_size, Some(64));
    assert_eq!(e.additional_salt, Some("w8a8"));
    assert_eq!(e.tenant_id, Some("default"));
    assert_eq!(e.backend_id, Some("worker-0"));
    assert_eq!(e.medium, Some("gpu"));
    assert_eq!(e.dp_rank, Some(0));
    assert!(e.tokens.is_empty());
}

#[test]
fn rfc_tokens_removed_cleared_map_batch() {
    let (b, p) = decoded("mc_rfc_stored_tokens");
    let e = b.events(&p).next().unwrap();
    assert_eq!(
        (e.hashes, e.tokens),
        (&[h(501), h(502)][..], &[1, 2, 3, 4][..])
    );
    assert_eq!(
        (e.dp_rank, e.lora_name, e.base_block_idx, e.parent),
        (Some(1), Some("sql"), Some(0), None)
    );

    let (b, p) = decoded("mc_rfc_removed");
    let e = b.events(&p).next().unwrap();
    assert_eq!(
        (e.op, e.hash_kind, e.medium),
        (EventOp::Removed, HashKind::Seq, Some("cpu"))
    );
    assert_eq!(
        (e.hashes, e.base_block_idx),
        (&[h(1122334455)][..], Some(7))
    );

    let (b, p) = decoded("mc_rfc_cleared");
    let e = b.events(&p).next().unwrap();
    assert_eq!(
        (e.op, e.medium, e.backend_id),
        (EventOp::Cleared, Some("disk"), Some("mooncake-daemon-0"))
    );
    assert_eq!(e.event_id, Some(44));

    let (b, p) = decoded("mc_rfc_map_batch");
    assert_eq!(b.dp_rank, Some(2));
    let e = b.events(&p).next().unwrap();
    assert_eq!((e.hashes, e.timestamp_ms), (&[h(777)][..], None));
}

#[test]
fn rfc_object_keys() {
    let (b, p) = decoded("mc_rfc_object_key_only");
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev.len(), 4);
    assert_eq!(ev[0].hashes, &[h(123456789)]);
    assert_eq!(ev[0].object_key, Some("0x00000000075bcd15"));
    assert_eq!(ev[1].hashes, &[h(987654321)]);
    assert_eq!(ev[1].tenant_id, Some("tenant-a"));
    assert!(ev[2].hashes.is_empty(), "an opaque key is no seq hash");
    assert!(ev[2].object_key.unwrap().starts_with("llama-3.1-8b@tp0@"));
    assert_eq!(
        (ev[3].op, ev[3].hashes),
        (EventOp::Removed, &[h(123456789)][..])
    );
    assert!(
        ev.iter()
            .all(|e| e.model_name.is_none() && e.block_size.is_none() && e.dp_rank.is_none())
    );
}

#[test]
fn legacy_mooncake_seed_layout() {
    let (b, p) = decoded("mc_legacy_conductor");
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev.len(), 4);
    let e = &ev[0];
    assert_eq!(
        kind(e),
        (EventOp::Stored, Dialect::MooncakeLegacy, HashKind::Engine)
    );
    assert_eq!(
        (e.hashes, e.parent, e.tokens),
        (&[h(0xA1)][..], None, &[101, 15][..])
    );
    assert_eq!(
        (e.block_size, e.model_name, e.lora_name, e.lora_id),
        (Some(2), Some("deepseek"), None, Some(0))
    );
    assert_eq!(e.object_key, Some("key-a"));
    assert_eq!(e.timestamp_ms, Some(1732300000500));
    let r: Vec<_> = e.replicas.iter().collect();
    assert_eq!(
        r,
        vec![
            Replica {
                kind: None,
                location: "10.0.0.1:6000"
            },
            Replica {
                kind: None,
                location: "10.0.0.2:6000"
            }
        ]
    );
    assert_eq!(
        (ev[1].parent, ev[1].lora_name, ev[1].lora_id),
        (Some(h(0xA1)), Some("sql"), Some(3))
    );
    assert_eq!(ev[2].op, EventOp::Updated);
    assert!(ev[2].hashes.is_empty() && ev[2].tokens.is_empty());
    assert_eq!((ev[2].object_key, ev[2].replicas.len()), (Some("key-a"), 1));
    assert_eq!(ev[3].op, EventOp::Cleared);
}

#[test]
fn legacy_mooncake_store_layout_and_maps() {
    let (b, p) = decoded("mc_legacy_store");
    let ev: Vec<_> = b.events(&p).collect();
    let e = &ev[0];
    assert_eq!(
        (e.hashes, e.parent),
        (&[h(0x41234125)][..], Some(h(0x51512342)))
    );
    assert_eq!(
        (e.tokens, e.block_size, e.model_name),
        (&[1, 2, 3, 4][..], Some(4), Some("llama2-7b"))
    );
    assert_eq!(e.timestamp_ms, None);
    let kinds: Vec<_> = e.replicas.iter().map(|r| r.kind.unwrap()).collect();
    assert_eq!(kinds, ["memory", "disk", "local_disk"]);
    assert_eq!(Tier::well_known(Some("memory")), Some(Tier::HOST));
    assert_eq!(Tier::well_known(Some("local_disk")), Some(Tier::DISK));
    assert_eq!(ev[1].op, EventOp::Updated);

    let (b, p) = decoded("mc_legacy_map");
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(
        (ev[0].dialect, ev[0].hashes, ev[0].parent),
        (Dialect::MooncakeLegacy, &[h(0xC1)][..], None)
    );
    assert_eq!(
        (ev[0].object_key, ev[0].lora_name, ev[0].replicas.len()),
        (Some("key-c"), None, 1)
    );
    assert_eq!(ev[1].op, EventOp::Cleared);
}

#[test]
fn conductor_example_fixtures_carry_kvix_hashes() {
    let tokens = [101u32, 15, 100, 55, 89, 63];
    let mut seqs = Vec::new();
    crate::hash::seq_hashes_for_tokens(&tokens, 2, crate::hash::block_seed(None, None), &mut seqs);
    let (b, p) = decoded("conductor_disk_rfc");
    let ev: Vec<_> = b.events(&p).collect();
    assert_eq!(ev[0].hashes, &[h(seqs[0].0)]);
    assert_eq!(
        (ev[1].hashes, ev[1].parent, ev[1].base_block_idx),
        (&[h(seqs[2].0)][..], Some(h(seqs[1].0)), Some(2))
    );
    assert!(
        ev.iter()
            .all(|e| e.medium == Some("disk") && e.hash_kind == HashKind::Seq)
    );
    for (name, dp, n, medium) in [
        ("conductor_gpu_dp0", 0, 4, "GPU"),
        ("conductor_gpu_dp1", 1, 2, "GPU"),
        ("conductor_cpu_dp0", 0, 4, "CPU"),
    ] {
        let (b, p) = decoded(name);
        assert_eq!(b.dp_rank, Some(dp));
        let e = b.events(&p).next().unwrap();
        assert_eq!(
            (e.tokens, e.block_size, e.medium),
            (&tokens[..n], Some(2), Some(medium))
        );
    }
}

// ---- malformed -----------------------------------------------------------------------

/// msgpack helpers for hand-built frames.
fn s(v: &str) -> Vec<u8> {
    let mut o = vec![0xa0 | v.len() as u8];
    o.extend_from_slice(v.as_bytes());
    o
}

fn batch_of(events: &[Vec<u8>]) -> Vec<u8> {
    let mut o = vec![0x92, 0x00, 0x90 | events.len() as u8];
    for e in events {
        o.extend_from_slice(e);
    }
    o
}

fn map_of(kvs: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut o = vec![0x80 | kvs.len() as u8];
    for (k, v) in kvs {
        o.extend(s(k));
        o.extend_from_slice(v);
    }
    o
}

#[test]
fn every_truncation_of_every_fixture_is_an_error() {
    for (name, p) in all_fixtures() {
        for cut in 0..p.len() {
            let mut b = Batch::default();
            assert!(decode(&p[..cut], &mut b).is_err(), "{name} cut at {cut}");
            assert!(b.events.is_empty());
        }
    }
}

#[test]
fn malformed_rfc_events() {
    let stored = |extra: &[(&str, Vec<u8>)]| {
        let mut kvs = vec![("event_type", s("stored"))];
        kvs.extend(extra.iter().cloned());
        batch_of(&[map_of(&kvs)])
    };
    assert!(
        matches!(reject(&batch_of(&[map_of(&[("event_type", s("evicted"))])])), WireError::UnknownTag(t) if t == "`evicted`")
    );
    assert_eq!(
        reject(&stored(&[])),
        WireError::Missing {
            field: "seq_hashes"
        }
    );
    assert_eq!(
        reject(&stored(&[("seq_hashes", s("1,2"))])),
        WireError::Type {
            field: "seq_hashes",
            expected: "array"
        }
    );
    assert_eq!(
        reject(&stored(&[("seq_hashes", vec![0x91, 0xc3])])),
        WireError::Type {
            field: "seq_hashes",
            expected: "integer"
        }
    );
    assert_eq!(
        reject(&stored(&[("seq_hashes", vec![0x91, 0xa2, b'z', b'z'])])).to_string(),
        "field `seq_hashes`: expected hash (integer, bytes, decimal or hex text)"
    );
    assert_eq!(
        reject(&stored(&[
            ("seq_hashes", vec![0x91, 1]),
            ("event_id", vec![0xff])
        ])),
        WireError::Range { field: "event_id" }
    );
    assert_eq!(
        reject(&stored(&[
            ("seq_hashes", vec![0x91, 1]),
            ("dp_rank", s("0"))
        ])),
        WireError::Type {
            field: "dp_rank",
            expected: "integer"
        }
    );
    assert_eq!(
        reject(&stored(&[
            ("seq_hashes", vec![0x91, 1]),
            ("tenant_id", vec![0xa2, 0xff, 0xfe])
        ])),
        WireError::Type {
            field: "tenant_id",
            expected: "UTF-8 string"
        }
    );
    // Tokens that do not fill the declared blocks.
    assert!(matches!(
        reject(&stored(&[
            ("seq_hashes", vec![0x92, 1, 2]),
            ("block_size", vec![2]),
            ("token_ids", vec![0x93, 1, 2, 3])
        ])),
        WireError::TokenCount {
            tokens: 3,
            blocks: 2,
            block_size: 2
        }
    ));
    // Neither `type` nor `event_type`.
    assert_eq!(
        reject(&batch_of(&[map_of(&[("seq_hashes", vec![0x90])])])),
        WireError::Missing { field: "type" }
    );
    // An `event_type` wins even over a junk alias tag.
    let mut ok = Batch::default();
    decode(
        &stored(&[("type", s("Whatever")), ("seq_hashes", vec![0x91, 5])]),
        &mut ok,
    )
    .unwrap();
    assert_eq!(ok.hashes, [h(5)]);
    // Alias list before seq_hashes is dropped, not doubled.
    decode(
        &stored(&[
            ("block_hashes", vec![0x92, 7, 8]),
            ("seq_hashes", vec![0x92, 7, 8]),
        ]),
        &mut ok,
    )
    .unwrap();
    assert_eq!(ok.hashes, [h(7), h(8)]);
}

#[test]
fn malformed_legacy_events() {
    let ev = |fields: Vec<Vec<u8>>| {
        let mut o = vec![0x90 | fields.len() as u8];
        fields.into_iter().for_each(|f| o.extend(f));
        batch_of(&[o])
    };
    // Missing key / address list.
    assert_eq!(
        reject(&ev(vec![s("BlockStoreEvent"), vec![0x00]])),
        WireError::Missing {
            field: "mooncake_key"
        }
    );
    assert_eq!(
        reject(&ev(vec![s("BlockUpdateEvent"), s("k")])),
        WireError::Missing { field: "addr_list" }
    );
    // Key of the wrong type in the seed layout.
    assert_eq!(
        reject(&ev(vec![
            s("BlockUpdateEvent"),
            vec![0x00],
            vec![0x01],
            vec![0x90]
        ])),
        WireError::Type {
            field: "mooncake_key",
            expected: "string"
        }
    );
    // A replica triple, a numeric address.
    let triple = [vec![0x91, 0x93], s("memory"), s("a"), s("b")].concat();
    assert!(matches!(
        reject(&ev(vec![s("BlockUpdateEvent"), s("k"), triple])),
        WireError::Type {
            field: "replica",
            ..
        }
    ));
    assert!(matches!(
        reject(&ev(vec![s("BlockUpdateEvent"), s("k"), vec![0x91, 0x05]])),
        WireError::Type {
            field: "addr_list",
            ..
        }
    ));
    // Legacy store block whose tokens do not fill its block.
    let bad = ev(vec![
        s("BlockStoreEvent"),
        vec![0x00],
        s("k"),
        vec![0x90],
        vec![0x11],
        vec![0x00],
        vec![0x93, 1, 2, 3],
        vec![0x02],
    ]);
    assert!(matches!(
        reject(&bad),
        WireError::TokenCount {
            tokens: 3,
            blocks: 1,
            block_size: 2
        }
    ));
    // Unknown tags.
    assert!(matches!(
        reject(&ev(vec![s("BlockMigrated")])),
        WireError::UnknownTag(_)
    ));
    assert!(matches!(
        reject(&batch_of(&[map_of(&[("type", s("BlockMoveEvent"))])])),
        WireError::UnknownTag(_)
    ));
    // Legacy map store without its key.
    assert_eq!(
        reject(&batch_of(&[map_of(&[
            ("type", s("BlockStoreEvent")),
            ("block_hash", vec![1])
        ])])),
        WireError::Missing {
            field: "mooncake_key"
        }
    );
}

#[test]
fn malformed_engine_tail_and_tokens() {
    let stored = |tokens: Vec<u8>| {
        let e = [
            vec![0x95],
            s("BlockStored"),
            vec![0x91, 0x01, 0xc0],
            tokens,
            vec![0x02],
        ]
        .concat();
        batch_of(&[e])
    };
    // Mixed flat and pair token ids; a pair of three.
    assert!(matches!(
        reject(&stored(vec![0x92, 0x01, 0x92, 0x02, 0x03])),
        WireError::Type {
            field: "token_ids",
            ..
        }
    ));
    assert!(matches!(
        reject(&stored(vec![0x92, 0x93, 1, 2, 3, 0x93, 2, 3, 4])),
        WireError::Type {
            field: "token_ids",
            ..
        }
    ));
    // Negative token id.
    assert_eq!(
        reject(&stored(vec![0x92, 0xff, 0x01])),
        WireError::Range { field: "token_ids" }
    );
    // An event that is neither array nor map; a batch with no events.
    assert!(matches!(
        reject(&batch_of(&[vec![0x05]])),
        WireError::Type { field: "event", .. }
    ));
    assert_eq!(
        reject(&[0x91, 0x00]),
        WireError::Missing { field: "events" }
    );
    assert_eq!(
        reject(&[0x81, 0xa2, b't', b's', 0x00]),
        WireError::Missing { field: "events" }
    );
    // Two events lists in a map batch.
    assert!(matches!(
        reject(&map_of(&[("events", vec![0x90]), ("events", vec![0x90])])),
        WireError::Type {
            field: "events",
            ..
        }
    ));
}

#[test]
fn huge_declared_lengths_fail_fast() {
    let huge_arr = [0xdd, 0xff, 0xff, 0xff, 0xff];
    let huge_map = [0xdf, 0xff, 0xff, 0xff, 0xff];
    let huge_str = [0xdb, 0xff, 0xff, 0xff, 0xff];
    let huge_bin = [0xc6, 0xff, 0xff, 0xff, 0xff];
    let frames: Vec<Vec<u8>> = vec![
        huge_arr.to_vec(),
        huge_map.to_vec(),
        [&[0x92, 0x00][..], &huge_arr].concat(),
        batch_of(&[[&[0x94][..], &s("BlockStored"), &huge_arr].concat()]),
        batch_of(&[[&[0x94][..], &s("BlockStored"), &[0x90, 0xc0], &huge_arr].concat()]),
        batch_of(&[[&[0x94][..], &s("BlockStored"), &[0x91], &huge_bin].concat()]),
        batch_of(&[huge_map.to_vec()]),
        batch_of(&[[&[0x81][..], &s("seq_hashes"), &huge_arr].concat()]),
        batch_of(&[[&[0x81][..], &s("object_key"), &huge_str].concat()]),
        batch_of(&[[&[0x94][..], &s("BlockUpdateEvent"), &s("k"), &huge_arr].concat()]),
        // A skipped tail field of huge declared size.
        batch_of(&[[&[0x92][..], &s("AllBlocksCleared"), &huge_arr].concat()]),
        batch_of(&[[&[0x92][..], &s("AllBlocksCleared"), &huge_map].concat()]),
        [
            &[0x94, 0x00, 0x90, 0xc0][..],
            &[0xc9, 0xff, 0xff, 0xff, 0xff, 0x01],
        ]
        .concat(),
    ];
    for f in frames {
        let t = std::time::Instant::now();
        assert_eq!(reject(&f), WireError::Truncated, "{f:02x?}");
        assert!(t.elapsed() < std::time::Duration::from_millis(50));
    }
}

#[test]
fn deep_nesting_is_refused() {
    for open in [0x91u8, 0x81] {
        let mut deep = vec![0x92, 0x00, 0x91, 0x92];
        deep.extend(s("AllBlocksCleared"));
        for _ in 0..10_000 {
            deep.push(open);
            if open == 0x81 {
                deep.push(0x00);
            }
        }
        deep.push(0xc0);
        assert_eq!(reject(&deep), WireError::TooDeep);
    }
    // Inside an unknown map key of an RFC event, too.
    let mut deep = vec![0x92, 0x00, 0x91, 0x82];
    deep.extend(s("event_type"));
    deep.extend(s("cleared"));
    deep.extend(s("junk"));
    deep.extend(std::iter::repeat_n(0x91, 1000));
    deep.push(0xc0);
    assert_eq!(reject(&deep), WireError::TooDeep);
}

#[test]
fn hash_and_key_text() {
    use super::fields::{hash_text, numeric_key};
    assert_eq!(numeric_key(b"0x00000000075bcd15"), Some(123456789));
    assert_eq!(numeric_key(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(numeric_key(b"18446744073709551616"), None);
    assert_eq!(numeric_key(b"0x"), None);
    assert_eq!(numeric_key(b"0x1_"), None);
    assert_eq!(numeric_key(b"key-1"), None);
    assert_eq!(numeric_key(b""), None);
    assert_eq!(hash_text(b"0x41234125"), Some(0x41234125));
    assert_eq!(hash_text(&[b'a'; 64]), Some(0xaaaa_aaaa_aaaa_aaaa));
    assert_eq!(
        hash_text(b"0x0000000000000000000000000000000000000000000000000000000000000001"),
        Some(1)
    );
    assert_eq!(hash_text(b"abc"), None);
}

// ---- never panics ------------------------------------------------------------------------

fn decode_any(bytes: &[u8]) {
    let mut b = Batch::default();
    match decode(bytes, &mut b) {
        Ok(()) => {
            // Every range the ingest layer will index is in bounds.
            for e in b.events(bytes) {
                let _ = (
                    e.hashes.len(),
                    e.tokens.len(),
                    e.replicas.iter().count(),
                    e.object_key,
                );
            }
        }
        Err(_) => assert!(b.events.is_empty()),
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (
            any::<usize>(),
            prop_oneof![
                Just(0xddu8),
                Just(0xdf),
                Just(0xc0),
                Just(0x91),
                Just(0xff),
                Just(0xdb),
                any::<u8>()
            ]
        )
            .prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..8).prop_map(|(i, n)| Mutation::Remove(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(p: &mut Vec<u8>, m: &Mutation) {
    if p.is_empty() {
        return;
    }
    let at = |i: usize| i % p.len();
    match m {
        Mutation::Flip(i, b) => {
            let i = at(*i);
            p[i] ^= b;
        }
        Mutation::Set(i, b) => {
            let i = at(*i);
            p[i] = *b;
        }
        Mutation::Insert(i, v) => {
            let i = at(*i);
            p.splice(i..i, v.iter().copied());
        }
        Mutation::Remove(i, n) => {
            let i = at(*i);
            let end = (i + n).min(p.len());
            p.drain(i..end);
        }
        Mutation::Truncate(i) => {
            let i = at(*i);
            p.truncate(i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        decode_any(&bytes);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        pick in any::<prop::sample::Index>(),
        muts in proptest::collection::vec(mutation(), 1..6),
    ) {
        let all = all_fixtures();
        let (_, mut p) = all[pick.index(all.len())].clone();
        for m in &muts {
            apply(&mut p, m);
        }
        decode_any(&p);
    }
}
