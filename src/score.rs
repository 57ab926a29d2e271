//! Gather: per-shard holder lists → per-worker prefix overlap.
//!
//! Owns the scoring rules, all walking the query's blocks in prefix order:
//! - Dynamo ([`gather`]): a worker scores block `i` only if it scored every
//!   block before it; kept for three cumulative tier sets (device; device+host;
//!   every tier);
//! - Mooncake conductor ([`conductor`]): per instance, the longest prefix held
//!   on any tier and dp rank, and within it the blocks found on each tier and
//!   on each dp rank's device;
//! - llm-d ([`weighted`]): per worker, the longest prefix held on a tier of
//!   positive weight, each block counting its best tier's weight;
//! - hybrid models ([`Hit`]): per worker with KV-cache groups besides full
//!   attention, the prefix its engine would reuse under their rules (the shards
//!   compute it, see [`crate::shard::hybrid`]); llm-d's run and the conductor's
//!   prefix end there too.
//!
//! Pure computation over the shards' answers ([`ShardReply`]): no I/O, no shard
//! access.

use crate::shard::holders::Holder;
use crate::shard::{HolderLists, ShardReply, union_holders};
use crate::types::{Tier, TierSet, WorkerSlot};

/// Gather: every shard's reply to one query as one, each block's holders the
/// union of the shards' (their slots are disjoint).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Merged {
    /// `[n, holder..]` per block in prefix order, ending at the first block nobody
    /// holds.
    pub holders: Vec<u32>,
    /// Blocks held per slot, summed over shards.
    pub per_slot: Vec<u32>,
    /// The shards' [`ShardReply::effective`] together (their slots are disjoint).
    pub effective: Vec<(WorkerSlot, u32)>,
}

/// Merge the shards' replies (one shard's is taken as it is).
pub fn merge(mut replies: Vec<ShardReply>) -> Merged {
    if replies.len() == 1 {
        let r = replies.pop().expect("one reply");
        return Merged {
            holders: r.holders,
            per_slot: r.per_slot,
            effective: r.effective,
        };
    }
    let mut per_slot = Vec::new();
    for r in &replies {
        if per_slot.len() < r.per_slot.len() {
            per_slot.resize(r.per_slot.len(), 0);
        }
        for (t, c) in per_slot.iter_mut().zip(&r.per_slot) {
            *t += c;
        }
    }
    let parts: Vec<&[u32]> = replies.iter().map(|r| &r.holders[..]).collect();
    let mut holders = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    union_holders(&parts, Some, &mut holders);
    let effective = replies
        .iter()
        .flat_map(|r| r.effective.iter().copied())
        .collect();
    Merged {
        holders,
        per_slot,
        effective,
    }
}

/// Cumulative tier sets scored per slot.
pub const TIER_SETS: [TierSet; 3] = [
    Tier::DEVICE.bit(),
    TierSet(Tier::DEVICE.bit().0 | Tier::HOST.bit().0),
    TierSet::ALL,
];

/// The overlap of one query with every slot of one index.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// Matched prefix blocks per slot for each of [`TIER_SETS`].
    pub matched: Vec<[u32; 3]>,
    /// Per matched depth, how many slots hold the device prefix up to it.
    pub frequencies: Vec<u32>,
    /// Blocks held per slot, summed over shards.
    pub tree_sizes: Vec<u32>,
    /// Per slot, the blocks its engine would reuse under its KV-cache groups'
    /// rules: the device match for a worker with full attention alone.
    pub effective: Vec<u32>,
}

/// How a slot's `effective` prefix compares with its full-attention match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    /// All of the full-attention match is reusable (and it is not empty).
    Full,
    /// Some of it.
    Partial,
    /// None.
    Miss,
}

impl Hit {
    pub fn of(effective: u32, full: u32) -> Hit {
        if effective == 0 {
            Hit::Miss
        } else if effective == full {
            Hit::Full
        } else {
            Hit::Partial
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Hit::Full => "full",
            Hit::Partial => "partial",
            Hit::Miss => "miss",
        }
    }
}

/// The merged replies' per-slot effective prefixes over the device matches:
/// a slot the shards said nothing of reuses its whole device match.
fn effective(m: &Merged, matched: &[[u32; 3]]) -> Vec<u32> {
    let mut out: Vec<u32> = matched.iter().map(|x| x[0]).collect();
    for &(slot, blocks) in &m.effective {
        if let Some(e) = out.get_mut(slot.0 as usize) {
            // Never past the device match (a clear under way answers as done).
            *e = blocks.min(*e);
        }
    }
    out
}

