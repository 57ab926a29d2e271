//! Response rendering: Dynamo's score, worker and dump JSON.
//!
//! Owns the exact wire shape of responses. Scores are written straight into
//! a byte buffer (this is the hot path); the rare control responses use serde_json.

use super::Reply;
use crate::registry::{IndexInfo, Snapshot};
use crate::score::{Hit, InstanceOverlap, Overlap, TieredSlot};
use crate::types::{DpRank, InstanceId, Tier, WorkerSlot};
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::StatusCode;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

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

/// Two-digit pairs "00".."99", so a number is written two digits per division.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Append `n` in decimal. Digits go straight into the buffer's spare room: a
/// reply holds hundreds of numbers, and formatting each into a scratch buffer
/// and copying it out cost a `memcpy` call apiece.
fn num(out: &mut Vec<u8>, n: impl Into<u64>) {
    let mut n: u64 = n.into();
    let digits = n.checked_ilog10().unwrap_or(0) as usize + 1;
    out.reserve(digits);
    let start = out.len();
    let spare = &mut out.spare_capacity_mut()[..digits];
    let mut i = digits;
    while n >= 100 {
        let pair = 2 * (n % 100) as usize;
        n /= 100;
        i -= 2;
        spare[i].write(PAIRS[pair]);
        spare[i + 1].write(PAIRS[pair + 1]);
    }
    if n >= 10 {
        let pair = 2 * n as usize;
        spare[0].write(PAIRS[pair]);
        spare[1].write(PAIRS[pair + 1]);
    } else {
        spare[0].write(b'0' + n as u8);
    }
    // SAFETY: `spare[..digits]` is written above: the loop fills it from the end,
    // two digits at a time, down to index 2 or 1, and the branch fills the rest.
    unsafe { out.set_len(start + digits) };
}

/// A number's decimal text, rendered once where a reply repeats it (an
/// instance's tiers mostly hold the same count). Up to eight digits are kept as
/// one word, built in a register and stored whole: text built byte by byte and
/// then copied out as one wide load stalls the store buffer.
#[derive(Clone, Copy)]
enum Digits {
    /// The digits as little-endian bytes of the word, and how many there are.
    Short(u64, u8),
    /// Nine digits or more: written by [`num`].
    Long(u64),
}

impl Digits {
    #[inline]
    fn of(n: u64) -> Digits {
        if n >= 100_000_000 {
            return Digits::Long(n);
        }
        let digits = n.checked_ilog10().unwrap_or(0) as u8 + 1;
        let mut n = n as u32;
        let mut word = 0u64;
        // Pairs from the least significant up, each shifted in below the ones
        // before, so that the most significant digit ends in the lowest byte.
        for _ in 0..digits / 2 {
            let pair = 2 * (n % 100) as usize;
            n /= 100;
            word = word << 16 | u16::from_le_bytes([PAIRS[pair], PAIRS[pair + 1]]) as u64;
        }
        if digits % 2 == 1 {
            word = word << 8 | (b'0' + n as u8) as u64;
        }
        Digits::Short(word, digits)
    }

    #[inline]
    fn put(self, out: &mut Vec<u8>) {
        match self {
            Digits::Short(word, len) => {
                out.reserve(8);
                let start = out.len();
                // SAFETY: `reserve` left room for 8 more bytes, so the unaligned
                // write stays inside the allocation; `set_len` then keeps only
                // the first `len` (<= 8) of them, all written.
                unsafe {
                    out.as_mut_ptr()
                        .add(start)
                        .cast::<u64>()
                        .write_unaligned(word.to_le());
                    out.set_len(start + len as usize);
                }
            }
            Digits::Long(n) => num(out, n),
        }
    }
}

fn key(out: &mut Vec<u8>, n: impl Into<u64>) {
    out.push(b'"');
    num(out, n);
    out.extend_from_slice(b"\":");
}

/// One JSON object key with its colon (`"7":`), rendered once.
#[derive(Clone)]
enum Key {
    /// Most keys: the text in a fixed cell, copied whole (no `memcpy` call)
    /// and then cut to its length.
    Short([u8; KEY_CELL], u8),
    Long(Box<[u8]>),
}

