//! The shard's examples: runs, clears in steps, budgets, exports and lookups.

use super::holders::Holder;
use super::*;
use crate::hash;
use crate::testing::Xorshift;

const IX: IndexId = IndexId(0);
const DEV: Tier = Tier::DEVICE;
const HOST: Tier = Tier::HOST;

/// The engine hash slot `slot` names block `local` by (engines name blocks
/// their own way).
fn eh(slot: u32, local: u64) -> EngineHash {
    EngineHash(local ^ (u64::from(slot) + 1) << 40)
}

/// Slot `slot` stores the chain `locals` on `tier` below its block `parent`.
fn run(slot: u32, tier: Tier, parent: Option<u64>, locals: &[u64]) -> Vec<ShardOp> {
    let mut p = parent.map(|l| eh(slot, l));
    locals
        .iter()
        .map(|&l| {
            let op = ShardOp::Store {
                index: IX,
                slot: WorkerSlot(slot),
                tier,
                parent: p,
                block: eh(slot, l),
                local: BlockHash(l),
                by_seq: false,
                event_start: p == parent.map(|l| eh(slot, l)),
            };
            p = Some(eh(slot, l));
            op
        })
        .collect()
}

fn remove(slot: u32, local: u64, tiers: TierSet) -> ShardOp {
    ShardOp::Remove {
        index: IX,
        slot: WorkerSlot(slot),
        block: eh(slot, local),
        tiers,
    }
}

fn clear(slot: u32, tiers: TierSet) -> ShardOp {
    ShardOp::ClearSlot {
        index: IX,
        slot: WorkerSlot(slot),
        tiers,
    }
}

fn held(slot: u32, tiers: TierSet) -> u32 {
    Holder::new(WorkerSlot(slot), tiers).0
}

fn lookup(s: &mut Shard, locals: &[u64]) -> Vec<u32> {
    let locals: Vec<BlockHash> = locals.iter().map(|&l| BlockHash(l)).collect();
    let mut out = Vec::new();
    s.lookup(IX, Prompt::Locals(&locals), &mut out);
    out
}

/// Every exported (sequence hash, holder), sorted, and the export's names.
fn export(s: &Shard) -> (Vec<(u64, u32)>, usize) {
    let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
    while !s.export_step(IX, &mut at, &mut out, &mut names) {}
    let mut v: Vec<(u64, u32)> = out.iter().map(|b| (b.seq.0, b.holder.0)).collect();
    v.sort();
    (v, names.len())
}

#[test]
fn a_lookup_stops_after_the_first_block_nobody_holds() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
    s.apply_all(&run(2, HOST, None, &[10]));
    let d = DEV.bit();
    assert_eq!(
        lookup(&mut s, &[10, 11, 99, 12]),
        [2, held(1, d), held(2, HOST.bit()), 1, held(1, d), 0]
    );
    assert_eq!(lookup(&mut s, &[]), Vec::<u32>::new());
    let mut out = Vec::new();
    s.lookup(IndexId(5), Prompt::Locals(&[BlockHash(10)]), &mut out);
    assert_eq!(out, [0]);
}

#[test]
fn a_block_held_as_the_one_before_is_written_once_and_merges_keep_it() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
    s.apply_all(&run(2, DEV, None, &[10, 11]));
    let (a, b) = (held(1, DEV.bit()), held(2, DEV.bit()));
    let out = lookup(&mut s, &[10, 11, 12]);
    assert_eq!(out, [2, a, b, SAME_HOLDERS, 1, a]);
    // Two shards' answers: a block both repeat is repeated in the union; one
    // that only one repeats is spelled out.
    let other = [1, held(3, HOST.bit()), SAME_HOLDERS, 0];
    let mut merged = Vec::new();
    union_holders(&[&out, &other], Some, &mut merged);
    let c = held(3, HOST.bit());
    assert_eq!(merged, [3, a, b, c, SAME_HOLDERS, 1, a]);
    let mut merged = Vec::new();
    union_holders(&[&out, &[1, c, 1, c, 0]], Some, &mut merged);
    assert_eq!(merged, [3, a, b, c, 3, a, b, c, 1, a]);
}