/// Walk the query's blocks in prefix order over the merged replies. `live`
/// filters out slots that were unregistered but not yet cleared.
///
/// Kept as one bit per slot and tier set: the slots still matching (`alive`) and
/// those holding the current block (`holds`). A block costs a bit set per holder
/// and a word operation per 64 slots; a slot's depth is written once, when it
/// stops matching, so a prefix many workers share costs little per worker.
pub fn gather(m: &Merged, slots: usize, live: impl Fn(WorkerSlot) -> bool) -> Overlap {
    let mut out = Overlap {
        matched: vec![[0; 3]; slots],
        frequencies: Vec::new(),
        tree_sizes: vec![0; slots],
        effective: Vec::new(),
    };
    for (t, c) in out.tree_sizes.iter_mut().zip(&m.per_slot) {
        *t += c;
    }
    let words = slots.div_ceil(64);
    let mut alive = vec![[0u64; 3]; words];
    for s in (0..slots).filter(|&s| live(WorkerSlot(s as u32))) {
        for w in &mut alive[s / 64] {
            *w |= 1 << (s % 64);
        }
    }
    let mut holds = vec![[0u64; 3]; words];
    let (mut depth, mut freq) = (0u32, 0);
    for (holders, repeated) in HolderLists::new(&m.holders) {
        if repeated {
            // The same holders again: every slot still matching matches this block too.
            depth += 1;
            if freq > 0 {
                out.frequencies.push(freq);
            }
            continue;
        }
        holds.fill([0; 3]);
        // Bits gather in registers while holders stay in one word (always, up to 64
        // slots): or-ing each into memory would chain every holder through a
        // store and a load of the same word.
        let (mut word, mut acc) = (usize::MAX, [0u64; 3]);
        for &h in holders {
            let h = Holder(h);
            let s = h.slot().0 as usize;
            if s >= slots {
                continue;
            }
            if s / 64 != word {
                if let Some(w) = holds.get_mut(word) {
                    *w = [w[0] | acc[0], w[1] | acc[1], w[2] | acc[2]];
                }
                (word, acc) = (s / 64, [0; 3]);
            }
            let (tiers, bit) = (h.tiers(), 1u64 << (s % 64));
            acc[0] |= bit * u64::from(!(tiers & TIER_SETS[0]).is_empty());
            acc[1] |= bit * u64::from(!(tiers & TIER_SETS[1]).is_empty());
            acc[2] |= bit * u64::from(!(tiers & TIER_SETS[2]).is_empty());
        }
        if let Some(w) = holds.get_mut(word) {
            *w = [w[0] | acc[0], w[1] | acc[1], w[2] | acc[2]];
        }
        let mut any = false;
        freq = 0;
        for (i, (a, h)) in alive.iter_mut().zip(&holds).enumerate() {
            for k in 0..TIER_SETS.len() {
                let after = a[k] & h[k];
                settle(&mut out.matched, i, k, a[k] & !after, depth);
                a[k] = after;
                any |= after != 0;
            }
            freq += a[0].count_ones();
        }
        if !any {
            break;
        }
        depth += 1;
        if freq > 0 {
            out.frequencies.push(freq);
        }
    }
    for (i, a) in alive.iter().enumerate() {
        for (k, &left) in a.iter().enumerate() {
            settle(&mut out.matched, i, k, left, depth);
        }
    }
    out.effective = effective(m, &out.matched);
    out
}

/// Record `depth` as tier set `k`'s match of every slot set in `bits`, the
/// `word`-th 64 slots: where those slots stopped matching.
fn settle(matched: &mut [[u32; 3]], word: usize, k: usize, mut bits: u64, depth: u32) {
    while bits != 0 {
        matched[word * 64 + bits.trailing_zeros() as usize][k] = depth;
        bits &= bits - 1;
    }
}

/// Dynamo's lower tiers in the order its router walks them: host (`host_pinned`),
/// disk, and `external` (every tier beyond the three well-known ones).
pub const LOWER_TIERS: [TierSet; 3] = [Tier::HOST.bit(), Tier::DISK.bit(), TierSet(0x78)];

