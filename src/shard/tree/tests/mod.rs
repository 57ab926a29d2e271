//! The tree's examples; `model` holds the property test against a plain model of
//! holders and names.

use super::arena::NodeId;
use super::*;
use crate::hash;
use crate::shard::HolderLists;
use crate::shard::holders::Holder;
use crate::shard::predict::Tick;
use crate::shard::{ExportedBlock, Prompt};
use crate::types::SeqHash;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap as StdMap};

mod model;

const DEV: Tier = Tier::DEVICE;

fn eh(x: u64) -> EngineHash {
    EngineHash(x)
}

fn chain(slot: u32, from: u64, locals: &[u64]) -> Vec<(EngineHash, BlockHash)> {
    locals
        .iter()
        .enumerate()
        .map(|(i, &l)| (eh(slot as u64 * 1000 + from + i as u64), BlockHash(l)))
        .collect()
}

/// A lookup's output with [`SAME_HOLDERS`] spelled out.
fn spelled(out: &[u32]) -> Vec<u32> {
    HolderLists::new(out)
        .flat_map(|(hs, _)| std::iter::once(hs.len() as u32).chain(hs.iter().copied()))
        .collect()
}

fn lookup(t: &mut Tree, locals: &[u64]) -> Vec<u32> {
    let mut out = Vec::new();
    let locals: Vec<BlockHash> = locals.iter().map(|&l| BlockHash(l)).collect();
    t.lookup(Prompt::Locals(&locals), &mut out);
    spelled(&out)
}

fn held(slot: u32, tier: Tier) -> u32 {
    Holder::new(WorkerSlot(slot), tier.bit()).0
}

/// A store that filed every block, `new_holders` of them new to the slot, none of
/// them predicted before.
fn filed(new_holders: usize) -> Stored {
    Stored::Filed {
        new_holders,
        confirmed: 0,
        duplicate: false,
        unfiled: 0,
    }
}

#[test]
fn a_chain_is_filed_once_and_shared_by_its_holders() {
    let mut t = Tree::default();
    let s = |x| WorkerSlot(x);
    assert_eq!(
        t.store(s(1), DEV, None, &chain(1, 0, &[10, 11, 12])),
        filed(3)
    );
    assert_eq!(t.store(s(2), DEV, None, &chain(2, 0, &[10, 11])), filed(2));
    // The same store again changes nothing: a duplicate.
    assert_eq!(
        t.store(s(2), DEV, None, &chain(2, 0, &[10, 11])),
        Stored::Filed {
            new_holders: 0,
            confirmed: 0,
            duplicate: true,
            unfiled: 0
        }
    );
    assert_eq!(t.len(), 3);
    let (a, b) = (held(1, DEV), held(2, DEV));
    assert_eq!(
        lookup(&mut t, &[10, 11, 12, 13]),
        [2, a, b, 2, a, b, 1, a, 0]
    );
    // A continuation names its parent by the slot's own engine hash.
    assert_eq!(
        t.store(s(2), Tier::HOST, Some(eh(2001)), &chain(2, 2, &[12])),
        filed(1)
    );
    let b_host = Holder::new(WorkerSlot(2), Tier::HOST.bit()).0;
    assert_eq!(
        lookup(&mut t, &[10, 11, 12]),
        [2, a, b, 2, a, b, 2, a, b_host]
    );
    assert_eq!(
        t.store(s(3), DEV, Some(eh(7)), &chain(3, 0, &[10])),
        Stored::UnknownParent
    );
    assert_eq!(t.per_slot(), [0, 3, 3]);
}

#[test]
fn a_dump_in_steps_skips_a_root_that_went_and_whose_node_was_reused() {
    let mut t = Tree::default();
    let s1 = WorkerSlot(1);
    for r in 0..100u64 {
        t.store(s1, DEV, None, &[(eh(r), BlockHash(1000 + r))]);
    }
    let mut out = Vec::new();
    let mut walk = ExportWalk::default();
    let mut gone = BTreeSet::new();
    let mut step = 0;
    while !t.export_step(&mut walk, 10, &mut out) {
        // A root the walk has not reached goes, and its node is filed again as
        // a new root (the free list hands the freed node out first).
        let r = 99 - step;
        assert!(t.remove(s1, eh(r), TierSet::ALL));
        gone.insert(1000 + r);
        t.store(s1, DEV, None, &[(eh(500 + r), BlockHash(5000 + r))]);
        step += 1;
    }
    let dumped: Vec<u64> = out.iter().map(|d| d.local.0).collect();
    let unique: BTreeSet<u64> = dumped.iter().copied().collect();
    assert_eq!(unique.len(), dumped.len(), "a block dumped twice");
    // Every root held throughout is dumped; one that went may have been dumped
    // before it went.
    for l in (1000..1100).filter(|l| !gone.contains(l)) {
        assert!(unique.contains(&l), "{l}");
    }
    assert!(gone.iter().any(|l| !unique.contains(l)));
    assert!(
        unique.iter().all(|&l| l < 5000),
        "a root filed during the walk"
    );
}

