//! Response rendering: Dynamo's score, worker and dump JSON.
//!
//! Owns the exact wire shape of responses. Scores are written straight into
//! a byte buffer (this is the hot path); the rare control responses use serde_json.

use super::Reply;
use crate::query::{InstanceOverlap, Overlap};
use crate::registry::{IndexInfo, Snapshot};
use crate::types::{DpRank, InstanceId, Tier, WorkerSlot};
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::StatusCode;
use hyper::header::{CONTENT_TYPE, HeaderValue};

pub fn bytes(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut r = hyper::Response::new(Either::Left(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub fn empty(status: StatusCode) -> Reply {
    let mut r = hyper::Response::new(Either::Left(Full::new(Bytes::new())));
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

/// Write an instance's router-facing name as a JSON object key.
fn inst_key(out: &mut Vec<u8>, snap: &Snapshot, inst: InstanceId) {
    if inst >= crate::registry::NAMED_BASE {
        let name = serde_json::to_string(&snap.instance_key(inst).to_string()).unwrap_or_default();
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
    } else {
        key(out, inst);
    }
}

/// Write `{"<instance>":{"<dp>":v,...},...}` for rows sorted by (instance, dp).
fn nested<V: Copy>(
    out: &mut Vec<u8>,
    snap: &Snapshot,
    rows: &[(InstanceId, DpRank, V)],
    mut value: impl FnMut(&mut Vec<u8>, V),
) {
    out.push(b'{');
    let mut prev: Option<InstanceId> = None;
    for &(inst, dp, v) in rows {
        if prev != Some(inst) {
            if prev.is_some() {
                out.extend_from_slice(b"},");
            }
            inst_key(out, snap, inst);
            out.push(b'{');
            prev = Some(inst);
        } else {
            out.push(b',');
        }
        key(out, dp);
        value(out, v);
    }
    if prev.is_some() {
        out.push(b'}');
    }
    out.push(b'}');
}

fn float(out: &mut Vec<u8>, v: f32) {
    // Scores are sums of weights in [0, 1]; four decimals keep them exact enough.
    let v = (v as f64 * 10_000.0).round() / 10_000.0;
    // `{:?}` keeps a decimal point (1.0, not 1): these are JSON floats.
    out.extend_from_slice(format!("{v:?}").as_bytes());
}

/// One instance's conductor object: `{"longest_matched","GPU","DP":{dp:tokens},"CPU","DISK",...}`,
/// in matched tokens. Tiers beyond the three well-known ones appear by name when hit.
fn instance_object(out: &mut Vec<u8>, snap: &Snapshot, ix: &IndexInfo, o: &InstanceOverlap) {
    let bs = ix.block_size as u64;
    out.extend_from_slice(b"{\"longest_matched\":");
    num(out, o.longest as u64 * bs);
    out.extend_from_slice(b",\"GPU\":");
    num(out, o.per_tier[Tier::DEVICE.0 as usize] as u64 * bs);
    out.extend_from_slice(b",\"DP\":{");
    let mut dps: Vec<(DpRank, u32)> = o
        .per_slot_device
        .iter()
        .map(|(s, n)| (ix.slot(*s).dp, *n))
        .collect();
    dps.sort_unstable();
    for (j, (dp, n)) in dps.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        key(out, *dp);
        num(out, *n as u64 * bs);
    }
    out.extend_from_slice(b"},\"CPU\":");
    num(out, o.per_tier[Tier::HOST.0 as usize] as u64 * bs);
    out.extend_from_slice(b",\"DISK\":");
    num(out, o.per_tier[Tier::DISK.0 as usize] as u64 * bs);
    for t in 3..Tier::COUNT {
        if o.per_tier[t] > 0 {
            out.push(b',');
            let name = serde_json::to_string(snap.tier_name(Tier(t as u8))).unwrap_or_default();
            out.extend_from_slice(name.as_bytes());
            out.push(b':');
            num(out, o.per_tier[t] as u64 * bs);
        }
    }
    out.push(b'}');
}

/// Mooncake conductor response: `{"<tenant>":{"<instance>":{...}}}` for every live instance.
pub fn conductor(
    snap: &Snapshot,
    ix: &IndexInfo,
    tenant: &str,
    per: &[(InstanceId, InstanceOverlap)],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + per.len() * 96);
    out.push(b'{');
    out.extend_from_slice(serde_json::to_string(tenant).unwrap_or_default().as_bytes());
    out.extend_from_slice(b":{");
    for (i, (inst, o)) in per.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        inst_key(&mut out, snap, *inst);
        instance_object(&mut out, snap, ix, o);
    }
    out.extend_from_slice(b"}}");
    out
}

/// Dynamo's ScoreResponse (1.6: `scores`, `frequencies`, `instances`) plus the
/// documented `tree_sizes` and, on request, llm-d scores:
/// `{"scores":{inst:{dp:tokens}},"frequencies":[..],"tree_sizes":{inst:{dp:blocks}},
///   "instances":{inst:{"longest_matched","gpu","dp":{dp:tokens},"cpu","disk"}}
///   [,"llm_d":{inst:{dp:{"score","normalized"}}}]}`.
/// `scores` counts device blocks, as Dynamo's router does.
pub fn scores(
    snap: &Snapshot,
    ix: &IndexInfo,
    ov: &Overlap,
    llmd: Option<&[f32]>,
    live: &impl Fn(WorkerSlot) -> bool,
) -> Vec<u8> {
    let bs = ix.block_size as u64;
    let mut rows: Vec<(InstanceId, DpRank, WorkerSlot)> = ix
        .slots
        .iter()
        .enumerate()
        .filter(|(i, _)| live(WorkerSlot(*i as u32)))
        .map(|(i, s)| (s.instance, s.dp, WorkerSlot(i as u32)))
        .collect();
    rows.sort_unstable();
    let matched = |s: WorkerSlot| ov.matched.get(s.0 as usize).copied().unwrap_or_default();
    // A live slot writes ~110 bytes (its score, tree size and `instances` entry):
    // sized once, the reply is never copied to grow.
    let mut out = Vec::with_capacity(256 + rows.len() * 128);
    out.extend_from_slice(b"{\"scores\":");
    let device: Vec<_> = rows
        .iter()
        .filter(|r| matched(r.2)[0] > 0)
        .map(|&(i, d, s)| (i, d, matched(s)[0] as u64 * bs))
        .collect();
    nested(&mut out, snap, &device, num);
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
    nested(&mut out, snap, &sizes, num);
    // Dynamo 1.6's `instances`: every live instance; `cpu` and `disk` extend the
    // device prefix through the lower tiers (cumulative), per Dynamo's router.
    out.extend_from_slice(b",\"instances\":{");
    for (g, group) in rows.chunk_by(|a, b| a.0 == b.0).enumerate() {
        if g > 0 {
            out.push(b',');
        }
        let max = |k: usize| {
            group
                .iter()
                .map(|r| matched(r.2)[k] as u64 * bs)
                .max()
                .unwrap_or(0)
        };
        let (gpu, cpu, disk) = (max(0), max(1), max(2));
        inst_key(&mut out, snap, group[0].0);
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
    out.push(b'}');
    if let Some(raw) = llmd {
        let live_scores: Vec<f32> = rows.iter().map(|r| raw[r.2.0 as usize]).collect();
        let norm = crate::query::normalize(&live_scores);
        let vals: Vec<_> = rows
            .iter()
            .zip(live_scores.iter().zip(&norm))
            .map(|(&(i, d, _), (&s, &n))| (i, d, (s, n)))
            .collect();
        out.extend_from_slice(b",\"llm_d\":");
        nested(&mut out, snap, &vals, |o, (s, n)| {
            o.extend_from_slice(b"{\"score\":");
            float(o, s);
            o.extend_from_slice(b",\"normalized\":");
            float(o, n);
            o.push(b'}');
        });
    }
    out.push(b'}');
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
    // An integer as Dynamo prints it; a Mooncake name as the string it is.
    match instance {
        crate::registry::InstanceKey::Id(i) => num(out, *i),
        name => out.extend_from_slice(
            serde_json::to_string(&name.to_string())
                .unwrap_or_default()
                .as_bytes(),
        ),
    }
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
    out.extend_from_slice(b",\"start_position\":null,\"blocks\":[{\"block_hash\":");
    num(out, b.engine.0);
    out.extend_from_slice(b",\"tokens_hash\":");
    num(out, b.local.0);
    out.extend_from_slice(b",\"mm_extra_info\":null}]}},\"dp_rank\":");
    num(out, dp);
    out.extend_from_slice(b"}}");
}