#[test]
fn tiers_go_independently_and_unknown_names_are_counted() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11]));
    s.apply_all(&run(1, HOST, None, &[10, 11]));
    s.apply(remove(1, 11, DEV.bit()));
    assert_eq!(
        lookup(&mut s, &[10, 11]),
        [1, held(1, DEV.bit() | HOST.bit()), 1, held(1, HOST.bit())]
    );
    assert_eq!(s.tier_counts(), (2, [1, 2, 0, 0, 0, 0, 0, 0]));
    s.apply(remove(1, 77, TierSet::ALL));
    s.apply_all(&run(1, DEV, Some(78), &[12, 13]));
    assert_eq!((s.unknown_removed, s.unknown_parent), (1, 1));
    // The whole run was skipped.
    assert_eq!(s.tier_counts().0, 2);
}

#[test]
fn a_clear_is_walked_in_steps_answering_as_if_done_and_a_store_to_its_tier_waits() {
    let mut s = Shard::default();
    s.set_clear_step_buckets(1);
    let chain: Vec<u64> = (10..40).collect();
    s.apply_all(&run(1, DEV, None, &chain));
    s.apply_all(&run(1, HOST, None, &chain));
    s.apply_all(&run(2, DEV, None, &chain[..5]));
    s.apply_staged(&[clear(1, DEV.bit())]);
    // Answered as if done, before any step.
    let got = lookup(&mut s, &chain[..2]);
    assert_eq!(
        got,
        [
            2,
            held(1, HOST.bit()),
            held(2, DEV.bit()),
            2,
            held(1, HOST.bit()),
            held(2, DEV.bit())
        ]
    );
    assert!(s.step_clears());
    // A store to the tier being cleared waits, and every later op of its slot;
    // other slots' ops apply.
    s.apply_staged(&run(1, DEV, None, &[90]));
    s.apply_staged(&[remove(1, 10, HOST.bit())]);
    s.apply_staged(&run(2, DEV, None, &[91]));
    assert_eq!(s.waiting_ops(), 2);
    assert_eq!(lookup(&mut s, &[91]), [1, held(2, DEV.bit())]);
    assert_eq!(lookup(&mut s, &[90]), [0]);
    assert_eq!(s.index(IX).unwrap().tree_sizes(), [0, 30, 6]);
    while s.step_clears() {}
    assert_eq!(s.waiting_ops(), 0);
    assert_eq!(lookup(&mut s, &[90]), [1, held(1, DEV.bit())]);
    assert_eq!(lookup(&mut s, &[10]), [1, held(2, DEV.bit())]);
    assert_eq!(s.index(IX).unwrap().tree_sizes(), [0, 30, 6]);
    let (pairs, _) = export(&s);
    assert_eq!(pairs.len(), 29 + 1 + 6);
}

/// Random ops, applied with clears walked in tiny steps between them (and
/// lookups meeting them partway), answer and leave the shard as applying each
/// at once does.
#[test]
fn staged_clears_equal_clears_at_once() {
    let mut rng = Xorshift::new(7);
    for case in 0..50 {
        let (mut stepped, mut direct) = (Shard::default(), Shard::default());
        stepped.set_clear_step_buckets(1 + case % 3);
        for _ in 0..60 {
            let slot = rng.below(3) as u32;
            let tier = Tier(rng.below(2) as u8);
            let ops = match rng.below(8) {
                0 => vec![clear(slot, tier.bit())],
                1 => vec![clear(slot, TierSet::ALL)],
                2 | 3 => vec![remove(slot, 10 + rng.below(12), tier.bit())],
                _ => {
                    let from = 10 + rng.below(10);
                    let locals: Vec<u64> = (from..from + 1 + rng.below(4)).collect();
                    let parent = (from > 10).then_some(from - 1);
                    run(slot, tier, parent, &locals)
                }
            };
            stepped.apply_staged(&ops);
            stepped.step_clears();
            // Ops waiting for a clear show once it is done (as a query's answer
            // waits for them in service); a clear nothing waits for stays
            // partway, answered as if done.
            stepped.finish_deferred();
            let probe: Vec<u64> = (10..22).collect();
            let (mut a, mut b) = (stepped.clone_answers(&probe), Vec::new());
            direct.apply_all(&ops);
            b.extend(direct.clone_answers(&probe));
            a.sort();
            b.sort();
            assert_eq!(a, b, "case {case}");
        }
        stepped.finish();
        assert_eq!(export(&stepped).0, export(&direct).0, "case {case}");
        assert_eq!(stepped.tier_counts(), direct.tier_counts(), "case {case}");
    }
}