const KEY_CELL: usize = 32;

impl Key {
    fn new(text: &[u8]) -> Key {
        if text.len() <= KEY_CELL {
            let mut cell = [0u8; KEY_CELL];
            cell[..text.len()].copy_from_slice(text);
            Key::Short(cell, text.len() as u8)
        } else {
            Key::Long(text.into())
        }
    }

    #[inline]
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Key::Short(cell, len) => {
                out.reserve(KEY_CELL);
                let start = out.len();
                // SAFETY: `reserve` left room for KEY_CELL more bytes, so the copy stays
                // inside the allocation and cannot overlap `cell`; `set_len` then keeps
                // only the first `len` (<= KEY_CELL) of the bytes just written.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        cell.as_ptr(),
                        out.as_mut_ptr().add(start),
                        KEY_CELL,
                    );
                    out.set_len(start + *len as usize);
                }
            }
            Key::Long(text) => out.extend_from_slice(text),
        }
    }
}

/// Write an instance's router-facing name as a JSON object key.
fn inst_key(out: &mut Vec<u8>, snap: &Snapshot, inst: InstanceId) {
    if inst >= crate::registry::NAMED_BASE {
        let name = serde_json::to_string(&snap.instance_key(inst).to_string()).unwrap_or_default();
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
    } else {
        key(out, inst as u64);
    }
}

/// What a score reply needs of an index that only changes with the registry:
/// its slots in (instance, dp) order and each slot's instance and dp keys.
struct Layout {
    /// The index this was rendered from; a new snapshot brings a new `Arc`.
    ix: Arc<IndexInfo>,
    order: Vec<WorkerSlot>,
    inst: Vec<Key>,
    dp: Vec<Key>,
    /// The last `tree_sizes` object rendered and the rows it was rendered from:
    /// they change only as events apply, so back-to-back queries reuse the text.
    sizes: RefCell<Option<Rendered>>,
}

/// Rows of (slot, value) and the text rendered from them.
type Rendered = (Vec<(WorkerSlot, u64)>, Vec<u8>);

impl Layout {
    fn new(snap: &Snapshot, ix: &Arc<IndexInfo>) -> Layout {
        let mut order: Vec<WorkerSlot> = (0..ix.slots.len() as u32).map(WorkerSlot).collect();
        order.sort_unstable_by_key(|s| (ix.slot(*s).instance, ix.slot(*s).dp));
        let mut text = Vec::new();
        let mut render = |f: &mut dyn FnMut(&mut Vec<u8>)| {
            text.clear();
            f(&mut text);
            Key::new(&text)
        };
        let inst = ix
            .slots
            .iter()
            .map(|s| render(&mut |t| inst_key(t, snap, s.instance)))
            .collect();
        let dp = ix
            .slots
            .iter()
            .map(|s| render(&mut |t| key(t, s.dp)))
            .collect();
        Layout {
            ix: ix.clone(),
            order,
            inst,
            dp,
            sizes: RefCell::default(),
        }
    }
}

thread_local! {
    /// Each executor's layouts, by index id. Replies are rendered on the executor
    /// that answers them, so this is never shared.
    static LAYOUTS: RefCell<Vec<Option<Rc<Layout>>>> = const { RefCell::new(Vec::new()) };
}

/// The layout of `ix`, rendered again only when the registry replaced it.
fn layout(snap: &Snapshot, ix: &Arc<IndexInfo>) -> Rc<Layout> {
    LAYOUTS.with_borrow_mut(|all| {
        let at = ix.id.0 as usize;
        if all.len() <= at {
            all.resize(at + 1, None);
        }
        match &all[at] {
            Some(l) if Arc::ptr_eq(&l.ix, ix) => l.clone(),
            _ => {
                let l = Rc::new(Layout::new(snap, ix));
                all[at] = Some(l.clone());
                l
            }
        }
    })
}

