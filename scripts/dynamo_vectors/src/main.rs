//! Prints hash vectors of the reference implementation for kvix's tests:
//! multimodal blocks, LoRA names and cache namespaces, alone and combined.

use dynamo_kv_router::protocols::{
    BlockExtraInfo, BlockHashOptions, BlockMmObjectInfo, compute_block_hash_for_seq,
    compute_seq_hash_for_block,
};
use serde_json::json;

fn main() {
    let tokens: Vec<u32> = (1..=12).collect();
    let mm = |hashes: &[u64]| {
        Some(BlockExtraInfo {
            mm_objects: hashes
                .iter()
                .map(|&mm_hash| BlockMmObjectInfo { mm_hash, offsets: vec![] })
                .collect(),
        })
    };
    let cases: Vec<(Vec<Option<BlockExtraInfo>>, Option<&str>, Option<&str>)> = vec![
        (vec![None, mm(&[0xdead_beef]), None], None, None),
        (vec![mm(&[7, 3]), None, mm(&[u64::MAX])], None, None),
        (vec![None, mm(&[42]), None], Some("my-lora"), None),
        (vec![None, None, mm(&[42, 1])], Some("my-lora"), Some("tenant-a")),
        (vec![], None, Some("tenant-a")),
    ];
    let mut out = Vec::new();
    for (infos, lora, ns) in cases {
        let opts = BlockHashOptions {
            block_mm_infos: if infos.is_empty() { None } else { Some(&infos) },
            lora_name: lora,
            cache_namespace: ns,
            is_eagle: None,
        };
        let locals = compute_block_hash_for_seq(&tokens, 4, opts);
        let seqs = compute_seq_hash_for_block(&locals);
        let mm_json: Vec<_> = infos
            .iter()
            .map(|b| b.as_ref().map(|b| b.mm_objects.iter().map(|o| o.mm_hash).collect::<Vec<_>>()))
            .collect();
        out.push(json!({
            "block_size": 4,
            "token_ids": tokens,
            "block_mm_hashes": mm_json,
            "lora_name": lora,
            "cache_salt": ns,
            "local_block_hashes": locals.iter().map(|h| h.0).collect::<Vec<_>>(),
            "sequence_hashes": seqs,
        }));
    }
    println!("{}", serde_json::to_string_pretty(&json!({"generator": "dynamo-kv-router 1.6.1", "cases": out})).unwrap());
}