/// One slot's tiered match, as Dynamo's router reads it: the device prefix, then per
/// lower tier the blocks that extend it there, each walk going on where the one
/// before stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TieredSlot {
    pub device: u32,
    /// Blocks each of [`LOWER_TIERS`] adds after the device and earlier tiers.
    pub hits: [u32; 3],
    /// Whether the slot is listed in each lower tier's hits (even with none): it
    /// holds the first block on the device or on that tier or one before it, as
    /// Dynamo's walk lists the workers it carries on from and the tier's roots.
    pub listed: [bool; 3],
}

/// Dynamo's tiered lookup over the merged replies: per slot, its device prefix and
/// the extension of it on each lower tier in turn.
pub fn tiered(m: &Merged, slots: usize, live: impl Fn(WorkerSlot) -> bool) -> Vec<TieredSlot> {
    let mut out = vec![TieredSlot::default(); slots];
    // Per slot: the tier walked now (0: device, 1..=3: lower tiers, 4: done).
    let mut phase = vec![0u8; slots];
    let mut tiers = vec![TierSet::NONE; slots];
    let sets = [TIER_SETS[0], LOWER_TIERS[0], LOWER_TIERS[1], LOWER_TIERS[2]];
    for (depth, (holders, _)) in HolderLists::new(&m.holders).enumerate() {
        tiers.fill(TierSet::NONE);
        for &h in holders {
            let h = Holder(h);
            if let Some(t) = tiers.get_mut(h.slot().0 as usize) {
                *t |= h.tiers();
            }
        }
        let mut advanced = false;
        for s in (0..slots).filter(|&s| live(WorkerSlot(s as u32))) {
            if depth == 0 {
                let t = tiers[s];
                let mut seen = !(t & sets[0]).is_empty();
                for (listed, set) in out[s].listed.iter_mut().zip(LOWER_TIERS) {
                    seen |= !(t & set).is_empty();
                    *listed = seen;
                }
            }
            while phase[s] < 4 && (tiers[s] & sets[phase[s] as usize]).is_empty() {
                phase[s] += 1;
            }
            match phase[s] {
                0 => out[s].device += 1,
                p @ 1..=3 => out[s].hits[p as usize - 1] += 1,
                _ => continue,
            }
            advanced = true;
        }
        if !advanced {
            break;
        }
    }
    out
}

/// One instance's overlap in Mooncake's conductor terms (counts are blocks).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InstanceOverlap {
    /// Longest prefix held on any tier by any of the instance's dp ranks.
    pub longest: u32,
    /// Within that prefix, blocks present on each tier.
    pub per_tier: [u32; Tier::COUNT],
    /// Within that prefix, blocks on the device of each of the instance's slots.
    pub per_slot_device: Vec<(WorkerSlot, u32)>,
}

/// Mooncake conductor scoring. `instance_of[slot]` is a dense instance number
/// (`None` for slots not to be scored); returns one entry per dense instance.
pub fn conductor(
    m: &Merged,
    instance_of: &[Option<usize>],
    instances: usize,
) -> Vec<InstanceOverlap> {
    let mut out = vec![InstanceOverlap::default(); instances];
    // A hybrid worker's instance reaches no further than its ranks' effective
    // prefixes (the longest of them).
    let mut cap = vec![None::<u32>; instances];
    for &(slot, e) in &m.effective {
        if let Some(Some(i)) = instance_of.get(slot.0 as usize) {
            cap[*i] = Some(cap[*i].map_or(e, |c| c.max(e)));
        }
    }
    let mut mask = vec![TierSet::NONE; instances];
    let mut device = vec![0u32; instance_of.len()];
    for (depth, (holders, _)) in HolderLists::new(&m.holders).enumerate() {
        let depth = depth as u32;
        for &h in holders {
            let h = Holder(h);
            let Some(Some(i)) = instance_of.get(h.slot().0 as usize) else {
                continue;
            };
            if out[*i].longest == depth && cap[*i].is_none_or(|c| depth < c) {
                mask[*i] |= h.tiers();
            }
        }
        let mut advanced = false;
        for (i, m) in mask.iter_mut().enumerate() {
            if m.is_empty() {
                continue;
            }
            advanced = true;
            out[i].longest += 1;
            for t in m.iter() {
                out[i].per_tier[t.0 as usize] += 1;
            }
            *m = TierSet::NONE;
        }
        for &h in holders {
            let h = Holder(h);
            let slot = h.slot().0 as usize;
            if let Some(Some(i)) = instance_of.get(slot)
                && h.has(Tier::DEVICE)
                && out[*i].longest == depth + 1
            {
                device[slot] += 1;
            }
        }
        if !advanced {
            break;
        }
    }
    for (slot, inst) in instance_of.iter().enumerate() {
        if let Some(i) = inst {
            out[*i]
                .per_slot_device
                .push((WorkerSlot(slot as u32), device[slot]));
        }
    }
    out
}