impl Shard {
    /// The holders of every prefix of `locals`, each sorted (a clear under way
    /// and a clear done may list holders in another order).
    fn clone_answers(&mut self, locals: &[u64]) -> Vec<Vec<u32>> {
        (1..=locals.len())
            .map(|n| {
                let mut v: Vec<u32> = expanded(&lookup(self, &locals[..n]))
                    .into_iter()
                    .flatten()
                    .collect();
                v.sort();
                v
            })
            .collect()
    }
}

/// A lookup's output as one holder list per block, [`SAME_HOLDERS`] spelled out.
fn expanded(out: &[u32]) -> Vec<Vec<u32>> {
    HolderLists::new(out).map(|(hs, _)| hs.to_vec()).collect()
}

#[test]
fn a_prediction_scores_as_device_until_confirmed_or_expired_and_is_never_exported() {
    let mut s = Shard::default();
    let locals = [BlockHash(10), BlockHash(11)];
    s.predict(IX, WorkerSlot(1), &locals, 100);
    assert_eq!(
        lookup(&mut s, &[10, 11]),
        [1, held(1, DEV.bit()), 1, held(1, DEV.bit())]
    );
    assert_eq!(export(&s).0, []);
    assert_eq!(s.tier_counts().1[Tier::PREDICTED.0 as usize], 2);
    // The worker stores the first block on the host: that is what it holds now.
    s.apply_all(&run(1, HOST, None, &[10]));
    assert_eq!(s.predictions.confirmed, 1);
    assert_eq!(
        lookup(&mut s, &[10, 11]),
        [1, held(1, HOST.bit()), 1, held(1, DEV.bit())]
    );
    s.expire(99);
    assert_eq!(lookup(&mut s, &[10, 11]).len(), 4);
    s.expire(100);
    assert_eq!(lookup(&mut s, &[10, 11]), [1, held(1, HOST.bit()), 0]);
    assert_eq!(s.predictions.expired, 1);
    assert!(!s.has_predictions());
    // A prediction due before the latest expiry is ended already.
    s.predict(IX, WorkerSlot(2), &locals, 50);
    assert_eq!(s.predictions.created, 2);
}

#[test]
fn an_approximate_index_is_pruned_soonest_due_first() {
    let mut s = Shard::default();
    s.set_prune_bound(IX, Some(PruneBound { max: 8, target: 4 }));
    for p in 0..4u64 {
        let locals: Vec<BlockHash> = (0..3).map(|b| BlockHash(100 * (p + 1) + b)).collect();
        s.predict(IX, WorkerSlot(1), &locals, 10 + p as Tick);
    }
    let (blocks, _) = s.tier_counts();
    assert!(blocks <= 8, "{blocks}");
    assert!(s.predictions.pruned > 0);
    // The newest prediction stays.
    assert_eq!(lookup(&mut s, &[400, 401, 402]).len(), 6);
    assert_eq!(lookup(&mut s, &[100]), [0]);
}

/// One prediction far past an approximate index's bound is pruned from its end
/// down to the target, not to nothing: the older predictions go first, then
/// the chain's last blocks, each ending a block.
#[test]
fn a_prediction_past_the_bound_is_pruned_to_the_target() {
    let mut s = Shard::default();
    s.set_prune_bound(
        IX,
        Some(PruneBound {
            max: 100,
            target: 80,
        }),
    );
    s.predict(IX, WorkerSlot(2), &[BlockHash(7), BlockHash(8)], 50);
    let chain: Vec<BlockHash> = (1000..3000).map(BlockHash).collect();
    s.predict(IX, WorkerSlot(1), &chain, 60);
    assert_eq!(s.tier_counts().0, 80);
    let out = lookup(&mut s, &(1000..1081).collect::<Vec<_>>());
    assert_eq!(
        expanded(&out),
        [vec![vec![held(1, DEV.bit())]; 80], vec![vec![]]].concat()
    );
    assert_eq!(lookup(&mut s, &[7]), [0]);
}

