//! Parse a `/dump` (kvix's or Dynamo's `dynamo-kv-indexer`) into recovered [`State`].
//!
//! Shape (Dynamo's standalone-indexer docs): `{"model:tenant": {"block_size": N, "events": [RouterEvent]}}`,
//! a RouterEvent being `{"worker_id", "storage_tier", "event": {"event_id", "data":
//! {"stored": {"parent_hash", "blocks": [{"block_hash", "tokens_hash"}]}}, "dp_rank"}}`.
//! `block_hash`/`parent_hash` are the worker's engine hashes, `tokens_hash` the Dynamo
//! local hash. Several blocks in one stored event chain on each other. `removed` and
//! `cleared` events are ignored (a dump describes what is held). A malformed event is
//! skipped and counted; a malformed document is an error.

use super::{IndexState, RecoveryError, State, WorkerBlocks};
use crate::ingest::feed::SeedBlock;
use crate::registry::InstanceKey;
use crate::types::{BlockHash, DpRank, EngineHash, SeqHash, Tier};
use serde_json::Value;
use std::collections::BTreeMap;

fn hash(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_i64().map(|i| i as u64))
}

fn tier(name: Option<&str>) -> Tier {
    match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("device") | Some("gpu") => Tier::DEVICE,
        Some("host_pinned") | Some("host") | Some("cpu") => Tier::HOST,
        Some("disk") => Tier::DISK,
        _ => Tier(3),
    }
}

/// Parse a whole dump document.
pub fn parse(body: &[u8]) -> Result<State, RecoveryError> {
    parse_counted(body).map(|(state, _)| state)
}

/// The dp rank of an event: absent (or null) is rank 0, a worker without data
/// parallelism; anything else must be an integer that fits a [`DpRank`]. A wider one
/// is malformed, never cut down to its low bits (that would be another worker's rank).
fn dp_rank(v: &Value) -> Option<DpRank> {
    match v {
        Value::Null => Some(0),
        v => v.as_u64().and_then(|d| DpRank::try_from(d).ok()),
    }
}