/// llm-d's weight of a medium its configuration does not list
/// (`pkg/kvcache/kvblock_scorer.go`, `fillMaxWeights`: `weight := 1.0` unless the
/// medium is in the map).
pub const LLMD_UNLISTED: f32 = 1.0;

/// Default llm-d tier weights: llm-d's default backends (gpu 1.0, cpu 0.8), every
/// other medium [`LLMD_UNLISTED`].
pub const LLMD_WEIGHTS: [f32; Tier::COUNT] = [1.0, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];

/// llm-d scoring, as its longest-prefix scorer: per slot, the sum over its longest
/// run of blocks from the first (held on any tier) of each block's best tier weight.
/// A block whose tiers all weigh 0 adds 0 and does not end the run; only a block the
/// slot does not hold ends it.
pub fn weighted(
    m: &Merged,
    slots: usize,
    live: impl Fn(WorkerSlot) -> bool,
    weights: &[f32; Tier::COUNT],
) -> Vec<f32> {
    let mut score = vec![0f32; slots];
    let mut len = vec![0u32; slots];
    // A hybrid worker's run ends with its effective prefix.
    let mut cap = vec![u32::MAX; slots];
    for &(slot, e) in &m.effective {
        if let Some(c) = cap.get_mut(slot.0 as usize) {
            *c = e;
        }
    }
    for (depth, (holders, _)) in HolderLists::new(&m.holders).enumerate() {
        let mut advanced = false;
        for &h in holders {
            let h = Holder(h);
            let slot = h.slot();
            let s = slot.0 as usize;
            if s >= slots || len[s] != depth as u32 || len[s] >= cap[s] || !live(slot) {
                continue;
            }
            let best = h
                .tiers()
                .iter()
                .map(|t| weights[t.0 as usize])
                .fold(0f32, f32::max);
            len[s] += 1;
            score[s] += best;
            advanced = true;
        }
        if !advanced {
            break;
        }
    }
    score
}

