//! Prints Dynamo's tiered lookup (device radix tree, then the host, disk and
//! external lower-tier indexers walked in Dynamo's order) over a few workers'
//! stores, for kvix's `/query_tiered_by_hash` differential test
//! (tests/data/dynamo_tiered_vectors.json).

use dynamo_kv_router::indexer::{
    LowerTierIndexers, LowerTierQueryOptions, RadixTree, TieredMatchDetails,
    WireTieredMatchDetails, query_lower_tiers_with_options,
};
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent, StorageTier, compute_block_hash_for_seq,
};
use serde_json::json;

/// One store: (worker, dp rank, tier, parent engine hash, engine hashes, first block).
type Store = (u64, u32, StorageTier, Option<u64>, Vec<u64>, usize);

fn main() {
    let block_size = 4u32;
    let tokens: Vec<u32> = (1..=20).collect();
    let locals: Vec<LocalBlockHash> =
        compute_block_hash_for_seq(&tokens, block_size, BlockHashOptions::default());
    use StorageTier::{Device, Disk, External, HostPinned};
    // Block i has engine hash 100 + i on every worker, as engines with a fixed hash
    // seed publish them: Dynamo 1.6.1's lower-tier index keeps one worker per root
    // edge when workers name the same block by different hashes (kvix keeps both).
    let h = |from: u64, n: u64| (100 + from..100 + from + n).collect::<Vec<_>>();
    let stores: Vec<Store> = vec![
        // Worker 1: device 0-1, host 2, disk 3, external 4.
        (1, 0, Device, None, h(0, 2), 0),
        (1, 0, HostPinned, Some(101), h(2, 1), 2),
        (1, 0, Disk, Some(102), h(3, 1), 3),
        (1, 0, External, Some(103), h(4, 1), 4),
        // Worker 1's dp rank 1: host 0-2, then disk 3.
        (1, 1, HostPinned, None, h(0, 3), 0),
        (1, 1, Disk, Some(102), h(3, 1), 3),
        // Worker 2: host 0-1 only.
        (2, 0, HostPinned, None, h(0, 2), 0),
        // Worker 3: device 0-2, an external copy of 1-3, as an engine's offload
        // stores them (only 3 extends the device match).
        (3, 0, Device, None, h(0, 3), 0),
        (3, 0, External, Some(100), h(1, 3), 1),
        // Worker 4: disk 0, host 1 (the host walk found nothing at 0: no extension).
        (4, 0, Disk, None, h(0, 1), 0),
        (4, 0, HostPinned, Some(100), h(1, 1), 1),
    ];
    let mut device = RadixTree::new();
    let lower = LowerTierIndexers::new(1, block_size);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut events_json = Vec::new();
    for (id, (worker, dp, tier, parent, hashes, first)) in stores.iter().enumerate() {
        let blocks = hashes
            .iter()
            .enumerate()
            .map(|(i, h)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(*h),
                tokens_hash: locals[first + i],
                mm_extra_info: None,
            })
            .collect();
        let event = KvCacheEvent {
            event_id: id as u64,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks,
            }),
            dp_rank: *dp,
        };
        let ev = RouterEvent::with_storage_tier(*worker, event, *tier);
        if *tier == Device {
            device.apply_event(ev).unwrap();
        } else {
            rt.block_on(lower.get_or_create(*tier).apply_event_and_wait(ev))
                .unwrap();
        }
        events_json.push(json!({
            "worker_id": worker, "dp_rank": dp, "storage_tier": tier,
            "parent_hash": parent, "block_hashes": hashes, "first_block": first,
        }));
    }
    let details = device.find_match_details(locals.clone(), false);
    let lower_tier =
        query_lower_tiers_with_options(&lower, &locals, &details, LowerTierQueryOptions::default());
    let tiered = TieredMatchDetails {
        device: details,
        lower_tier,
    };
    let wire = WireTieredMatchDetails::from(&tiered);
    let out = json!({
        "generator": "dynamo-kv-router 1.6.1: RadixTree + LowerTierIndexers, query_lower_tiers_with_options",
        "block_size": block_size,
        "token_ids": tokens,
        "local_block_hashes": locals.iter().map(|h| h.0).collect::<Vec<_>>(),
        "stores": events_json,
        "tiered": wire,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