/// Write `{"<instance>":{"<dp>":v,...},...}` for rows in layout order.
fn nested<V: Copy>(
    out: &mut Vec<u8>,
    lay: &Layout,
    rows: &[(WorkerSlot, V)],
    mut value: impl FnMut(&mut Vec<u8>, V),
) {
    out.push(b'{');
    let mut prev: Option<InstanceId> = None;
    for &(slot, v) in rows {
        let inst = lay.ix.slot(slot).instance;
        if prev != Some(inst) {
            if prev.is_some() {
                out.extend_from_slice(b"},");
            }
            lay.inst[slot.0 as usize].put(out);
            out.push(b'{');
            prev = Some(inst);
        } else {
            out.push(b',');
        }
        lay.dp[slot.0 as usize].put(out);
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
    ix: &Arc<IndexInfo>,
    ov: &Overlap,
    llmd: Option<&[f32]>,
    live: &impl Fn(WorkerSlot) -> bool,
) -> Vec<u8> {
    let lay = layout(snap, ix);
    let bs = ix.block_size as u64;
    let rows: Vec<WorkerSlot> = lay.order.iter().copied().filter(|s| live(*s)).collect();
    let matched = |s: WorkerSlot| ov.matched.get(s.0 as usize).copied().unwrap_or_default();
    // A live slot writes ~110 bytes (its score, tree size and `instances` entry):
    // sized once, the reply is never copied to grow.
    let mut out = Vec::with_capacity(256 + rows.len() * 128);
    out.extend_from_slice(b"{\"scores\":");
    let device: Vec<_> = rows
        .iter()
        .filter(|s| matched(**s)[0] > 0)
        .map(|&s| (s, matched(s)[0] as u64 * bs))
        .collect();
    nested(&mut out, &lay, &device, num);
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
        .map(|&s| {
            (
                s,
                ov.tree_sizes.get(s.0 as usize).copied().unwrap_or(0) as u64,
            )
        })
        .collect();
    {
        let mut memo = lay.sizes.borrow_mut();
        match memo.as_ref() {
            Some((rows, text)) if *rows == sizes => out.extend_from_slice(text),
            _ => {
                let start = out.len();
                nested(&mut out, &lay, &sizes, num);
                *memo = Some((sizes, out[start..].to_vec()));
            }
        }
    }
    // Dynamo 1.6's `instances`: every live instance; `cpu` and `disk` extend the
    // device prefix through the lower tiers (cumulative), per Dynamo's router.
    out.extend_from_slice(b",\"instances\":{");
    let instance = |s: &WorkerSlot| ix.slot(*s).instance;
    for (g, group) in rows.chunk_by(|a, b| instance(a) == instance(b)).enumerate() {
        if g > 0 {
            out.push(b',');
        }
        let best = group.iter().fold([0u32; 3], |m, s| {
            let x = matched(*s);
            [m[0].max(x[0]), m[1].max(x[1]), m[2].max(x[2])]
        });
        let [gpu, cpu, disk] = best.map(|b| b as u64 * bs);
        // Most instances hold a prefix on one tier, or on every tier alike:
        // render the device count once and copy it where the others equal it.
        let gpu_text = Digits::of(gpu);
        let text = |v: u64| if v == gpu { gpu_text } else { Digits::of(v) };
        lay.inst[group[0].0 as usize].put(&mut out);
        out.extend_from_slice(b"{\"longest_matched\":");
        text(gpu.max(cpu).max(disk)).put(&mut out);
        out.extend_from_slice(b",\"gpu\":");
        gpu_text.put(&mut out);
        out.extend_from_slice(b",\"dp\":{");
        let dp_start = out.len() - 1;
        for (j, s) in group.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            lay.dp[s.0 as usize].put(&mut out);
            text(matched(*s)[0] as u64 * bs).put(&mut out);
        }
        let dp = dp_start..out.len() + 1;
        out.extend_from_slice(b"},\"cpu\":");
        text(cpu).put(&mut out);
        out.extend_from_slice(b",\"disk\":");
        text(disk).put(&mut out);
        effective_and_hit(&mut out, &lay, ov, group, bs, dp);
        out.push(b'}');
    }
    out.push(b'}');
    if let Some(raw) = llmd {
        let live_scores: Vec<f32> = rows.iter().map(|s| raw[s.0 as usize]).collect();
        let norm = crate::score::normalize(&live_scores);
        let vals: Vec<_> = rows
            .iter()
            .zip(live_scores.iter().zip(&norm))
            .map(|(&s, (&v, &n))| (s, (v, n)))
            .collect();
        out.extend_from_slice(b",\"llm_d\":");
        nested(&mut out, &lay, &vals, |o, (s, n)| {
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

/// An instance's `"effective":{dp:tokens},"hit":{dp:"full"|"partial"|"miss"}`
/// for its slots `group`; `dp` is where its `dp` object (the device match per
/// rank) already lies in `out`.
fn effective_and_hit(
    out: &mut Vec<u8>,
    lay: &Layout,
    ov: &Overlap,
    group: &[WorkerSlot],
    bs: u64,
    dp: std::ops::Range<usize>,
) {
    let at = |v: &[u32], s: WorkerSlot| v.get(s.0 as usize).copied().unwrap_or(0);
    let device = |s: WorkerSlot| ov.matched.get(s.0 as usize).map_or(0, |m| m[0]);
    out.extend_from_slice(b",\"effective\":");
    if group.iter().all(|&s| at(&ov.effective, s) == device(s)) {
        // Every worker without other groups: the same object, byte for byte.
        out.extend_from_within(dp);
    } else {
        out.push(b'{');
        for (j, &s) in group.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            lay.dp[s.0 as usize].put(out);
            Digits::of(at(&ov.effective, s) as u64 * bs).put(out);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b",\"hit\":{");
    for (j, &s) in group.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        lay.dp[s.0 as usize].put(out);
        out.push(b'"');
        out.extend_from_slice(Hit::of(at(&ov.effective, s), device(s)).as_str().as_bytes());
        out.push(b'"');
    }
    out.push(b'}');
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

/// `/query_tiered_by_hash`'s answer, dynamo-kv-router's `WireTieredMatchDetails`:
/// `{"block_size", "tiered": {"device": {"scores", "frequencies"}, "lower_tier"}}`,
/// scores and hits as `[{"worker_id", "dp_rank"}, n]` pairs. Every tier of `lower`
/// is listed (one nothing holds with its workers at 0 hits), none when
/// `device_only`. A slot whose instance is not an integer has no Dynamo id and is
/// left out.
pub fn tiered(
    ix: &IndexInfo,
    frequencies: &[u32],
    tiers: &[TieredSlot],
    lower: &[&str],
    device_only: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + 48 * tiers.len());
    out.extend_from_slice(b"{\"block_size\":");
    num(&mut out, ix.block_size);
    out.extend_from_slice(b",\"tiered\":{\"device\":{\"scores\":[");
    let device = tiers.iter().map(|t| (t.device > 0).then_some(t.device));
    worker_pairs(&mut out, ix, device);
    out.extend_from_slice(b"],\"frequencies\":[");
    for (i, &f) in frequencies.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        num(&mut out, f);
    }
    out.extend_from_slice(b"]},\"lower_tier\":[");
    for (k, name) in lower.iter().enumerate().filter(|_| !device_only) {
        if k > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"[\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\",{\"hits\":[");
        let hits = tiers.iter().map(|t| t.listed[k].then_some(t.hits[k]));
        worker_pairs(&mut out, ix, hits);
        out.extend_from_slice(b"]}]");
    }
    out.extend_from_slice(b"]}}");
    out
}

/// `[{"worker_id": id, "dp_rank": r}, n]` for each slot with `Some(n)`, by slot.
fn worker_pairs(out: &mut Vec<u8>, ix: &IndexInfo, per_slot: impl Iterator<Item = Option<u32>>) {
    let mut first = true;
    for (info, n) in ix.slots.iter().zip(per_slot) {
        let (Some(n), Ok(id)) = (n, u64::try_from(info.instance)) else {
            continue;
        };
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(b"[{\"worker_id\":");
        num(out, id);
        out.extend_from_slice(b",\"dp_rank\":");
        num(out, info.dp);
        out.extend_from_slice(b"},");
        num(out, n);
        out.push(b']');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::SlotInfo;
    use crate::types::IndexId;

    #[test]
    fn num_and_digits_write_what_display_writes() {
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15);
        let mut ns = vec![
            0,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            u64::MAX,
            u64::MAX - 1,
        ];
        ns.extend((1..20).flat_map(|p| [10u64.pow(p) - 1, 10u64.pow(p)]));
        ns.extend((0..100_000_000).step_by(9_973));
        for _ in 0..1000 {
            let x = rng.next_u64();
            ns.push(x >> (x % 64));
        }
        for n in ns {
            let mut out = b"[".to_vec();
            num(&mut out, n);
            assert_eq!(out, format!("[{n}").into_bytes());
            let mut out = b"[".to_vec();
            Digits::of(n).put(&mut out);
            assert_eq!(out, format!("[{n}").into_bytes(), "{n} as Digits");
        }
    }

    #[test]
    fn keys_of_any_length_are_written_whole() {
        for len in [0, 1, KEY_CELL - 1, KEY_CELL, KEY_CELL + 1, 300] {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut out = b"{".to_vec();
            Key::new(&text).put(&mut out);
            Key::new(b"\"7\":").put(&mut out);
            assert_eq!(out, [&b"{"[..], &text, b"\"7\":"].concat());
        }
    }

    fn index(slots: &[(InstanceId, DpRank)]) -> Arc<IndexInfo> {
        Arc::new(IndexInfo {
            id: IndexId(0),
            model: "m".into(),
            tenant: "t".into(),
            block_size: 4,
            slots: slots
                .iter()
                .map(|&(instance, dp)| SlotInfo {
                    instance,
                    dp,
                    live: true,
                })
                .collect(),
            slot_of: Default::default(),
            endpoints: Default::default(),
            live_predictions: Default::default(),
        })
    }

    /// Replies group dp ranks under their instance in (instance, dp) order, whatever
    /// the slot order, and a new index (a new registry snapshot) is rendered afresh.
    #[test]
    fn scores_follow_the_current_index() {
        let snap = Snapshot::default();
        let ov = Overlap {
            matched: vec![[2, 2, 2], [1, 2, 3], [3, 3, 3]],
            frequencies: vec![3, 2],
            tree_sizes: vec![5, 6, 7],
            effective: vec![0, 1, 2],
        };
        let all = |_| true;
        let ix = index(&[(20, 1), (u64::MAX as InstanceId, 0), (20, 0)]);
        let body = String::from_utf8(scores(&snap, &ix, &ov, None, &all)).unwrap();
        let max = "18446744073709551615";
        assert_eq!(
            body,
            format!(
                concat!(
                    r#"{{"scores":{{"20":{{"0":12,"1":8}},"{max}":{{"0":4}}}},"frequencies":[3,2],"#,
                    r#""tree_sizes":{{"20":{{"0":7,"1":5}},"{max}":{{"0":6}}}},"instances":{{"#,
                    r#""20":{{"longest_matched":12,"gpu":12,"dp":{{"0":12,"1":8}},"cpu":12,"disk":12,"#,
                    r#""effective":{{"0":8,"1":0}},"hit":{{"0":"partial","1":"miss"}}}},"#,
                    r#""{max}":{{"longest_matched":12,"gpu":4,"dp":{{"0":4}},"cpu":8,"disk":12,"#,
                    r#""effective":{{"0":4}},"hit":{{"0":"full"}}}}}}}}"#
                ),
                max = max
            )
        );
        let ix = index(&[(3, 0), (20, 1), (1, 2)]);
        let body = String::from_utf8(scores(&snap, &ix, &ov, None, &all)).unwrap();
        assert!(
            body.starts_with(r#"{"scores":{"1":{"2":12},"3":{"0":8},"20":{"1":4}}"#),
            "{body}"
        );
    }
}