#[test]
fn shards_sharing_a_budget_stay_within_it_and_keep_their_counters() {
    let budget = BlockBudget::new(40);
    let mut shards = [Shard::default(), Shard::default()];
    for s in &mut shards {
        s.set_block_budget(Some(budget.clone()));
    }
    for p in 0..20u64 {
        let locals: Vec<u64> = (0..4).map(|b| 100 * (p + 1) + b).collect();
        let slot = (p % 3) as u32;
        shards[(slot % 2) as usize].apply_all(&run(slot, DEV, None, &locals));
        let held: u64 = shards.iter().map(|s| s.tier_counts().0).sum();
        assert!(held <= 40, "{held} after prompt {p}");
    }
    let evicted: u64 = shards.iter().map(|s| s.evicted).sum();
    let held: u64 = shards.iter().map(|s| s.tier_counts().0).sum();
    assert_eq!(evicted + held, 80);
    for s in &shards {
        let (pairs, _) = export(s);
        assert_eq!(pairs.len() as u64, s.tier_counts().1[0]);
    }
    // Removals free room for the next stores without eviction.
    let before = evicted;
    for p in 0..20u64 {
        let slot = (p % 3) as u32;
        for b in 0..4 {
            shards[(slot % 2) as usize].apply(remove(slot, 100 * (p + 1) + b, TierSet::ALL));
        }
    }
    for s in &mut shards {
        s.sync_budget();
    }
    shards[0].apply_all(&run(0, DEV, None, &[1, 2, 3]));
    assert_eq!(shards.iter().map(|s| s.evicted).sum::<u64>(), before);
}

/// A chain stored far past the budget is evicted from its end in steps, the
/// shard answering between them; what stays is the chain's head.
#[test]
fn a_chain_far_past_the_budget_is_evicted_from_its_end_in_steps() {
    let mut s = Shard::default();
    s.set_block_budget(Some(BlockBudget::new(1000)));
    let locals: Vec<u64> = (1..=20_000).collect();
    s.apply_staged(&run(1, DEV, None, &locals));
    let mut held = s.tier_counts().0;
    assert_eq!(held, 20_000, "a store evicts nothing itself");
    let mut steps = 0;
    while s.step_budget() {
        steps += 1;
        let now = s.tier_counts().0;
        assert!(now < held && now >= 1000, "{now} after {held}");
        held = now;
        // Between steps the shard answers: the head is held.
        assert!(HolderLists::new(&lookup(&mut s, &locals[..3])).all(|(hs, _)| hs.len() == 1));
    }
    assert!(steps >= 4, "{steps} steps");
    assert_eq!(s.tier_counts().0, 1000);
    assert_eq!(s.evicted, 19_000);
    let out = lookup(&mut s, &locals[..1001]);
    let held: Vec<usize> = HolderLists::new(&out).map(|(hs, _)| hs.len()).collect();
    assert_eq!(held, [vec![1; 1000], vec![0]].concat());
}

/// A standardized publisher's block under a parent its slot named by another
/// hash is filed by sequence hash, and a lookup finds it after the tree's.
#[test]
fn a_keyed_block_follows_a_tree_block_in_a_lookup_and_goes_by_its_removal() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11]));
    let seq11 = hash::chain(Some(hash::chain(None, BlockHash(10))), BlockHash(11));
    let seq12 = hash::chain(Some(seq11), BlockHash(12));
    s.apply_all(&[ShardOp::Store {
        index: IX,
        slot: WorkerSlot(1),
        tier: Tier::DISK,
        parent: Some(EngineHash(seq11.0)),
        block: EngineHash(seq12.0),
        local: BlockHash(12),
        by_seq: true,
        event_start: true,
    }]);
    assert_eq!(s.unknown_parent, 0);
    assert_eq!(
        lookup(&mut s, &[10, 11, 12]),
        [
            1,
            held(1, DEV.bit()),
            1,
            held(1, DEV.bit()),
            1,
            held(1, Tier::DISK.bit())
        ]
    );
    let mut out = Vec::new();
    s.lookup(
        IX,
        Prompt::Seqs(&[hash::chain(None, BlockHash(10)), seq11, seq12]),
        &mut out,
    );
    assert_eq!(out.len(), 6);
    assert_eq!(export(&s).0.len(), 3);
    s.apply(ShardOp::Remove {
        index: IX,
        slot: WorkerSlot(1),
        block: EngineHash(seq12.0),
        tiers: TierSet::ALL,
    });
    assert_eq!(lookup(&mut s, &[10, 11, 12]).len(), 5);
    assert_eq!(s.unknown_removed, 0);
}

