//! `/dump`'s body: Dynamo's RouterEvent shape, a chunk at a time from a shard
//! export, with kvix's additions (parent sequence hash, KV-cache groups).
//!
//! Owns the dump's wire shape, which `recovery::dump` reads back. Must never
//! read the index: it renders the export it is handed.

use super::write::num;
use crate::types::{DpRank, Tier};

/// Dynamo's `storage_tier` names.
fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::DEVICE => "device",
        Tier::HOST => "host_pinned",
        Tier::DISK => "disk",
        _ => "external",
    }
}

/// Where a `/dump` rendering stands: which index and pair come next.
#[derive(Default)]
pub struct DumpCursor {
    index: usize,
    pair: usize,
    event_id: u64,
    /// The opening brace is written.
    started: bool,
    /// The current index's opening (key, block size) is written.
    opened: bool,
    done: bool,
    tiers: Vec<crate::ingest::feed::SeedBlock>,
}

/// Render the next part of `/dump` (at least `budget` bytes unless the end comes
/// first) into `out`; returns false once everything, the closing brace included, is
/// written. The shape is Dynamo's: `{"model:tenant": {"block_size", "events":
/// [RouterEvent]}}`, one `stored` event per (block, worker, tier), each worker's
/// blocks parents first (the export's order).
pub fn dump_chunk(
    out: &mut Vec<u8>,
    export: &crate::recovery::export::Export,
    cur: &mut DumpCursor,
    budget: usize,
) -> bool {
    if cur.done {
        return false;
    }
    if !cur.started {
        out.push(b'{');
        cur.started = true;
    }
    while out.len() < budget {
        let Some(ix) = export.indexes.get(cur.index) else {
            out.push(b'}');
            cur.done = true;
            return true;
        };
        if !cur.opened {
            if cur.index > 0 {
                out.push(b',');
            }
            let info = &ix.info;
            out.extend_from_slice(
                serde_json::to_string(&format!("{}:{}", info.model, info.tenant))
                    .unwrap_or_default()
                    .as_bytes(),
            );
            out.extend_from_slice(b":{\"block_size\":");
            num(out, info.block_size);
            dump_group_specs(out, export, ix);
            out.extend_from_slice(b",\"events\":[");
            cur.opened = true;
            cur.event_id = 0;
            cur.pair = 0;
        }
        if cur.pair >= ix.len() {
            out.extend_from_slice(b"]}");
            cur.index += 1;
            cur.opened = false;
            continue;
        }
        let mut tiers = std::mem::take(&mut cur.tiers);
        tiers.clear();
        let (_, instance, dp) = ix.pair(cur.pair, &mut tiers);
        let instance = export.instance_key(instance);
        for b in &tiers {
            if cur.event_id > 0 {
                out.push(b',');
            }
            dump_event(out, &instance, dp, b, cur.event_id);
            cur.event_id += 1;
        }
        cur.tiers = tiers;
        cur.pair += 1;
    }
    true
}

/// A worker as `worker_id` names it: an integer as Dynamo prints it, a Mooncake
/// name as the string it is.
fn worker_id(out: &mut Vec<u8>, instance: &crate::registry::InstanceKey) {
    match instance {
        crate::registry::InstanceKey::Id(i) => num(out, *i),
        name => out.extend_from_slice(
            serde_json::to_string(&name.to_string())
                .unwrap_or_default()
                .as_bytes(),
        ),
    }
}

/// kvix's own addition to an index of `/dump` (written only for a hybrid model;
/// Dynamo readers ignore the field): `"kvix_group_specs": [{"worker_id", "dp_rank",
/// "align", "groups": [{"group_idx", "kind", "block_size", "sliding_window" |
/// "attention_chunk_size"}]}]`, each worker's KV-cache groups besides full
/// attention as their stores described them.
fn dump_group_specs(
    out: &mut Vec<u8>,
    export: &crate::recovery::export::Export,
    ix: &crate::recovery::export::IndexExport,
) {
    use crate::shard::hybrid::GroupRule;
    let mut first = true;
    for (instance, dp, g) in ix.slot_groups() {
        out.extend_from_slice(if first {
            &b",\"kvix_group_specs\":[{\"worker_id\":"[..]
        } else {
            &b",{\"worker_id\":"[..]
        });
        first = false;
        worker_id(out, &export.instance_key(instance));
        out.extend_from_slice(b",\"dp_rank\":");
        num(out, dp);
        out.extend_from_slice(b",\"align\":");
        match g.align {
            Some(a) => num(out, a),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"groups\":[");
        for (j, (group, spec)) in g.groups.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"group_idx\":");
            num(out, *group);
            out.extend_from_slice(b",\"block_size\":");
            num(out, spec.block_size);
            out.extend_from_slice(b",\"kind\":");
            match spec.rule {
                GroupRule::SlidingWindow(w) => {
                    out.extend_from_slice(b"\"sliding_window\",\"sliding_window\":");
                    num(out, w);
                }
                GroupRule::ChunkedLocal(c) => {
                    out.extend_from_slice(b"\"chunked_local_attention\",\"attention_chunk_size\":");
                    num(out, c);
                }
                GroupRule::Mamba => out.extend_from_slice(b"\"mamba\""),
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
    }
    if !first {
        out.push(b']');
    }
}

/// One `stored` RouterEvent. Block and parent hashes are the worker's own engine
/// hashes where kvix knows them (so a peer can resolve later live events), else kvix
/// sequence hashes.
fn dump_event(
    out: &mut Vec<u8>,
    instance: &crate::registry::InstanceKey,
    dp: DpRank,
    b: &crate::ingest::feed::SeedBlock,
    event_id: u64,
) {
    out.extend_from_slice(b"{\"worker_id\":");
    worker_id(out, instance);
    out.extend_from_slice(b",\"storage_tier\":\"");
    out.extend_from_slice(tier_name(b.tier).as_bytes());
    out.extend_from_slice(b"\",\"residency_domain\":\"worker\",\"event\":{\"event_id\":");
    num(out, event_id);
    out.extend_from_slice(b",\"data\":{\"stored\":{\"parent_hash\":");
    match b.parent_engine {
        Some(p) => num(out, p.0),
        None => out.extend_from_slice(b"null"),
    }
    // kvix's own addition: the parent's sequence hash, exact even when the parent
    // was evicted before its child (Dynamo readers ignore unknown fields).
    out.extend_from_slice(b",\"kvix_parent_seq\":");
    match b.parent_seq {
        Some(p) => num(out, p.0),
        None => out.extend_from_slice(b"null"),
    }
    // kvix's too, for a hybrid model: the worker's other KV-cache groups holding
    // the block, as bits by `group_idx`.
    if b.groups != 0 {
        out.extend_from_slice(b",\"kvix_groups\":");
        num(out, b.groups);
    }
    out.extend_from_slice(b",\"start_position\":null,\"blocks\":[{\"block_hash\":");
    num(out, b.engine.0);
    out.extend_from_slice(b",\"tokens_hash\":");
    num(out, b.local.0);
    out.extend_from_slice(b",\"mm_extra_info\":null}]}},\"dp_rank\":");
    num(out, dp);
    out.extend_from_slice(b"}}");
}