/// llm-d normalization to [0, 1] across the candidates: (s - min) / (max - min);
/// when every candidate scores the same, all get 1 if they hold anything, else 0.
pub fn normalize(scores: &[f32]) -> Vec<f32> {
    let max = scores.iter().copied().fold(f32::MIN, f32::max);
    let min = scores.iter().copied().fold(f32::MAX, f32::min);
    scores
        .iter()
        .map(|&s| {
            if max > min {
                (s - min) / (max - min)
            } else if max > 0.0 {
                1.0
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::SAME_HOLDERS;

    fn h(slot: u32, tiers: TierSet) -> u32 {
        Holder::new(WorkerSlot(slot), tiers).0
    }

    #[test]
    fn stops_each_worker_at_its_first_miss() {
        // One shard; blocks 0..3. Slot 0 holds 0,1,2; slot 1 holds 0,2 (gap at 1).
        let d = Tier::DEVICE.bit();
        let reply = ShardReply {
            holders: vec![2, h(0, d), h(1, d), 1, h(0, d), 2, h(0, d), h(1, d)],
            per_slot: vec![3, 2],
            effective: Vec::new(),
        };
        let o = gather(&merge(vec![reply]), 2, |_| true);
        assert_eq!(o.matched[0], [3, 3, 3]);
        assert_eq!(o.matched[1], [1, 1, 1]);
        assert_eq!(o.frequencies, vec![2, 1, 1]);
        assert_eq!(o.tree_sizes, vec![3, 2]);
    }

    #[test]
    fn tiered_walks_each_lower_tier_after_the_one_before() {
        let (d, c, k) = (Tier::DEVICE.bit(), Tier::HOST.bit(), Tier::DISK.bit());
        let x = Tier(3).bit();
        // Slot 0: device 0-1, host 2, disk 3, external 4. Slot 1: host 0-1, then
        // device 2 (not counted: the device walk ended at block 0). Slot 2: disk 0.
        // Slot 3: device 0 and host 0-1: host extends from block 1.
        let reply = ShardReply {
            holders: vec![
                4,
                h(0, d),
                h(1, c),
                h(2, k),
                h(3, TierSet(d.0 | c.0)),
                3,
                h(0, d),
                h(1, c),
                h(3, c),
                2,
                h(0, c),
                h(1, d),
                1,
                h(0, k),
                1,
                h(0, x),
            ],
            per_slot: vec![5, 3, 1, 2],
            effective: Vec::new(),
        };
        let t = tiered(&merge(vec![reply]), 5, |s| s.0 != 4);
        let slot = |device, hits, listed| TieredSlot {
            device,
            hits,
            listed,
        };
        assert_eq!(t[0], slot(2, [1, 1, 1], [true; 3]));
        assert_eq!(t[1], slot(0, [2, 0, 0], [true; 3]));
        assert_eq!(t[2], slot(0, [0, 1, 0], [false, true, true]));
        assert_eq!(t[3], slot(1, [1, 0, 0], [true; 3]));
        assert_eq!(t[4], TieredSlot::default());
    }

    /// The rule stated plainly, holder by holder: what [`gather`] must equal.
    fn gather_by_holder(
        per_block: &[Vec<u32>],
        slots: usize,
        live: impl Fn(WorkerSlot) -> bool,
    ) -> (Vec<[u32; 3]>, Vec<u32>) {
        let (mut matched, mut frequencies) = (vec![[0u32; 3]; slots], Vec::new());
        for (depth, holders) in per_block.iter().enumerate() {
            let depth = depth as u32;
            let (mut advanced, mut freq) = (false, 0);
            for &h in holders {
                let h = Holder(h);
                let slot = h.slot();
                if slot.0 as usize >= slots || !live(slot) {
                    continue;
                }
                let m = &mut matched[slot.0 as usize];
                for (k, set) in TIER_SETS.iter().enumerate() {
                    if !(h.tiers() & *set).is_empty() && m[k] == depth {
                        m[k] = depth + 1;
                        advanced = true;
                        freq += u32::from(k == 0);
                    }
                }
            }
            if !advanced {
                break;
            }
            if freq > 0 {
                frequencies.push(freq);
            }
        }
        (matched, frequencies)
    }

    #[test]
    fn equals_the_holder_by_holder_rule_over_many_slots() {
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15u64);
        let mut next = |n: u64| rng.below(n);
        let tiers = [
            Tier::DEVICE.bit(),
            Tier::HOST.bit(),
            Tier::DISK.bit(),
            TierSet(Tier::DEVICE.bit().0 | Tier::HOST.bit().0),
        ];
        for case in 0..300 {
            let slots = 1 + next(200) as usize;
            let blocks = 1 + next(40) as usize;
            let shards = 1 + next(3) as usize;
            // Each shard answers for its slots (every `shards`-th), up to its first
            // block none of them holds; the union per block is what scores.
            let mut replies = vec![ShardReply::default(); shards];
            let mut ended = vec![false; shards];
            let mut last: Vec<Vec<u32>> = vec![Vec::new(); shards];
            let mut per_block: Vec<Vec<u32>> = Vec::new();
            // Holders thin out with depth, so prefixes end at different blocks.
            for d in 0..blocks {
                let mut held = Vec::new();
                for s in 0..slots as u32 + 5 {
                    if next(100) as usize >= d.min(60) {
                        held.push(h(s, tiers[next(4) as usize]));
                    }
                }
                held.truncate(next(1 + slots as u64) as usize);
                let mut union = Vec::new();
                for (part, r) in replies.iter_mut().enumerate() {
                    if ended[part] {
                        continue;
                    }
                    let mine: Vec<u32> = held
                        .iter()
                        .copied()
                        .filter(|&x| Holder(x).slot().0 as usize % shards == part)
                        .collect();
                    if mine.len() > 1 && mine == last[part] && next(2) == 0 {
                        // Held as the part's block before it.
                        r.holders.push(SAME_HOLDERS);
                    } else {
                        r.holders.push(mine.len() as u32);
                        r.holders.extend(&mine);
                    }
                    ended[part] = mine.is_empty();
                    union.extend(&mine);
                    last[part] = mine;
                }
                if union.is_empty() {
                    break;
                }
                per_block.push(union);
            }
            let live = |s: WorkerSlot| s.0 % 11 != 3;
            let o = gather(&merge(replies), slots, live);
            let (matched, frequencies) = gather_by_holder(&per_block, slots, live);
            assert_eq!(o.matched, matched, "case {case}");
            assert_eq!(o.frequencies, frequencies, "case {case}");
        }
    }

    #[test]
    fn lower_tiers_extend_cumulatively() {
        let (d, c, k) = (Tier::DEVICE.bit(), Tier::HOST.bit(), Tier::DISK.bit());
        let reply = ShardReply {
            holders: vec![1, h(0, d | c), 1, h(0, c), 1, h(0, k)],
            per_slot: vec![3],
            effective: Vec::new(),
        };
        let o = gather(&merge(vec![reply]), 1, |_| true);
        assert_eq!(o.matched[0], [1, 2, 3]);
    }

    #[test]
    fn dead_slots_are_ignored() {
        let reply = ShardReply {
            holders: vec![1, h(0, Tier::DEVICE.bit())],
            per_slot: vec![1],
            effective: Vec::new(),
        };
        let o = gather(&merge(vec![reply]), 1, |_| false);
        assert_eq!(o.matched[0], [0, 0, 0]);
        assert!(o.frequencies.is_empty());
    }

    /// The conductor spec's worked example: block size 2, dp2; H1 on GPU (dp0, dp1), CPU
    /// and DISK; H2 on GPU (dp0) and CPU; H3 on DISK.
    #[test]
    fn conductor_seed_001() {
        let (g, c, d) = (Tier::DEVICE.bit(), Tier::HOST.bit(), Tier::DISK.bit());
        // Slots 0 and 1 are dp0 and dp1 of instance 0; host and disk copies are dp0's.
        let reply = ShardReply {
            holders: vec![2, h(0, g | c | d), h(1, g), 1, h(0, g | c), 1, h(0, d)],
            per_slot: vec![],
            effective: Vec::new(),
        };
        let o = conductor(&merge(vec![reply]), &[Some(0), Some(0)], 1);
        assert_eq!(o[0].longest, 3);
        assert_eq!(o[0].per_tier[..3], [2, 2, 2]);
        assert_eq!(
            o[0].per_slot_device,
            vec![(WorkerSlot(0), 2), (WorkerSlot(1), 1)]
        );
    }

    /// llm-d's indexer docs' three pods over blocks B0..B4: A holds B0..B3, B holds B0, B1
    /// (and B3), C holds B3 and B4 only: scores 4, 2, 0.
    #[test]
    fn llmd_three_pods() {
        let g = Tier::DEVICE.bit();
        let reply = ShardReply {
            holders: vec![
                2,
                h(0, g),
                h(1, g),
                2,
                h(0, g),
                h(1, g),
                1,
                h(0, g),
                3,
                h(0, g),
                h(1, g),
                h(2, g),
                1,
                h(2, g),
            ],
            per_slot: vec![],
            effective: Vec::new(),
        };
        let s = weighted(&merge(vec![reply]), 3, |_| true, &LLMD_WEIGHTS);
        assert_eq!(s, vec![4.0, 2.0, 0.0]);
        assert_eq!(normalize(&s), vec![1.0, 0.5, 0.0]);
    }

    /// llm-d (`LongestPrefixScorer.Score` with `fillMaxWeights`), weights
    /// {gpu: 1.0, cpu: 0.8}: a pod holding block 0 on gpu and cpu, block 1 on cpu,
    /// block 2 on disk (unlisted: 1.0) scores 1.0 + 0.8 + 1.0 = 2.8. With disk
    /// weighed 0 the block adds 0 and the run goes on to block 3 (cpu): 1.0 + 0.8 +
    /// 0 + 0.8 = 2.6.
    #[test]
    fn llmd_takes_the_best_tier_and_unlisted_media_weigh_one() {
        let (g, c, d) = (Tier::DEVICE.bit(), Tier::HOST.bit(), Tier::DISK.bit());
        let reply = ShardReply {
            holders: vec![1, h(0, g | c), 1, h(0, c), 1, h(0, d)],
            per_slot: vec![],
            effective: Vec::new(),
        };
        let s = weighted(&merge(vec![reply]), 1, |_| true, &LLMD_WEIGHTS);
        assert!((s[0] - 2.8).abs() < 1e-6, "{s:?}");

        let reply = ShardReply {
            holders: vec![1, h(0, g | c), 1, h(0, c), 1, h(0, d), 1, h(0, c)],
            per_slot: vec![],
            effective: Vec::new(),
        };
        let mut zero_disk = LLMD_WEIGHTS;
        zero_disk[Tier::DISK.0 as usize] = 0.0;
        let s = weighted(&merge(vec![reply]), 1, |_| true, &zero_disk);
        assert!((s[0] - 2.6).abs() < 1e-6, "{s:?}");
    }
}
