//! The property test: any sequence of stores, removals, clears, predictions and
//! evictions leaves the tree answering as a plain model of holders and names does.

use super::*;

/// The tree's rules written plainly: blocks are paths of local hashes.
#[derive(Default)]
struct Model {
    names: StdMap<(u32, u64), Vec<u64>>,
    holders: BTreeMap<Vec<u64>, BTreeMap<u32, u8>>,
    /// Deadlines of predicted (block, slot) pairs.
    predicted: BTreeMap<(Vec<u64>, u32), Tick>,
    now: Tick,
}

const PREDICTED: u8 = Tier::PREDICTED.bit().0;

impl Model {
    fn unhold(&mut self, slot: u32, path: &[u64], tiers: u8) {
        let hs = self.holders.get_mut(path).unwrap();
        let left = hs[&slot] & !tiers;
        if left != 0 {
            hs.insert(slot, left);
            return;
        }
        hs.remove(&slot);
        if hs.is_empty() {
            self.holders.remove(path);
        }
        self.names.retain(|(s, _), p| !(*s == slot && p == path));
    }

    /// The tier bits `slot` holds the block at `path` with (none yet: 0).
    fn held(&mut self, path: &[u64], slot: u32) -> &mut u8 {
        self.holders
            .entry(path.to_vec())
            .or_default()
            .entry(slot)
            .or_default()
    }

    fn store(&mut self, slot: u32, tier: Tier, parent: Option<u64>, blocks: &[(u64, u64)]) {
        let mut path = match parent {
            None => Vec::new(),
            Some(p) => match self.names.get(&(slot, p)) {
                Some(path) => path.clone(),
                None => return,
            },
        };
        for &(e, l) in blocks {
            path.push(l);
            let held = self.held(&path, slot);
            *held |= tier.bit().0;
            if *held & PREDICTED != 0 {
                *held &= !PREDICTED;
                self.predicted.remove(&(path.clone(), slot));
            }
            match self.names.insert((slot, e), path.clone()) {
                Some(old) if old != path => {
                    self.unhold(slot, &old, 0xff);
                    self.names.insert((slot, e), path.clone());
                }
                _ => {}
            }
        }
    }

    fn remove(&mut self, slot: u32, e: u64, tiers: u8) {
        if let Some(path) = self.names.get(&(slot, e)).cloned() {
            self.unhold(slot, &path, tiers & !PREDICTED);
        }
    }

    fn predict(&mut self, slot: u32, path: &[u64], deadline: Tick) {
        for i in 1..=path.len() {
            let p = path[..i].to_vec();
            let held = self.held(&p, slot);
            if *held & !PREDICTED != 0 {
                continue;
            }
            *held |= PREDICTED;
            let d = self.predicted.entry((p, slot)).or_default();
            *d = (*d).max(deadline);
        }
    }

    fn evict(&mut self, path: &[u64]) {
        let slots: Vec<u32> = self.holders[path].keys().copied().collect();
        for slot in slots {
            self.unhold(slot, path, 0xff);
            self.predicted.remove(&(path.to_vec(), slot));
        }
    }

    fn expire(&mut self, now: Tick) {
        self.now = now;
        let due: Vec<(Vec<u64>, u32)> = self
            .predicted
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (p, slot) in due {
            self.predicted.remove(&(p.clone(), slot));
            self.unhold(slot, &p, PREDICTED);
        }
    }

    fn clear(&mut self, slot: u32, tiers: u8) {
        let held: Vec<Vec<u64>> = self
            .holders
            .iter()
            .filter(|(_, hs)| hs.contains_key(&slot))
            .map(|(p, _)| p.clone())
            .collect();
        for p in held {
            self.unhold(slot, &p, tiers);
        }
        if tiers & PREDICTED != 0 {
            self.predicted.retain(|(_, s), _| *s != slot);
        }
    }

    fn lookup(&self, locals: &[u64]) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        for i in 0..locals.len() {
            let hs: Vec<u32> = self.holders.get(&locals[..=i]).map_or(Vec::new(), |hs| {
                hs.iter()
                    .map(|(&s, &t)| Holder::new(WorkerSlot(s), TierSet(t)).as_scored().0)
                    .collect()
            });
            let stop = hs.is_empty();
            out.push(hs);
            if stop {
                break;
            }
        }
        out
    }

    fn nodes(&self) -> usize {
        let paths: BTreeSet<&[u64]> = self
            .holders
            .keys()
            .flat_map(|p| (1..=p.len()).map(move |i| &p[..i]))
            .collect();
        paths.len()
    }
}