#[test]
fn a_full_arena_files_what_fits_and_says_what_it_did_not() {
    let mut t = Tree {
        node_limit: Some(4),
        ..Tree::default()
    };
    let s1 = WorkerSlot(1);
    assert_eq!(
        t.store(s1, DEV, None, &chain(1, 0, &[10, 11, 12, 13, 14, 15])),
        Stored::Filed {
            new_holders: 4,
            confirmed: 0,
            duplicate: false,
            unfiled: 2
        }
    );
    assert_eq!(lookup(&mut t, &[10, 11, 12, 13, 14]).len(), 9);
    // Space freed is used again.
    assert!(t.remove(s1, eh(1003), TierSet::ALL));
    t.predict(
        WorkerSlot(2),
        &[BlockHash(20), BlockHash(21)],
        5,
        &mut ChainAt::default(),
    );
    assert_eq!(t.len(), 4);
    assert_eq!(t.tier_pairs()[Tier::PREDICTED.0 as usize], 1);
}

#[test]
fn a_removed_leaf_goes_and_a_held_path_stays() {
    let mut t = Tree::default();
    let s1 = WorkerSlot(1);
    t.store(s1, DEV, None, &chain(1, 0, &[10, 11, 12]));
    // The middle block goes: its node stays as the path to the last.
    assert!(t.remove(s1, eh(1001), TierSet::ALL));
    assert_eq!(t.len(), 3);
    assert_eq!(lookup(&mut t, &[10, 11, 12]), [1, held(1, DEV), 0]);
    // The last goes: it and the path above it that nobody holds are freed.
    assert!(t.remove(s1, eh(1002), TierSet::ALL));
    assert_eq!(t.len(), 1);
    assert!(!t.remove(s1, eh(1002), TierSet::ALL));
    // Freed nodes are reused.
    t.store(s1, DEV, Some(eh(1000)), &chain(1, 1, &[21, 22]));
    assert_eq!(t.len(), 3);
    assert_eq!(t.chunks[0].len(), 3);
    t.clear_slot(s1, TierSet::ALL);
    assert!(t.is_empty());
    assert_eq!(lookup(&mut t, &[10]), [0]);
}

#[test]
fn a_wide_parent_keeps_its_children_in_a_table() {
    let mut t = Tree::default();
    let s = WorkerSlot(1);
    t.store(s, DEV, None, &[(eh(1), BlockHash(1))]);
    let n = 24;
    for i in 0..n {
        t.store(
            s,
            DEV,
            Some(eh(1)),
            &[
                (eh(100 + i), BlockHash(100 + i)),
                (eh(500 + i), BlockHash(7)),
            ],
        );
    }
    assert_eq!(t.wide.len(), 1);
    for i in 0..n {
        assert_eq!(lookup(&mut t, &[1, 100 + i, 7]).len(), 6);
        let seqs = [
            hash::chain(None, BlockHash(1)),
            hash::chain(Some(hash::chain(None, BlockHash(1))), BlockHash(100 + i)),
        ];
        let mut out = Vec::new();
        t.lookup(Prompt::Seqs(&seqs), &mut out);
        assert_eq!(spelled(&out).len(), 4);
    }
    for i in 0..n {
        assert!(t.remove(s, eh(500 + i), TierSet::ALL));
        assert!(t.remove(s, eh(100 + i), TierSet::ALL));
    }
    assert!(t.wide.is_empty());
    assert_eq!(t.len(), 1);
    assert!(t.is_leaf(t.roots.iter().copied().next().unwrap()));
}