#[test]
fn an_export_names_every_block_its_slots_hold() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
    s.apply_all(&run(2, DEV, None, &[10]));
    s.apply_all(&run(2, DEV, Some(10), &[20]));
    let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
    while !s.export_step(IX, &mut at, &mut out, &mut names) {}
    let mut all = Vec::new();
    s.engine_names(IX, &mut all);
    names.sort_unstable_by_key(|n| (n.0, n.1, n.2.0));
    all.sort_unstable_by_key(|n| (n.0, n.1, n.2.0));
    assert_eq!(names, all);
    for b in &out {
        let slot = b.holder.slot();
        let name = names.iter().find(|n| n.0 == slot && n.1 == b.node).unwrap();
        assert_eq!(name.2, eh(slot.0, b.local.0));
    }
    assert_eq!(out.len(), 5);
}

/// A shard holding `KVIX_STALL_ENTRIES` (default 4M) blocks, chains of 64 over 16
/// slots, for the stall figures; and that count.
fn filled_for_stall() -> (Shard, u64) {
    let n = crate::testing::env_u64("KVIX_STALL_ENTRIES", 4 << 20);
    let mut s = Shard::default();
    for c in 0..n / 64 {
        let locals: Vec<u64> = (0..64).map(|b| c << 8 | b).collect();
        s.apply_all(&run((c % 16) as u32, DEV, None, &locals));
    }
    (s, n)
}

/// What a query waits behind while one worker is cleared from a large index
/// (`KVIX_STALL_ENTRIES` blocks, default 4M, in chains of 64 held by 16 workers):
/// the longest clear step. A figure, not a check:
/// `cargo test --release --lib clear_stall -- --ignored --nocapture`.
#[test]
#[ignore]
fn clear_stall() {
    use std::time::{Duration, Instant};
    let (mut s, n) = filled_for_stall();
    s.apply_staged(&[clear(3, TierSet::ALL)]);
    let (mut worst, mut steps) = (Duration::ZERO, 0);
    loop {
        let t = Instant::now();
        let more = s.step_clears();
        worst = worst.max(t.elapsed());
        steps += 1;
        if !more {
            break;
        }
    }
    println!("{n} blocks: clear of one worker in {steps} steps, worst {worst:?}");
}

/// The longest step of an export of a large index (`KVIX_STALL_ENTRIES` blocks,
/// default 4M): what a query waits behind. A figure, not a check:
/// `cargo test --release --lib export_stall -- --ignored --nocapture`.
#[test]
#[ignore]
fn export_stall() {
    use std::time::{Duration, Instant};
    let (s, n) = filled_for_stall();
    let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
    let (mut worst, mut steps) = (Duration::ZERO, 0);
    loop {
        let t = Instant::now();
        let done = s.export_step(IX, &mut at, &mut out, &mut names);
        worst = worst.max(t.elapsed());
        steps += 1;
        if done {
            break;
        }
    }
    println!("{n} blocks: export with engine names in {steps} steps, worst {worst:?}");
}

/// Slot 1's group `group` is a 9-token sliding window of 4-token blocks (`align`
/// tokens, 0: unset): the spec and the op that describes it.
fn window_group(group: u8, align: u32) -> (crate::shard::hybrid::GroupSpec, ShardOp) {
    use crate::shard::hybrid::{GroupRule, GroupSpec};
    let spec = GroupSpec {
        rule: GroupRule::SlidingWindow(9),
        block_size: 4,
    };
    let op = ShardOp::GroupSpec {
        index: IX,
        slot: WorkerSlot(1),
        group,
        spec,
        align,
        base: 4,
    };
    (spec, op)
}

/// (slot, block, groups) of every (block, holder) an export of `s` reads, sorted.
fn exported_groups(s: &Shard) -> Vec<(u32, u64, u32)> {
    let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
    while !s.export_step(IX, &mut at, &mut out, &mut names) {}
    let mut got: Vec<_> = out
        .iter()
        .map(|b| (b.holder.slot().0, b.local.0, b.groups))
        .collect();
    got.sort();
    got
}

#[test]
fn an_export_reads_each_blocks_groups_and_each_slots_specs() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11, 12]));
    s.apply_all(&run(2, DEV, None, &[10]));
    let (spec, op) = window_group(3, 8);
    let mut ops = vec![op];
    // Slot 1's group 3 holds blocks 11 and 12, then loses 12.
    for (local, held) in [(11, true), (12, true), (12, false)] {
        ops.push(ShardOp::GroupHold {
            index: IX,
            slot: WorkerSlot(1),
            group: 3,
            block: eh(1, local),
            held,
        });
    }
    s.apply_all(&ops);
    assert_eq!(
        exported_groups(&s),
        [(1, 10, 0), (1, 11, 1 << 3), (1, 12, 0), (2, 10, 0)]
    );
    let mut specs = Vec::new();
    s.group_specs(IX, &mut specs);
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].0, WorkerSlot(1));
    assert_eq!(specs[0].1.groups, [(3, spec)]);
    assert_eq!(specs[0].1.align, Some(8));
}