/// [`parse`], and how many malformed events it skipped.
fn parse_counted(body: &[u8]) -> Result<(State, usize), RecoveryError> {
    let doc: BTreeMap<String, Value> =
        serde_json::from_slice(body).map_err(|e| RecoveryError::Dump(e.to_string()))?;
    let mut state = State::default();
    let mut skipped = 0;
    for (key, ix) in doc {
        // Model names may contain ':'; tenants (Dynamo routing groups) do not.
        let (model, tenant) = key
            .rsplit_once(':')
            .map(|(m, t)| (m.to_string(), t.to_string()))
            .unwrap_or((key.clone(), "default".to_string()));
        let block_size = ix["block_size"]
            .as_u64()
            .filter(|b| *b > 0 && *b <= u32::MAX as u64)
            .ok_or_else(|| RecoveryError::Dump(format!("{key}: no block_size")))?
            as u32;
        let events = ix["events"]
            .as_array()
            .ok_or_else(|| RecoveryError::Dump(format!("{key}: no events")))?;
        let mut workers: BTreeMap<(InstanceKey, DpRank), Vec<SeedBlock>> = BTreeMap::new();
        let mut bad = 0usize;
        for e in events {
            // Dynamo's integer, or the name kvix prints for a Mooncake instance.
            let worker = match &e["worker_id"] {
                Value::Number(n) => n.as_u64().map(InstanceKey::Id),
                Value::String(s) => Some(InstanceKey::parse(s)),
                _ => None,
            };
            let Some(worker) = worker else {
                bad += 1;
                continue;
            };
            let ev = &e["event"];
            let Some(dp) = dp_rank(&ev["dp_rank"]) else {
                bad += 1;
                continue;
            };
            let Some(stored) = ev["data"].get("stored") else {
                continue; // removed / cleared: nothing held
            };
            let t = tier(e["storage_tier"].as_str());
            let mut parent = match &stored["parent_hash"] {
                Value::Null => None,
                v => match hash(v) {
                    Some(h) => Some(EngineHash(h)),
                    None => {
                        bad += 1;
                        continue;
                    }
                },
            };
            // kvix peers add the parent's sequence hash: exact even for a block whose
            // parent was evicted (its engine hash no longer resolves).
            let mut parent_seq = stored["kvix_parent_seq"].as_u64().map(SeqHash);
            let Some(blocks) = stored["blocks"].as_array() else {
                bad += 1;
                continue;
            };
            let out = workers.entry((worker, dp)).or_default();
            for b in blocks {
                let (Some(bh), Some(th)) = (hash(&b["block_hash"]), hash(&b["tokens_hash"])) else {
                    bad += 1;
                    break;
                };
                out.push(SeedBlock {
                    engine: EngineHash(bh),
                    parent_engine: parent,
                    parent_seq,
                    local: BlockHash(th),
                    tier: t,
                });
                parent = Some(EngineHash(bh));
                parent_seq = None;
            }
        }
        if bad > 0 {
            tracing::warn!(index = key, bad, "malformed dump events skipped");
        }
        skipped += bad;
        state.indexes.push(IndexState {
            model,
            tenant,
            block_size,
            listeners: Vec::new(),
            workers: workers
                .into_iter()
                .map(|((instance, dp), blocks)| WorkerBlocks {
                    instance,
                    dp,
                    blocks,
                })
                .collect(),
        });
    }
    Ok((state, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamo_shaped_dump_with_chains_and_other_events() {
        let doc = br#"{"m:x:default": {"block_size": 4, "events": [
          {"worker_id": 1, "storage_tier": "device", "event": {"event_id": 0,
            "data": {"stored": {"parent_hash": null, "blocks": [
              {"block_hash": 10, "tokens_hash": 100}, {"block_hash": -2, "tokens_hash": 200}]}},
            "dp_rank": 1}},
          {"worker_id": 1, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [10]}}, "dp_rank": 1}},
          {"worker_id": 1, "event": {"event_id": 2, "data": "cleared", "dp_rank": 0}},
          {"worker_id": "vllm-1", "event": {"event_id": 3, "data": {"stored": {"parent_hash": null,
            "blocks": [{"block_hash": 5, "tokens_hash": 50}]}}, "dp_rank": 0}},
          {"worker_id": [1]}
        ]}}"#;
        let s = parse(doc).unwrap();
        assert_eq!(s.indexes.len(), 1);
        let ix = &s.indexes[0];
        assert_eq!(
            (ix.model.as_str(), ix.tenant.as_str(), ix.block_size),
            ("m:x", "default", 4)
        );
        assert_eq!(ix.workers.len(), 2);
        let w = &ix.workers[0];
        assert_eq!((&w.instance, w.dp), (&InstanceKey::Id(1), 1));
        assert_eq!(ix.workers[1].instance, InstanceKey::Name("vllm-1".into()));
        assert_eq!(w.blocks[1].parent_engine, Some(EngineHash(10)));
        assert_eq!(w.blocks[1].engine, EngineHash(u64::MAX - 1));
        assert!(parse(b"[1,2]").is_err());
        assert!(parse(b"{\"a:b\": {\"events\": []}}").is_err());
    }

    #[test]
    fn a_dp_rank_that_is_no_u32_skips_its_event_as_malformed() {
        let ev = |dp: &str, bh: u64| {
            format!(
                r#"{{"worker_id": 1, "event": {{"event_id": 0, "data": {{"stored": {{
                  "parent_hash": null, "blocks": [{{"block_hash": {bh}, "tokens_hash": 1}}]}}}}
                  {dp}}}}}"#
            )
        };
        let events = [
            // 2^32 + 1 would have been read as rank 1.
            ev(r#", "dp_rank": 4294967297"#, 10),
            ev(r#", "dp_rank": -1"#, 11),
            ev(r#", "dp_rank": "1""#, 12),
            ev(r#", "dp_rank": 1.5"#, 13),
            ev(r#", "dp_rank": 4294967295"#, 14),
            ev(r#", "dp_rank": null"#, 15),
            ev("", 16),
        ];
        let doc = format!(
            r#"{{"m:t": {{"block_size": 4, "events": [{}]}}}}"#,
            events.join(",")
        );
        let (s, skipped) = parse_counted(doc.as_bytes()).unwrap();
        assert_eq!(skipped, 4);
        let got: Vec<(DpRank, Vec<u64>)> = s.indexes[0]
            .workers
            .iter()
            .map(|w| (w.dp, w.blocks.iter().map(|b| b.engine.0).collect()))
            .collect();
        assert_eq!(got, vec![(0, vec![15, 16]), (u32::MAX, vec![14])]);
    }
}