#[test]
fn a_second_engine_hash_for_a_block_goes_with_the_first() {
    let mut t = Tree::default();
    let s = WorkerSlot(1);
    t.store(s, DEV, None, &[(eh(1), BlockHash(10))]);
    t.store(s, DEV, None, &[(eh(2), BlockHash(10))]);
    assert_eq!(t.per_slot(), [0, 1]);
    assert!(t.remove(s, eh(2), TierSet::ALL));
    assert!(t.is_empty());
    // Neither name is left to remove a block filed in the freed node.
    t.store(s, DEV, None, &[(eh(3), BlockHash(20))]);
    assert!(!t.remove(s, eh(1), TierSet::ALL));
    assert_eq!(lookup(&mut t, &[20]), [1, held(1, DEV)]);
}

/// Slots whose engines agree on hashes name a block by its node's own hash
/// (4 bytes a name); a slot seeded apart names it beside (12 bytes). Either
/// name resolves, removes and clears as before, and an evicted block's own
/// names go with it.
#[test]
fn agreeing_engines_share_the_nodes_hash_and_others_name_it_beside() {
    let mut t = Tree::default();
    let (a, b, apart) = (WorkerSlot(0), WorkerSlot(1), WorkerSlot(2));
    let shared = chain(0, 0, &[1, 2, 3]);
    t.store(a, DEV, None, &shared);
    t.store(b, DEV, None, &shared);
    t.store(apart, DEV, None, &chain(2, 0, &[1, 2, 3]));
    // (own names, other names) of a slot.
    let names = |t: &Tree, s: WorkerSlot| {
        let n = &t.engine[s.0 as usize];
        (n.own.len(), n.other.len())
    };
    assert_eq!(names(&t, a), (3, 0));
    assert_eq!(names(&t, b), (3, 0));
    assert_eq!(names(&t, apart), (0, 3));
    assert!(t.remove(b, shared[2].0, TierSet::ALL));
    assert!(t.remove(apart, eh(2002), TierSet::ALL));
    assert_eq!(
        lookup(&mut t, &[1, 2, 3]),
        [
            3,
            held(0, DEV),
            held(1, DEV),
            held(2, DEV),
            3,
            held(0, DEV),
            held(1, DEV),
            held(2, DEV),
            1,
            held(0, DEV)
        ]
    );
    t.clear_slot(apart, TierSet::ALL);
    assert_eq!(names(&t, apart), (0, 0));
    t.track_use();
    while t.evict().is_some() {}
    assert!(t.is_empty());
    assert_eq!((names(&t, a), names(&t, b)), ((0, 0), (0, 0)));
}

/// Engines that count their block hashes (the same hash, other content on each
/// worker) stay exact: each slot's names are its own, whichever node holds the
/// hash as its own.
#[test]
fn engines_counting_their_hashes_name_other_content_by_the_same_hash() {
    let mut t = Tree::default();
    let (a, b) = (WorkerSlot(0), WorkerSlot(1));
    t.store(a, DEV, None, &[(eh(5), BlockHash(10))]);
    t.store(b, DEV, None, &[(eh(5), BlockHash(20))]);
    t.store(b, DEV, None, &[(eh(7), BlockHash(10))]);
    assert_eq!(lookup(&mut t, &[10]), [2, held(0, DEV), held(1, DEV)]);
    assert_eq!(lookup(&mut t, &[20]), [1, held(1, DEV)]);
    assert!(t.remove(b, eh(5), TierSet::ALL));
    assert_eq!(lookup(&mut t, &[20]), [0]);
    assert_eq!(lookup(&mut t, &[10]), [2, held(0, DEV), held(1, DEV)]);
    assert!(t.remove(a, eh(5), TierSet::ALL));
    assert!(!t.remove(a, eh(7), TierSet::ALL));
    assert_eq!(lookup(&mut t, &[10]), [1, held(1, DEV)]);
    assert!(t.remove(b, eh(7), TierSet::ALL));
    assert!(t.is_empty());
}