#[test]
fn a_group_events_blocks_apply_as_one_run_and_count_what_full_attention_lacks() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11, 12, 13, 14, 15]));
    let mut ops = vec![window_group(2, 0).1];
    let hold = |slot: u32, local: u64, held: bool| ShardOp::GroupHold {
        index: IX,
        slot: WorkerSlot(slot),
        group: 2,
        block: eh(slot, local),
        held,
    };
    // One run longer than the prefetch distance, with a block full attention lacks
    // (99) inside it; then a slot with no blocks at all; then a removal run.
    ops.extend([10, 11, 99, 12, 13, 14, 15].map(|l| hold(1, l, true)));
    ops.extend([10, 11].map(|l| hold(7, l, true)));
    ops.extend([14, 15].map(|l| hold(1, l, false)));
    let applied = s.applied;
    s.apply_all(&ops);
    assert_eq!(s.group_unheld, 3, "99 on slot 1, both of slot 7");
    assert_eq!(s.applied - applied, 11);
    let (mut at, mut out, mut names) = (ExportAt::default(), Vec::new(), Vec::new());
    while !s.export_step(IX, &mut at, &mut out, &mut names) {}
    let mut got: Vec<(u64, u32)> = out.iter().map(|b| (b.local.0, b.groups)).collect();
    got.sort();
    assert_eq!(
        got,
        [10, 11, 12, 13]
            .map(|l| (l, 1 << 2))
            .into_iter()
            .chain([(14, 0), (15, 0)])
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_slots_first_groups_hold_in_lanes_and_the_rest_beside_the_tree() {
    let mut s = Shard::default();
    s.apply_all(&run(1, DEV, None, &[10, 11]));
    s.apply_all(&run(1, HOST, None, &[10, 11]));
    s.apply_all(&run(2, DEV, None, &[10]));
    // Six groups, described in the order 5, 1, 2, 3, 4, 6: the first four
    // described take the lanes, 4 and 6 the side table.
    s.apply_all(&[5, 1, 2, 3, 4, 6].map(|g| window_group(g, 0).1));
    let hold = |s: &mut Shard, groups: &[u8]| {
        for &g in groups {
            s.apply_all(&[10, 11].map(|l| ShardOp::GroupHold {
                index: IX,
                slot: WorkerSlot(1),
                group: g,
                block: eh(1, l),
                held: true,
            }));
        }
    };
    hold(&mut s, &[1, 2, 3, 5]);
    assert_eq!(
        s.index(IX).unwrap().tree.side_group_pairs(),
        0,
        "all in lanes"
    );
    hold(&mut s, &[4, 6]);
    let all = 0b111_1110;
    assert_eq!(
        exported_groups(&s),
        [(1, 10, all), (1, 11, all), (2, 10, 0)]
    );
    let tree = &s.index(IX).unwrap().tree;
    assert_eq!(
        tree.side_group_pairs(),
        2,
        "blocks 10 and 11, for groups 4 and 6"
    );
    // A tier's removal keeps the groups; the slot's last tier takes them all.
    s.apply_all(&[remove(1, 11, HOST.bit())]);
    assert_eq!(
        exported_groups(&s),
        [(1, 10, all), (1, 11, all), (2, 10, 0)]
    );
    s.apply_all(&[remove(1, 11, DEV.bit())]);
    assert_eq!(exported_groups(&s), [(1, 10, all), (2, 10, 0)]);
    assert_eq!(s.index(IX).unwrap().tree.side_group_pairs(), 1);
    // A group's removal takes its bit alone, in a lane or beside the tree.
    for g in [2, 6] {
        s.apply_all(&[ShardOp::GroupHold {
            index: IX,
            slot: WorkerSlot(1),
            group: g,
            block: eh(1, 10),
            held: false,
        }]);
    }
    assert_eq!(
        exported_groups(&s),
        [(1, 10, all & !(1 << 2 | 1 << 6)), (2, 10, 0)]
    );
}