#[test]
fn a_dump_in_steps_passes_every_block_held_throughout_once() {
    let mut t = Tree::default();
    let s1 = WorkerSlot(1);
    // Conversations sharing a first block, branching below it.
    for c in 0..50u64 {
        let locals: Vec<u64> = std::iter::once(1)
            .chain((0..20).map(|i| 1000 * c + 10 + i))
            .collect();
        let parent = (c > 0).then(|| eh(1000 * 1000));
        let from = if c == 0 { 0 } else { 1 };
        let blocks: Vec<_> = locals[from..]
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                (
                    eh(if from + i == 0 {
                        1000 * 1000
                    } else {
                        1000 * 1000 + 100 * c + i as u64 + 1
                    }),
                    BlockHash(l),
                )
            })
            .collect();
        assert!(matches!(
            t.store(s1, DEV, parent, &blocks),
            Stored::Filed { .. }
        ));
    }
    let mut whole = Vec::new();
    t.export(&mut whole);
    assert_eq!(whole.len(), 1 + 50 * 20);
    // Between steps, odd conversations lose their tails and new ones come.
    let mut out = Vec::new();
    let mut walk = ExportWalk::default();
    let mut step = 0u64;
    while !t.export_step(&mut walk, 37, &mut out) {
        step += 1;
        let c = 2 * step + 1;
        if c < 50 {
            assert!(t.remove(s1, eh(1000 * 1000 + 100 * c + 20), TierSet::ALL));
        }
        t.store(
            s1,
            DEV,
            None,
            &[(eh(5_000_000 + step), BlockHash(7_000_000 + step))],
        );
    }
    let seqs: Vec<u64> = out.iter().map(|d| d.seq.0).collect();
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "a block dumped twice");
    // A block of the first dump still held at the end was held throughout.
    let mut after = Vec::new();
    t.export(&mut after);
    assert_eq!(after.len(), whole.len() - 24 + step as usize);
    let first: BTreeSet<u64> = whole.iter().map(|d| d.seq.0).collect();
    for d in after.iter().filter(|d| first.contains(&d.seq.0)) {
        assert!(
            unique.contains(&d.seq.0),
            "a block held throughout was missed"
        );
    }
}