/// A prediction in steps goes on below the block the step before ended at;
/// once that block is gone (evicted, or its prediction ended and the tree
/// began again), nothing more of the prompt is predicted.
#[test]
fn a_prediction_in_steps_goes_on_where_it_ended_while_that_block_lives() {
    let mut t = Tree::default();
    t.track_use();
    let s = WorkerSlot(1);
    let b = |x: &[u64]| x.iter().map(|&l| BlockHash(l)).collect::<Vec<_>>();
    let mut at = ChainAt::default();
    t.predict(s, &b(&[1, 2]), 50, &mut at);
    t.predict(s, &b(&[3]), 50, &mut at);
    // A predicted holder reads as the device it stands for.
    let p = held(1, DEV);
    assert_eq!(lookup(&mut t, &[1, 2, 3]), [1, p, 1, p, 1, p]);
    // Its last block evicted: the rest is dropped.
    t.evict();
    t.predict(s, &b(&[4]), 50, &mut at);
    assert!(at.is_lost());
    assert_eq!(t.len(), 2);
    // Every prediction ended and the tree began again: a node filed since at the
    // same place is not the one the step ended at.
    let mut at = ChainAt::default();
    t.predict(s, &b(&[7]), 60, &mut at);
    t.expire(60, usize::MAX);
    assert!(t.is_empty());
    t.predict(s, &b(&[7]), 70, &mut ChainAt::default());
    t.predict(s, &b(&[8]), 70, &mut at);
    assert!(at.is_lost());
    assert_eq!(t.len(), 1);
}

/// An engine hash stored again under another parent, naming a block the slot
/// already holds by another hash: the first block's hold ends with the name,
/// and the block it now names keeps both names, so that each goes with the
/// hold (no 4-byte name is left to a node the slot no longer holds) and every
/// block can still be removed.
#[test]
fn a_hash_stored_again_under_another_parent_leaves_no_name_behind() {
    let mut t = Tree::default();
    let s = WorkerSlot(2);
    // 3 → 2 → 3, named 1, 6, 4.
    t.store(
        s,
        DEV,
        None,
        &[(eh(1), BlockHash(3)), (eh(6), BlockHash(2))],
    );
    t.store(s, DEV, Some(eh(6)), &[(eh(4), BlockHash(3))]);
    // 6 again, under 3 → 2, for the block already named 4: block 3 → 2 loses
    // its hold, and 3 → 2 → 3 is named 4 and 6.
    t.store(
        s,
        DEV,
        Some(eh(6)),
        &[(eh(6), BlockHash(3)), (eh(2), BlockHash(1))],
    );
    assert_eq!(lookup(&mut t, &[3, 2]), [1, held(2, DEV), 0]);
    assert_eq!(t.per_slot(), [0, 0, 3]);
    // 6 once more, as a first block: 3 → 2 → 3 loses its hold, and with it
    // its other name, 4.
    t.store(
        s,
        DEV,
        None,
        &[(eh(6), BlockHash(1)), (eh(5), BlockHash(2))],
    );
    for (i, names) in t.engine.iter().enumerate() {
        for n in names.own.iter() {
            assert!(t.resolve(WorkerSlot(i as u32), n.0).is_some());
        }
    }
    assert!(!t.remove(s, eh(4), TierSet::ALL));
    for e in [1, 2, 6, 5] {
        assert!(t.remove(s, eh(e), TierSet::ALL), "{e}");
    }
    assert!(t.is_empty());
}

/// A store confirming a prediction names the block once: a predicted holder
/// has no engine hash, so the store is no second name (which would walk the
/// slot's engine map for the first).
#[test]
fn a_store_confirming_a_prediction_is_not_a_second_name() {
    let mut t = Tree::default();
    let s = WorkerSlot(1);
    t.predict(
        s,
        &[BlockHash(10), BlockHash(11)],
        100,
        &mut ChainAt::default(),
    );
    t.store(s, DEV, None, &chain(1, 10, &[10, 11]));
    assert!(t.aliases.is_empty());
    assert!(t.remove(s, eh(1011), TierSet::ALL));
    assert!(t.remove(s, eh(1010), TierSet::ALL));
    assert!(t.is_empty());
}

#[test]
fn a_clear_walks_only_its_slot_in_steps() {
    let mut t = Tree::default();
    let locals: Vec<u64> = (1..=20_000).collect();
    t.store(WorkerSlot(1), DEV, None, &chain(1, 0, &locals));
    t.store(WorkerSlot(2), DEV, None, &chain(2, 0, &locals[..10]));
    let mut at = NamesAt::default();
    let mut steps = 1;
    while !t.clear_step(WorkerSlot(1), TierSet::ALL, &mut at, 1024) {
        steps += 1;
        // Between steps the tree answers and the other slot is untouched.
        let answer = lookup(&mut t, &locals[..10]);
        assert_eq!(answer.iter().filter(|&&h| h == held(2, DEV)).count(), 10);
    }
    assert!(steps > 10, "{steps} steps");
    assert_eq!(t.len(), 10);
    assert_eq!(t.per_slot(), [0, 0, 10]);
    assert_eq!(
        lookup(&mut t, &locals[..11]),
        [1, held(2, DEV)]
            .repeat(10)
            .into_iter()
            .chain([0])
            .collect::<Vec<_>>()
    );
}

