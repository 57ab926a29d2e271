//! The score replies: Dynamo's `/query` scores, Mooncake's conductor objects
//! and the tiered answer, laid out once per index and reused per query.
//!
//! Owns their exact wire shape; this is the hot path, written straight into a
//! byte buffer. Must never look a worker up per block: the layout maps slots
//! to their rendered keys.

use super::write::{Digits, Key, float, key, num};
use crate::registry::{IndexInfo, Snapshot};
use crate::score::{Hit, InstanceOverlap, Overlap, TieredSlot};
use crate::types::{DpRank, InstanceId, Tier, WorkerSlot};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

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
