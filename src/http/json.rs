//! Response rendering: Dynamo's score, worker and dump JSON.
//!
//! Owns the exact wire shape of responses. Scores are written straight into
//! a byte buffer (this is the hot path); the rare control responses use serde_json.

use super::Reply;
use crate::query::Overlap;
use crate::registry::IndexInfo;
use crate::shard::DumpedBlock;
use crate::types::{DpRank, EngineHash, InstanceId, SeqHash, Tier, WorkerSlot};
use bytes::Bytes;
use http_body_util::Full;
use hyper::StatusCode;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use std::collections::HashMap;

pub fn bytes(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub fn empty(status: StatusCode) -> Reply {
    let mut r = hyper::Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

pub fn ok(status: StatusCode) -> Reply {
    bytes(status, br#"{"status":"ok"}"#.to_vec())
}

fn num(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn key(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.push(b'"');
    num(out, n);
    out.extend_from_slice(b"\":");
}

/// Write `{"<instance>":{"<dp>":v,...},...}` for rows sorted by (instance, dp).
fn nested(out: &mut Vec<u8>, rows: &[(InstanceId, DpRank, u64)]) {
    out.push(b'{');
    let mut prev: Option<InstanceId> = None;
    for &(inst, dp, v) in rows {
        if prev != Some(inst) {
            if prev.is_some() {
                out.extend_from_slice(b"},");
            }
            key(out, inst);
            out.push(b'{');
            prev = Some(inst);
        } else {
            out.push(b',');
        }
        key(out, dp);
        num(out, v);
    }
    if prev.is_some() {
        out.push(b'}');
    }
    out.push(b'}');
}

/// Dynamo's ScoreResponse, plus the older `tree_sizes`:
/// `{"scores":{inst:{dp:tokens}},"frequencies":[..],"tree_sizes":{inst:{dp:blocks}},
///   "instances":{inst:{"longest_matched","gpu","dp":{dp:tokens},"cpu","disk"}}}`.
pub fn scores(ix: &IndexInfo, ov: &Overlap) -> Vec<u8> {
    let bs = ix.block_size as u64;
    let mut rows: Vec<(InstanceId, DpRank, WorkerSlot)> = ix
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.live)
        .map(|(i, s)| (s.instance, s.dp, WorkerSlot(i as u32)))
        .collect();
    rows.sort_unstable();
    let matched = |s: WorkerSlot| ov.matched.get(s.0 as usize).copied().unwrap_or_default();
    let mut out = Vec::with_capacity(256 + rows.len() * 64);
    out.extend_from_slice(b"{\"scores\":");
    let device: Vec<_> = rows
        .iter()
        .filter(|r| matched(r.2)[0] > 0)
        .map(|&(i, d, s)| (i, d, matched(s)[0] as u64 * bs))
        .collect();
    nested(&mut out, &device);
    out.extend_from_slice(b",\"frequencies\":[");
    for (i, f) in ov.frequencies.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        num(&mut out, *f);
    }
    out.extend_from_slice(b"],\"tree_sizes\":");
    let sizes: Vec<_> = rows
        .iter()
        .map(|&(i, d, s)| {
            (
                i,
                d,
                ov.tree_sizes.get(s.0 as usize).copied().unwrap_or(0) as u64,
            )
        })
        .collect();
    nested(&mut out, &sizes);
    out.extend_from_slice(b",\"instances\":{");
    let any: Vec<_> = rows.iter().filter(|r| matched(r.2)[2] > 0).collect();
    let mut first = true;
    for group in any.chunk_by(|a, b| a.0 == b.0) {
        if !first {
            out.push(b',');
        }
        first = false;
        let max = |k: usize| {
            group
                .iter()
                .map(|r| matched(r.2)[k] as u64 * bs)
                .max()
                .unwrap_or(0)
        };
        let (gpu, cpu, disk) = (max(0), max(1), max(2));
        key(&mut out, group[0].0);
        out.extend_from_slice(b"{\"longest_matched\":");
        num(&mut out, gpu.max(cpu).max(disk));
        out.extend_from_slice(b",\"gpu\":");
        num(&mut out, gpu);
        out.extend_from_slice(b",\"dp\":{");
        for (j, r) in group.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            key(&mut out, r.1);
            num(&mut out, matched(r.2)[0] as u64 * bs);
        }
        out.extend_from_slice(b"},\"cpu\":");
        num(&mut out, cpu);
        out.extend_from_slice(b",\"disk\":");
        num(&mut out, disk);
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
    out
}

/// Dynamo's `storage_tier` names.
fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::DEVICE => "device",
        Tier::HOST => "host_pinned",
        Tier::DISK => "disk",
        _ => "external",
    }
}