impl Tree {
    /// The local hashes from the root down to `id`.
    fn path(&self, mut id: NodeId) -> Vec<u64> {
        let mut path = vec![self.node(id).local().0];
        while let Some(p) = self.parent(id) {
            id = p;
            path.push(self.node(id).local().0);
        }
        path.reverse();
        path
    }
}

#[test]
fn eviction_takes_the_least_recently_used_leaf() {
    let mut t = Tree::default();
    t.track_use();
    let s1 = WorkerSlot(1);
    t.store(s1, DEV, None, &chain(1, 0, &[10, 11, 12]));
    t.store(s1, DEV, None, &chain(1, 10, &[20, 21]));
    // The older store's leaf goes first.
    let v = t.next_victim().unwrap();
    assert_eq!(t.path(v), [10, 11, 12]);
    assert_eq!(t.evict_node(v), 1);
    // A match keeps a block: 20 and 21 are matched, so 11, a leaf now, goes.
    assert_eq!(lookup(&mut t, &[20, 21]).len(), 4);
    let v = t.next_victim().unwrap();
    assert_eq!(t.path(v), [10, 11]);
    t.evict_node(v);
    assert_eq!(t.len(), 3);
    assert_eq!(lookup(&mut t, &[10, 11]), [1, held(1, DEV), 0]);
    // The evicted block's engine hash names nothing, even once its node is
    // filed again with another block.
    assert!(!t.remove(s1, eh(1001), TierSet::ALL));
    t.store(s1, DEV, Some(eh(1000)), &chain(1, 20, &[30]));
    assert_eq!(
        t.store(s1, DEV, Some(eh(1002)), &chain(1, 30, &[31])),
        Stored::UnknownParent
    );
    assert_eq!(t.per_slot(), [0, 4]);
    assert_eq!(t.tier_pairs()[0], 4);
    // An empty tree has nothing to evict.
    assert_eq!(Tree::default().evict(), None);
}

/// A prompt matched after every other store outlasts prompts stored after it
/// and matched once, though it comes first in the arena; the newest store
/// stays.
#[test]
fn a_hot_prompt_and_the_newest_store_outlast_older_ones() {
    let mut t = Tree::default();
    t.track_use();
    let s1 = WorkerSlot(1);
    let prompt = |p: u64| -> Vec<u64> { (0..4).map(|b| 100 * (p + 1) + b).collect() };
    let locals = |p: u64| -> Vec<BlockHash> { prompt(p).into_iter().map(BlockHash).collect() };
    for p in 0..6 {
        t.store(s1, DEV, None, &chain(1, 1000 * p, &prompt(p)));
        t.lookup(Prompt::Locals(&locals(p)), &mut Vec::new());
        t.lookup(Prompt::Locals(&locals(0)), &mut Vec::new());
    }
    t.store(s1, DEV, None, &chain(1, 9000, &prompt(6)));
    for _ in 0..8 {
        t.evict();
    }
    let held = |t: &mut Tree, p: u64| {
        let mut out = Vec::new();
        t.lookup(Prompt::Locals(&locals(p)), &mut out);
        spelled(&out).iter().filter(|&&n| n == 1).count()
    };
    assert_eq!(held(&mut t, 0), 4);
    assert_eq!(held(&mut t, 6), 4);
    assert_eq!(held(&mut t, 1) + held(&mut t, 2), 0);
}