/// `[n, holder..]` per block, each block's holders sorted.
fn blocks_of(out: &[u32]) -> Vec<Vec<u32>> {
    HolderLists::new(out)
        .map(|(hs, _)| {
            let mut hs = hs.to_vec();
            hs.sort();
            hs
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Store {
        slot: u32,
        tier: u8,
        from: Vec<u64>,
        locals: Vec<u64>,
        alias: bool,
    },
    Remove {
        slot: u32,
        path: Vec<u64>,
        alias: bool,
        tiers: u8,
    },
    /// A prediction applied in two steps, the second going on where the first
    /// ended (`split` blocks in the first).
    Predict {
        slot: u32,
        path: Vec<u64>,
        ttl: Tick,
        split: usize,
    },
    Expire {
        advance: Tick,
    },
    Evict,
    /// A clear walked in steps of `step` buckets (all at once if none).
    Clear {
        slot: u32,
        tiers: u8,
        step: Option<usize>,
    },
}

/// A slot's engine hash for a path, or a second name. Slots 0 and 1 agree on
/// hashes (so a block has one engine hash, its node's), slot 2 is seeded apart.
/// `narrow` folds the names into a few values, so that an engine names other
/// content (under another parent too) by a hash it used before.
fn name(slot: u32, path: &[u64], alias: bool, narrow: bool) -> u64 {
    let mut x = (slot / 2) as u64 * 31 + alias as u64 * 7;
    for &l in path {
        x = x.wrapping_mul(1_000_003).wrapping_add(l);
    }
    if narrow { x % 7 } else { x }
}

fn op() -> impl Strategy<Value = Op> {
    let locals = || proptest::collection::vec(1u64..3, 0..3);
    let tiers = prop_oneof![Just(0xffu8), 1u8..8];
    prop_oneof![
        6 => (0u32..3, 0u8..3, locals(), proptest::collection::vec(1u64..4, 1..4), proptest::bool::weighted(0.2))
            .prop_map(|(slot, tier, from, locals, alias)| Op::Store { slot, tier, from, locals, alias }),
        3 => (0u32..3, proptest::collection::vec(1u64..4, 1..3), proptest::bool::weighted(0.3), tiers.clone())
            .prop_map(|(slot, path, alias, tiers)| Op::Remove { slot, path, alias, tiers }),
        1 => (0u32..3, tiers, proptest::option::of(1usize..4))
            .prop_map(|(slot, tiers, step)| Op::Clear { slot, tiers, step }),
        2 => (0u32..3, proptest::collection::vec(1u64..4, 1..4), 1 as Tick..6)
            .prop_map(|(slot, path, ttl)| Op::Predict { slot, split: ttl as usize % 4, path, ttl }),
        1 => (1 as Tick..4).prop_map(|advance| Op::Expire { advance }),
        1 => Just(Op::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]
    #[test]
    fn prop_tree_vs_model(ops in proptest::collection::vec(op(), 1..60), export_step in 1usize..4, track: bool, narrow: bool) {
        let mut t = Tree::default();
        if track {
            t.track_use();
        }
        let mut m = Model::default();
        for op in &ops {
            apply(&mut t, &mut m, op, narrow)?;
            prop_assert_eq!(t.len(), m.nodes());
            prop_assert!(t.leaves_queued());
            prop_assert!(t.runs_hold());
            // A 4-byte name lives exactly as long as its hold: its key is read
            // from a node that a reuse would change.
            for (i, names) in t.engine.iter().enumerate() {
                for n in names.own.iter() {
                    prop_assert!(t.resolve(WorkerSlot(i as u32), n.0).is_some());
                }
            }
        }
        lookups_agree(&mut t, &m)?;
        dumps_agree(&t, &m, export_step)?;
        counts_agree(&t, &m)?;
    }
}

/// `op` on the tree and on the model alike (`narrow`: see [`name`]).
fn apply(t: &mut Tree, m: &mut Model, op: &Op, narrow: bool) -> Result<(), TestCaseError> {
    match op {
        Op::Store {
            slot,
            tier,
            from,
            locals,
            alias,
        } => {
            let parent = (!from.is_empty()).then(|| name(*slot, from, false, narrow));
            let mut path = from.clone();
            let blocks: Vec<(u64, u64)> = locals
                .iter()
                .map(|&l| {
                    path.push(l);
                    (name(*slot, &path, *alias, narrow), l)
                })
                .collect();
            let tier = Tier(*tier);
            m.store(*slot, tier, parent, &blocks);
            let blocks: Vec<_> = blocks.iter().map(|&(e, l)| (eh(e), BlockHash(l))).collect();
            t.store(WorkerSlot(*slot), tier, parent.map(eh), &blocks);
        }
        Op::Remove {
            slot,
            path,
            alias,
            tiers,
        } => {
            let e = name(*slot, path, *alias, narrow);
            m.remove(*slot, e, *tiers);
            t.remove(WorkerSlot(*slot), eh(e), TierSet(*tiers));
        }
        Op::Predict {
            slot,
            path,
            ttl,
            split,
        } => {
            let deadline = m.now + ttl;
            m.predict(*slot, path, deadline);
            let locals: Vec<BlockHash> = path.iter().map(|&l| BlockHash(l)).collect();
            let (first, rest) = locals.split_at((*split).min(locals.len()));
            let mut at = ChainAt::default();
            t.predict(WorkerSlot(*slot), first, deadline, &mut at);
            t.predict(WorkerSlot(*slot), rest, deadline, &mut at);
        }
        Op::Evict => {
            // Untracked, use tracking begins here, on a tree already filed.
            t.track_use();
            match t.next_victim() {
                // A victim is a leaf of the model's blocks (one nothing hangs
                // from), and one is found whenever a block is held.
                Some(id) => {
                    let path = t.path(id);
                    prop_assert!(m.holders.contains_key(&path));
                    prop_assert!(
                        !m.holders
                            .keys()
                            .any(|p| p.len() > path.len() && p.starts_with(&path))
                    );
                    m.evict(&path);
                    t.evict_node(id);
                }
                None => prop_assert!(m.holders.is_empty()),
            }
        }
        Op::Expire { advance } => {
            let now = m.now + advance;
            m.expire(now);
            t.expire(now, usize::MAX);
        }
        Op::Clear { slot, tiers, step } => {
            m.clear(*slot, *tiers);
            let (slot, tiers) = (WorkerSlot(*slot), TierSet(*tiers));
            match step {
                None => t.clear_slot(slot, tiers),
                Some(b) => {
                    let mut at = NamesAt::default();
                    while !t.clear_step(slot, tiers, &mut at, *b) {}
                }
            }
        }
    }
    Ok(())
}

/// Every path the model holds (and one it may not) looks up alike, by local and
/// by seq hashes.
fn lookups_agree(t: &mut Tree, m: &Model) -> Result<(), TestCaseError> {
    let mut paths: Vec<Vec<u64>> = m.holders.keys().cloned().collect();
    paths.push(vec![1, 2, 3, 1]);
    for p in &paths {
        let locals: Vec<BlockHash> = p.iter().map(|&l| BlockHash(l)).collect();
        let mut out = Vec::new();
        t.lookup(Prompt::Locals(&locals), &mut out);
        prop_assert_eq!(blocks_of(&out), m.lookup(p));
        let mut seqs = Vec::new();
        hash::seq_hashes_for_locals(&locals, &mut seqs);
        out.clear();
        t.lookup(Prompt::Seqs(&seqs), &mut out);
        prop_assert_eq!(blocks_of(&out), m.lookup(p));
    }
    Ok(())
}

/// A dump (whole, in steps of `export_step`, and of a replica) is the model's held
/// blocks, parents first.
fn dumps_agree(t: &Tree, m: &Model, export_step: usize) -> Result<(), TestCaseError> {
    let mut dumped = Vec::new();
    t.export(&mut dumped);
    // In steps, with nothing changing between them: the same blocks, parents
    // first.
    let mut stepped = Vec::new();
    let mut walk = ExportWalk::default();
    while !t.export_step(&mut walk, export_step, &mut stepped) {}
    let mut seen = BTreeSet::new();
    for d in &stepped {
        if let Some(p) = d.parent {
            prop_assert!(seen.contains(&p) || !stepped.iter().any(|x| x.seq == p));
        }
        seen.insert(d.seq);
    }
    prop_assert_eq!(stepped.len(), dumped.len());
    prop_assert_eq!(sorted(&stepped), sorted(&dumped));
    // A replica carries every block held on a medium (one below a block
    // nobody holds hangs from a root standing for that block), and no
    // prediction.
    let mut copied = Vec::new();
    replica(t).export(&mut copied);
    prop_assert_eq!(sorted(&copied), sorted(&dumped));
    let mut got: Vec<(u64, Option<u64>, u64, u32)> = dumped
        .iter()
        .map(|d| (d.seq.0, d.parent.map(|p| p.0), d.local.0, d.holder.0))
        .collect();
    got.sort();
    let mut want = Vec::new();
    for (path, hs) in &m.holders {
        let locals: Vec<BlockHash> = path.iter().map(|&l| BlockHash(l)).collect();
        let mut seqs = Vec::new();
        hash::seq_hashes_for_locals(&locals, &mut seqs);
        let parent = (seqs.len() > 1).then(|| seqs[seqs.len() - 2].0);
        for (&s, &tiers) in hs {
            let tiers = tiers & TierSet::MEDIA.0;
            if tiers != 0 {
                want.push((
                    seqs.last().unwrap().0,
                    parent,
                    *path.last().unwrap(),
                    Holder::new(WorkerSlot(s), TierSet(tiers)).0,
                ));
            }
        }
    }
    want.sort();
    prop_assert_eq!(got, want);
    Ok(())
}

/// The tree's per-slot and per-tier counts are the model's.
fn counts_agree(t: &Tree, m: &Model) -> Result<(), TestCaseError> {
    let mut per_slot = vec![0u32; 3];
    for hs in m.holders.values() {
        for &s in hs.keys() {
            per_slot[s as usize] += 1;
        }
    }
    let mut have = t.per_slot().to_vec();
    have.resize(3, 0);
    prop_assert_eq!(have, per_slot);
    let mut pairs = [0u64; Tier::COUNT];
    for hs in m.holders.values() {
        for &tiers in hs.values() {
            for tier in TierSet(tiers).iter() {
                pairs[tier.0 as usize] += 1;
            }
        }
    }
    prop_assert_eq!(t.tier_pairs(), &pairs);
    Ok(())
}