/// One index's `/dump` events: a `stored` RouterEvent per (block, holder, tier), parents
/// first. Block and parent hashes are the worker's own engine hashes where kvix knows
/// them (so a peer can resolve later live events), else kvix sequence hashes.
pub fn dump_events(
    out: &mut Vec<u8>,
    ix: &IndexInfo,
    blocks: &[DumpedBlock],
    engine: &HashMap<(WorkerSlot, SeqHash), EngineHash>,
) {
    let parent_of: HashMap<SeqHash, Option<SeqHash>> =
        blocks.iter().map(|b| (b.seq, b.parent)).collect();
    let mut depth: HashMap<SeqHash, u32> = HashMap::with_capacity(parent_of.len());
    let mut chain = Vec::new();
    for b in blocks {
        // Climb until a block of known depth, a root, or a parent missing from the dump;
        // then number the climbed blocks top-down.
        let mut cur = b.seq;
        let base = loop {
            if let Some(d) = depth.get(&cur) {
                break d + 1;
            }
            chain.push(cur);
            match parent_of.get(&cur).copied().flatten() {
                Some(p) if parent_of.contains_key(&p) && chain.len() <= parent_of.len() => cur = p,
                _ => break 0,
            }
        };
        for (i, s) in chain.drain(..).rev().enumerate() {
            depth.insert(s, base + i as u32);
        }
    }
    let mut order: Vec<&DumpedBlock> = blocks.iter().collect();
    // Cached keys: a hash lookup per comparison is seconds at a million blocks.
    order.sort_by_cached_key(|b| {
        (
            depth.get(&b.seq).copied().unwrap_or(0),
            b.holder.slot(),
            b.seq,
        )
    });
    let ext =
        |slot: WorkerSlot, seq: SeqHash| engine.get(&(slot, seq)).map(|e| e.0).unwrap_or(seq.0);
    // The engine hashes are gathered before the shards are read, so a block without one
    // was stored after that: a recovering peer receives it live. Leaving it out keeps
    // every dumped block_hash a real engine hash (later removes resolve on the peer).
    let recent =
        |slot: WorkerSlot, seq: SeqHash| !engine.is_empty() && !engine.contains_key(&(slot, seq));
    out.push(b'[');
    let mut event_id = 0u64;
    for b in order {
        let slot = b.holder.slot();
        let Some(info) = ix.slots.get(slot.0 as usize) else {
            continue;
        };
        if recent(slot, b.seq) {
            continue;
        }
        for t in 0..Tier::COUNT as u8 {
            if !b.holder.has(Tier(t)) {
                continue;
            }
            if event_id > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"worker_id\":");
            num(out, info.instance);
            out.extend_from_slice(b",\"storage_tier\":\"");
            out.extend_from_slice(tier_name(Tier(t)).as_bytes());
            out.extend_from_slice(b"\",\"residency_domain\":\"worker\",\"event\":{\"event_id\":");
            num(out, event_id);
            out.extend_from_slice(b",\"data\":{\"stored\":{\"parent_hash\":");
            match b.parent {
                Some(p) => num(out, ext(slot, p)),
                None => out.extend_from_slice(b"null"),
            }
            // kvix's own addition: the parent's sequence hash, exact even when the parent
            // was evicted before its child (Dynamo readers ignore unknown fields).
            out.extend_from_slice(b",\"kvix_parent_seq\":");
            match b.parent {
                Some(p) => num(out, p.0),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"start_position\":null,\"blocks\":[{\"block_hash\":");
            num(out, ext(slot, b.seq));
            out.extend_from_slice(b",\"tokens_hash\":");
            num(out, b.local.0);
            out.extend_from_slice(b",\"mm_extra_info\":null}]}},\"dp_rank\":");
            num(out, info.dp);
            out.extend_from_slice(b"}}");
            event_id += 1;
        }
    }
    out.push(b']');
}