/// A replica filed from a tree's dump and engine hashes: `seed` in dump order,
/// every (block, holder) once per tier and once per engine hash naming it.
fn replica(t: &Tree) -> Tree {
    let mut dumped = Vec::new();
    t.export(&mut dumped);
    let mut names: BTreeMap<(u32, u64), Vec<EngineHash>> = BTreeMap::new();
    let mut ehs = Vec::new();
    t.engine_hashes(&mut ehs);
    for (slot, seq, eh) in ehs {
        names.entry((slot.0, seq.0)).or_default().push(eh);
    }
    let mut r = Tree::default();
    let mut filed = HashMap::new();
    for d in &dumped {
        let slot = d.holder.slot();
        let parent_engine = d
            .parent
            .and_then(|p| names.get(&(slot.0, p.0)))
            .map(|n| n[0]);
        for tier in d.holder.tiers().iter() {
            for &eh in &names[&(slot.0, d.seq.0)] {
                let seed = Seed {
                    slot,
                    tier,
                    engine: eh,
                    local: d.local,
                    parent_engine,
                    parent_seq: d.parent,
                };
                r.seed(&seed, &mut filed);
            }
        }
    }
    r
}

#[test]
fn a_replica_filed_from_a_dump_answers_as_the_tree_does() {
    let mut t = Tree::default();
    for c in 0..40u64 {
        let slot = WorkerSlot((c % 3) as u32);
        let tier = Tier((c % 2) as u8);
        // Conversations share their first two blocks, some extend another's.
        let locals: Vec<u64> = [1, 2]
            .into_iter()
            .chain((0..(c % 7 + 1)).map(|i| 100 * c + i))
            .collect();
        t.store(slot, tier, None, &chain(slot.0, 10_000 * c, &locals));
        if c % 5 == 0 {
            // A second name for the same blocks.
            t.store(
                slot,
                tier,
                None,
                &chain(slot.0, 10_000 * c + 5_000, &locals),
            );
        }
    }
    let mut r = replica(&t);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    t.export(&mut a);
    r.export(&mut b);
    assert_eq!(sorted(&a), sorted(&b));
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    t.engine_hashes(&mut ea);
    r.engine_hashes(&mut eb);
    ea.sort_by_key(|&(s, q, e)| (s.0, q.0, e.0));
    eb.sort_by_key(|&(s, q, e)| (s.0, q.0, e.0));
    assert_eq!(ea, eb);
    assert_eq!(t.per_slot(), r.per_slot());
    assert_eq!(t.tier_pairs(), r.tier_pairs());
    // The engines' later events resolve on the replica as on the tree.
    for c in [3u64, 10] {
        let slot = WorkerSlot((c % 3) as u32);
        let last = eh(slot.0 as u64 * 1000 + 10_000 * c + 2 + c % 7);
        assert!(t.remove(slot, last, TierSet::ALL));
        assert!(r.remove(slot, last, TierSet::ALL));
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    t.export(&mut a);
    r.export(&mut b);
    assert_eq!(sorted(&a), sorted(&b));
    // Seeding a block whose parent is named by an engine hash alone that names
    // nothing files nothing.
    let mut filed = HashMap::new();
    let orphan = Seed {
        slot: WorkerSlot(1),
        tier: DEV,
        engine: eh(9),
        local: BlockHash(9),
        parent_engine: Some(eh(77)),
        parent_seq: None,
    };
    assert!(!r.seed(&orphan, &mut filed));
    // One whose parent is named by a sequence hash nobody's block has hangs from
    // a root standing for it: dumped with that parent, and its later events
    // resolve.
    let orphan = Seed {
        parent_engine: None,
        parent_seq: Some(SeqHash(77)),
        ..orphan
    };
    assert!(r.seed(&orphan, &mut filed));
    let mut d = Vec::new();
    r.export(&mut d);
    let b = d.iter().find(|b| b.local == BlockHash(9)).unwrap();
    assert_eq!(b.parent, Some(SeqHash(77)));
    assert_eq!(b.seq, hash::chain(Some(SeqHash(77)), BlockHash(9)));
    assert!(r.remove(WorkerSlot(1), eh(9), TierSet::ALL));
    let mut after = Vec::new();
    r.export(&mut after);
    assert_eq!(after.len(), d.len() - 1);
}

fn sorted(d: &[ExportedBlock]) -> Vec<(u64, u32)> {
    let mut v: Vec<(u64, u32)> = d.iter().map(|d| (d.seq.0, d.holder.0)).collect();
    v.sort();
    v
}

/// Blocks with the same holders stay one run through stores, removals in any
/// order and reuse of freed places; a run parts only where holders differ.
#[test]
fn a_chain_held_alike_is_one_run() {
    let mut t = Tree::default();
    let (s1, s2) = (WorkerSlot(1), WorkerSlot(2));
    let locals: Vec<u64> = (100..200).collect();
    // Engines that agree on hashes: both name the blocks by slot 1's.
    let blocks = chain(1, 0, &locals);
    t.store(s1, DEV, None, &blocks);
    assert_eq!(t.runs.live(), 1);
    // Slot 2 holds the first 60: one run they both hold, one slot 1 alone holds.
    t.store(s2, DEV, None, &blocks[..60]);
    assert_eq!(t.runs.live(), 2);
    assert!(t.runs_hold());
    // Its blocks go in a scattered order; once all have, the chain is one run again.
    let mut order: Vec<usize> = (0..60).collect();
    order.sort_by_key(|&i| (i * 37) % 61);
    for (k, &i) in order.iter().enumerate() {
        assert!(t.remove(s2, blocks[i].0, TierSet::ALL));
        assert!(t.runs_hold());
        if k == 30 {
            assert!(t.runs.live() > 2, "removals in the middle part the runs");
        }
    }
    assert_eq!(t.runs.live(), 1);
    // A prompt that parts from the chain at block 30: the shared part, the rest of
    // slot 1's chain, and slot 2's own blocks.
    let mut other: Vec<(EngineHash, BlockHash)> = blocks[..30].to_vec();
    other.extend(chain(2, 0, &(500..520).collect::<Vec<_>>()));
    t.store(s2, DEV, None, &other);
    assert_eq!(t.runs.live(), 3);
    assert!(t.runs_hold());
    // Slot 1's chain goes from its end; slot 2's prompt is left, in two runs (the
    // part slot 2 held alone, and the part slot 1 no longer holds beside it).
    for b in blocks.iter().rev() {
        assert!(t.remove(s1, b.0, TierSet::ALL));
    }
    assert_eq!(t.len(), 50);
    assert_eq!(t.runs.live(), 2);
    // A new chain fills the freed places in order: one run of its own.
    let filed = t.filed();
    t.store(
        s1,
        DEV,
        None,
        &chain(1, 0, &(1000..1040).collect::<Vec<_>>()),
    );
    assert_eq!(t.filed(), filed);
    assert_eq!(t.runs.live(), 3);
    assert!(t.runs_hold());
    // A chain longer than a run can be takes as many runs as it needs, and a
    // change in its middle moves no more than half a run.
    let mut t = Tree::default();
    let long: Vec<u64> = (10_000..12_500).collect();
    let long = chain(1, 0, &long);
    t.store(s1, DEV, None, &long);
    assert_eq!(t.runs.live(), 3);
    // Block 1,500 held by nobody parts its run in three; held again, it joins up.
    assert!(t.remove(s1, long[1500].0, TierSet::ALL));
    assert_eq!(t.runs.live(), 5);
    assert!(t.runs_hold());
    t.store(s1, DEV, Some(long[1499].0), &long[1500..1501]);
    assert_eq!(t.runs.live(), 3);
    assert!(t.runs_hold());
}

/// A run that a worker was predicted to hold and then stores, block by block,
/// stays one run: each block's confirmation is one change, so the blocks after
/// the first take the first one's chunk.
#[test]
fn a_predicted_run_confirmed_by_a_store_stays_one_run() {
    let mut t = Tree::default();
    let locals: Vec<u64> = (100..164).collect();
    let blocks = chain(1, 0, &locals);
    t.store(WorkerSlot(1), DEV, None, &blocks);
    t.store(WorkerSlot(2), DEV, None, &blocks);
    assert_eq!(t.runs.live(), 1);
    let hashes: Vec<BlockHash> = locals.iter().map(|&l| BlockHash(l)).collect();
    t.predict(WorkerSlot(3), &hashes, 50, &mut ChainAt::default());
    assert_eq!(t.runs.live(), 1);
    t.store(WorkerSlot(3), DEV, None, &blocks);
    assert_eq!(t.predicted_pairs(), 0);
    assert_eq!(t.runs.live(), 1);
    assert!(t.runs_hold());
    assert_eq!(
        lookup(&mut t, &locals[..2]),
        [
            3,
            held(1, DEV),
            held(2, DEV),
            held(3, DEV),
            3,
            held(1, DEV),
            held(2, DEV),
            held(3, DEV)
        ]
    );
}
