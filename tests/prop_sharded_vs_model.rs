//! Property: the sharded index answers every query exactly like a plain
//! single-threaded model, for 1, 2 and 4 shards.
//!
//! The sharded side is kvix's real event path minus the sockets: msgpack
//! frames (vLLM positional encoding) → `wire::decode` → `WorkerFeed`
//! → SPSC rings → per-shard `Shard::apply`; queries go `hash` → `score::split`
//! → `shard::answer` per shard → `score::gather`. The model knows nothing of
//! hashes or shards: each worker holds a set of token prefixes with tiers, and a
//! set of predicted prefixes (`/speculate`'s ops, pushed on the same rings) that
//! score as the device until the worker stores them, clears, or they expire.
//!
//! A hybrid model's other KV-cache groups (sliding windows, the odd groups;
//! Mamba, the even ones; more than a holder word has lanes for) store and remove
//! blocks too, with vLLM's group fields; the model
//! keeps which prefixes each group holds while the worker holds them, and
//! applies vLLM's hit rules literally to say what each worker's `effective`
//! prefix is.
//!
//! Then a replica is seeded from the index's export (what `/dump` and snapshots
//! carry, group residency included) through the seeding path recovery takes, and
//! must answer every query as the index does once its predictions expired.

use kvix::hash;
use kvix::ingest::feed::{SeedBlock, SeedGroups, WorkerFeed};
use kvix::partition::Partition;
use kvix::recovery::export::IndexExport;
use kvix::registry::{Endpoint, Registration, Registry};
use kvix::ring::{OpSink, RingSink, Rings};
use kvix::score::{self, Overlap};
use kvix::shard::Shard;
use kvix::types::{IndexId, ShardId, Tier, WorkerSlot};
use kvix::wire::{self, Batch};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

const BS: usize = 2;
const INSTANCES: u64 = 3;
const MEDIA: [&str; 3] = ["GPU", "CPU", "SSD"];

#[derive(Clone, Debug)]
enum Action {
    Store {
        inst: u64,
        dp: Option<u32>,
        /// Index into the worker's known blocks; `None` for a first block, and a
        /// pick on an empty worker means an unknown parent.
        parent: Option<usize>,
        blocks: Vec<[u32; BS]>,
        medium: usize,
    },
    Remove {
        inst: u64,
        dp: Option<u32>,
        picks: Vec<usize>,
        medium: usize,
    },
    Clear {
        inst: u64,
        dp: Option<u32>,
    },
    /// A router predicts that the worker will hold this prompt's blocks.
    Predict {
        inst: u64,
        dp: Option<u32>,
        blocks: Vec<[u32; BS]>,
    },
    /// Time passes beyond every prediction's TTL.
    Expire,
    /// KV-cache groups `groups` (odd: sliding window, even: Mamba), one event
    /// each in this order, store (or remove) the last `depth` blocks of the chain
    /// of the worker's known block `pick` names, but those `skip` has a bit for (a
    /// sparse run, as vLLM sends).
    Group {
        inst: u64,
        dp: Option<u32>,
        groups: Vec<u32>,
        pick: usize,
        depth: usize,
        skip: u8,
        stored: bool,
    },
}

/// A worker's other KV-cache groups are 1..=GROUPS: more than a holder word has
/// lanes for, so that some keep their holds beside the tree.
const GROUPS: u32 = 6;

/// The sliding window, in tokens, of each instance's odd groups: 1, 2 and 3 blocks
/// of [`BS`] must be present (`ceil((W - 1) / BS)`).
const WINDOWS: [u32; INSTANCES as usize] = [3, 5, 7];

/// The groups of one group action, in the order they send: mostly one, as often
/// all of them (an engine stores a block in every group), in any order.
fn groups() -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        2 => (1..=GROUPS).prop_map(|g| vec![g]),
        1 => Just((1..=GROUPS).collect::<Vec<u32>>()).prop_shuffle(),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    let inst = 0..INSTANCES;
    let dp = prop::option::of(0u32..2);
    let block = prop::array::uniform2(0u32..3);
    prop_oneof![
        6 => (inst.clone(), dp.clone(), prop::option::weighted(0.7, 0usize..64),
              prop::collection::vec(block.clone(), 1..4), 0usize..3)
            .prop_map(|(inst, dp, parent, blocks, medium)| Action::Store { inst, dp, parent, blocks, medium }),
        2 => (inst.clone(), dp.clone(), prop::collection::vec(0usize..64, 1..4), 0usize..3)
            .prop_map(|(inst, dp, picks, medium)| Action::Remove { inst, dp, picks, medium }),
        1 => (inst.clone(), dp.clone()).prop_map(|(inst, dp)| Action::Clear { inst, dp }),
        2 => (inst, dp, prop::collection::vec(block, 1..4))
            .prop_map(|(inst, dp, blocks)| Action::Predict { inst, dp, blocks }),
        1 => Just(Action::Expire),
        8 => (0..INSTANCES, prop::option::of(0u32..2), groups(), 0usize..64, 1usize..6, any::<u8>(), prop::bool::weighted(0.7))
            .prop_map(|(inst, dp, groups, pick, depth, skip, stored)| {
                // Mostly dense runs; a quarter skip some blocks.
                let skip = if skip % 4 == 0 { skip } else { 0 };
                Action::Group { inst, dp, groups, pick, depth, skip, stored }
            }),
    ]
}

/// Engine block hash: a function of the worker and the block's whole prefix, as engines do.
fn engine_hash(inst: u64, prefix: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    (inst, prefix).hash(&mut h);
    h.finish()
}

/// A worker: (instance, dp rank).
type Worker = (u64, u32);

/// What one worker holds: engine hash → (token prefix, tier bits).
type Held = HashMap<u64, (Vec<u32>, u8)>;

/// The reference: per (instance, dp rank), what it holds.
#[derive(Default)]
struct Model {
    workers: HashMap<(u64, u32), Held>,
    /// Predicted prefixes per worker (never one the worker holds on any tier).
    predicted: HashMap<(u64, u32), HashSet<Vec<u32>>>,
    /// Per (worker, group), the prefixes the group holds (blocks the worker
    /// holds); a worker's groups once a store named them.
    groups: HashMap<(Worker, u32), HashSet<Vec<u32>>>,
}

impl Model {
    fn known(&self, w: (u64, u32)) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .workers
            .get(&w)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// A store of `blocks` by worker (`inst`, `dp`) on `medium`, under the known block
    /// `parent` picks (`None`: a first block; a pick on an empty worker: an unknown
    /// parent, so nothing is held). The parent's engine hash, the blocks' engine
    /// hashes and their tokens, as the engine publishes them.
    fn store(
        &mut self,
        inst: u64,
        dp: Option<u32>,
        parent: Option<usize>,
        blocks: &[[u32; BS]],
        medium: usize,
    ) -> (Option<u64>, Vec<u64>, Vec<u32>) {
        let w = (inst, dp.unwrap_or(0));
        let known = self.known(w);
        let (parent_hash, mut prefix) = match parent {
            None => (None, Some(Vec::new())),
            Some(_) if known.is_empty() => (Some(0xdead_beef), None),
            Some(p) => {
                let h = known[p % known.len()];
                (Some(h), Some(self.workers[&w][&h].0.clone()))
            }
        };
        let mut hashes = Vec::new();
        let mut tokens = Vec::new();
        let mut p = prefix.clone().unwrap_or_default();
        for blk in blocks {
            p.extend_from_slice(blk);
            tokens.extend_from_slice(blk);
            hashes.push(engine_hash(inst, &p));
        }
        if let Some(pre) = prefix.as_mut() {
            let m = self.workers.entry(w).or_default();
            let predicted = self.predicted.entry(w).or_default();
            for (i, blk) in blocks.iter().enumerate() {
                pre.extend_from_slice(blk);
                let e = m.entry(hashes[i]).or_insert((pre.clone(), 0));
                e.1 |= 1 << tier_of(medium);
                // The store confirms a prediction: an ordinary block now.
                predicted.remove(pre.as_slice());
            }
        }
        (parent_hash, hashes, tokens)
    }

    /// A removal by worker (`inst`, `dp`) from `medium` of its known blocks `picks`
    /// names (a pick past them names a block it never stored): their engine hashes.
    fn remove(&mut self, inst: u64, dp: Option<u32>, picks: &[usize], medium: usize) -> Vec<u64> {
        let w = (inst, dp.unwrap_or(0));
        let known = self.known(w);
        let hashes: Vec<u64> = picks
            .iter()
            .map(|p| known.get(*p % (known.len() + 1)).copied().unwrap_or(77))
            .collect();
        if let Some(m) = self.workers.get_mut(&w) {
            for h in &hashes {
                if let Some(e) = m.get_mut(h) {
                    e.1 &= !(1 << tier_of(medium));
                    if e.1 == 0 {
                        m.remove(h);
                    }
                }
            }
        }
        self.forget_groups();
        hashes
    }

    /// Group `group` of worker (`inst`, `dp`) stores or removes blocks of the
    /// chain of its known block `pick` names (see [`Action::Group`]; a pick past
    /// them: a block it does not hold). Their hashes, parents first.
    fn group(
        &mut self,
        inst: u64,
        dp: Option<u32>,
        group: u32,
        a: (usize, usize, u8),
        stored: bool,
    ) -> Vec<u64> {
        let (pick, depth, skip) = a;
        let w = (inst, dp.unwrap_or(0));
        let known = self.known(w);
        let prefix = match known.get(pick % (known.len() + 1)) {
            Some(h) => self.workers[&w][h].0.clone(),
            None => vec![7; BS],
        };
        let blocks = prefix.len() / BS;
        let hashes: Vec<u64> = (blocks.saturating_sub(depth)..blocks)
            .filter(|b| skip & (1 << (b % 8)) == 0)
            .map(|b| engine_hash(inst, &prefix[..(b + 1) * BS]))
            .collect();
        // A store describes the group, even of blocks it cannot keep; a removal
        // of a group no store described is dropped.
        if stored {
            self.groups.entry((w, group)).or_default();
        }
        let Some(held) = self.groups.get_mut(&(w, group)) else {
            return hashes;
        };
        for h in &hashes {
            let Some((prefix, _)) = self.workers.get(&w).and_then(|m| m.get(h)) else {
                continue;
            };
            if stored {
                held.insert(prefix.clone());
            } else {
                held.remove(prefix);
            }
        }
        hashes
    }

    /// A group's holds end with the worker's hold of the block.
    fn forget_groups(&mut self) {
        for ((w, _), held) in self.groups.iter_mut() {
            let m = self.workers.get(w);
            held.retain(|p| m.is_some_and(|m| m.values().any(|(q, _)| q == p)));
        }
    }

    /// vLLM's hit for worker `w` and prompt `q`, in blocks, its rules written as
    /// `find_longest_cache_hit` loops them; `None` for a worker without other groups.
    fn effective(&self, w: (u64, u32), q: &[u32]) -> Option<u32> {
        let groups: Vec<u32> = (1..=GROUPS)
            .filter(|g| self.groups.contains_key(&(w, *g)))
            .collect();
        if groups.is_empty() {
            return None;
        }
        // A predicted block stands for every group's: the worker will compute them.
        let has = |g: u32, b: usize| {
            let p = q.get(..(b + 1) * BS);
            p.is_some_and(|p| {
                self.groups[&(w, g)].contains(p)
                    || self.predicted.get(&w).is_some_and(|s| s.contains(p))
            })
        };
        let mut hit = self.matched(w, q)[0] as usize;
        loop {
            let mut cur = hit;
            for &g in &groups {
                let max = cur;
                cur = if g % 2 == 1 {
                    let need = (WINDOWS[w.0 as usize] as usize - 1).div_ceil(BS);
                    let mut run = 0;
                    let mut found = None;
                    for i in (0..max).rev() {
                        if has(g, i) {
                            run += 1;
                            if run >= need {
                                found = Some(i + run);
                                break;
                            }
                        } else {
                            run = 0;
                        }
                    }
                    found.unwrap_or(run)
                } else {
                    (0..max).rev().find(|&i| has(g, i)).map_or(0, |i| i + 1)
                };
            }
            if cur >= hit {
                return Some(hit as u32);
            }
            hit = cur;
        }
    }

    /// Matched blocks per tier set (device; device+host; any) for one worker.
    fn matched(&self, w: (u64, u32), q: &[u32]) -> [u32; 3] {
        let held = self.workers.get(&w);
        let mut out = [0u32; 3];
        for (k, set) in score::TIER_SETS.iter().enumerate() {
            for depth in 1..=q.len() / BS {
                let prefix = &q[..depth * BS];
                let hit = held.is_some_and(|m| {
                    m.values()
                        .any(|(p, tiers)| p == prefix && (*tiers & set.0) != 0)
                }) || (set.contains(Tier::DEVICE)
                    && self.predicted.get(&w).is_some_and(|p| p.contains(prefix)));
                if !hit {
                    break;
                }
                out[k] = depth as u32;
            }
        }
        out
    }
}

struct Sharded {
    registry: Registry,
    index: IndexId,
    feeds: Vec<WorkerFeed>,
    rings: std::sync::Arc<Rings>,
    sink: RingSink,
    shards: Vec<Shard>,
    partition: Partition,
    batch: Batch,
    /// The shards' clock, in prediction ticks.
    now: u32,
}

impl Sharded {
    fn new(partition: Partition) -> Self {
        let registry = Registry::default();
        let mut index = IndexId(0);
        for inst in 0..INSTANCES {
            let ix = registry
                .register(&Registration {
                    model: "m".into(),
                    tenant: "default".into(),
                    block_size: BS as u32,
                    instance: inst.into(),
                    dp: 0,
                    endpoint: Endpoint {
                        endpoint: format!("tcp://127.0.0.1:{}", 1000 + inst),
                        replay_endpoint: None,
                        publisher: None,
                    },
                    opts: Default::default(),
                })
                .unwrap()
                .index;
            index = ix;
        }
        let rings = Rings::partitioned(1, partition, 1 << 16);
        Sharded {
            feeds: (0..INSTANCES)
                .map(|i| WorkerFeed::new(index, i.into(), 0, BS as u32))
                .collect(),
            sink: RingSink::new(rings.clone(), 0),
            rings,
            registry,
            index,
            partition,
            shards: (0..partition.shards())
                .map(|_| {
                    let mut s = Shard::default();
                    // Clears walk a few buckets per drain, so queries and later ops
                    // meet them partway.
                    s.set_clear_step_buckets(3);
                    s
                })
                .collect(),
            batch: Batch::default(),
            now: 0,
        }
    }

    fn drain(&mut self) {
        self.sink.flush();
        for (i, shard) in self.shards.iter_mut().enumerate() {
            self.rings
                .drain(ShardId(i), usize::MAX, |ops| shard.apply_staged(ops));
            // As the drain loop does: one step of a slot's clear per pass, and
            // the steps that evict what it stored past the block budget.
            shard.step_clears();
            while shard.step_budget() {}
        }
    }

    /// What `/speculate` does: once the rings are applied (the service's request
    /// comes after the events it has seen), the prompt's blocks are predicted on
    /// the slot's shard.
    fn predict(&mut self, inst: u64, dp: u32, tokens: &[u32]) {
        self.drain();
        let slot = self.registry.slot_for(self.index, inst.into(), dp).unwrap();
        let seed = hash::block_seed(None, None);
        let locals: Vec<_> = tokens
            .chunks_exact(BS)
            .map(|c| hash::local_hash(c, seed))
            .collect();
        let owner = self.partition.shard_of(self.index, slot);
        self.shards[owner.0].predict(self.index, slot, &locals, self.now + 1000);
    }

    fn expire(&mut self) {
        self.now += 2000;
        for s in &mut self.shards {
            s.expire(self.now);
        }
    }

    fn publish(&mut self, inst: u64, payload: &[u8]) {
        wire::decode(payload, &mut self.batch).expect("test frames are valid");
        self.feeds[inst as usize].apply(&self.batch, payload, &self.registry, &mut self.sink);
        self.drain();
    }

    /// A replica seeded from this index's export as recovery seeds one (a peer's
    /// `/dump`, a snapshot): every worker's blocks parents first, its other
    /// KV-cache groups and the group bits of each block.
    fn replica(&mut self) -> Sharded {
        let (mut blocks, mut names, mut groups) = (Vec::new(), Vec::new(), Vec::new());
        for s in &mut self.shards {
            s.finish_deferred();
            let mut at = kvix::shard::ExportAt::default();
            while !s.export_step(self.index, &mut at, &mut blocks, &mut names) {}
            s.group_specs(self.index, &mut groups);
        }
        let info = self.registry.snapshot().indexes[self.index.0 as usize].clone();
        let export = IndexExport::new(info, blocks, names).with_groups(groups);
        let mut workers: BTreeMap<(u64, u32), (Vec<SeedBlock>, SeedGroups)> = BTreeMap::new();
        let mut tiers = Vec::new();
        for k in 0..export.len() {
            tiers.clear();
            let (_, inst, dp) = export.pair(k, &mut tiers);
            let w = workers.entry((u64::try_from(inst).unwrap(), dp));
            w.or_default().0.extend_from_slice(&tiers);
        }
        for (inst, dp, g) in export.slot_groups() {
            workers
                .entry((u64::try_from(inst).unwrap(), dp))
                .or_default()
                .1 = g;
        }
        let mut r = Sharded::new(self.partition);
        for ((inst, dp), (blocks, groups)) in &workers {
            let feed = &mut r.feeds[*inst as usize];
            assert!(feed.seed(
                r.index,
                *dp,
                (blocks, groups),
                false,
                &r.registry,
                &mut r.sink
            ));
        }
        r.drain();
        r
    }

    /// Answers as the model does once every op has applied: ops that wait for a
    /// clear still walking apply first (the walks themselves stay partway, and
    /// their slots are answered as if cleared).
    fn query(&mut self, tokens: &[u32]) -> (Overlap, HashMap<WorkerSlot, (u64, u32)>) {
        for s in &mut self.shards {
            s.finish_deferred();
            // What the ops that waited stored past the budget goes by the drain
            // loop's next steps.
            while s.step_budget() {}
        }
        let seed = hash::block_seed(None, None);
        let locals: Vec<_> = tokens
            .chunks_exact(BS)
            .map(|c| hash::local_hash(c, seed))
            .collect();
        let prompt = kvix::shard::Prompt::Locals(&locals);
        let replies: Vec<_> = self
            .shards
            .iter_mut()
            .map(|shard| kvix::shard::answer(shard, self.index, prompt))
            .collect();
        let snap = self.registry.snapshot();
        let ix = &snap.indexes[self.index.0 as usize];
        let ov = score::gather(&score::merge(replies), ix.slots.len(), |_| true);
        let who = ix
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    WorkerSlot(i as u32),
                    (u64::try_from(s.instance).unwrap(), s.dp),
                )
            })
            .collect();
        (ov, who)
    }
}

/// Encode one vLLM positional batch `[ts, [event], dp_rank?]` with rmp.
fn frame(dp: Option<u32>, event: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_array_len(&mut b, if dp.is_some() { 3 } else { 2 }).unwrap();
    rmp::encode::write_f64(&mut b, 1.5).unwrap();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    event(&mut b);
    if let Some(d) = dp {
        rmp::encode::write_uint(&mut b, d as u64).unwrap();
    }
    b
}

/// With `budget`, the shards together hold at most that many blocks
/// (`--max-blocks`): they may then have evicted what the model holds, so every
/// answer is at most the model's instead of equal to it.
fn run(
    partition: Partition,
    budget: Option<usize>,
    actions: &[Action],
    queries: &[(usize, usize, Vec<u32>)],
) {
    let mut model = Model::default();
    let mut sharded = Sharded::new(partition);
    let shared = budget.map(kvix::shard::BlockBudget::new);
    for shard in &mut sharded.shards {
        shard.set_block_budget(shared.clone());
    }
    for a in actions {
        apply(&mut model, &mut sharded, a);
    }
    // Queries: prefixes some worker holds, cut and extended, plus free-form tokens.
    let mut prefixes: Vec<Vec<u32>> = model
        .workers
        .values()
        .flat_map(|m| m.values().map(|(p, _)| p.clone()))
        .chain(model.predicted.values().flatten().cloned())
        .collect();
    prefixes.sort();
    let mut asked = Vec::new();
    for (pick, cut, tail) in queries {
        let mut q = match prefixes.len() {
            0 => Vec::new(),
            n => prefixes[pick % n].clone(),
        };
        q.truncate(q.len().saturating_sub(BS * (cut % 2)));
        q.extend_from_slice(tail);
        check_query(&model, &mut sharded, budget, &q);
        asked.push(q);
    }
    sharded.expire();
    let mut replica = sharded.replica();
    for q in &asked {
        check_replica(&mut sharded, &mut replica, q);
    }
}

/// The replica answers `q` as the index it was seeded from: every worker's
/// matches per tier and its `effective` prefix (a worker the replica has no slot
/// for held nothing).
fn check_replica(sharded: &mut Sharded, replica: &mut Sharded, q: &[u32]) {
    let n = sharded.shards.len();
    let (ov, who) = sharded.query(q);
    let (rov, rwho) = replica.query(q);
    let at: HashMap<(u64, u32), WorkerSlot> = rwho.iter().map(|(s, w)| (*w, *s)).collect();
    for (slot, w) in &who {
        let (matched, effective) = match at.get(w) {
            Some(r) => (rov.matched[r.0 as usize], rov.effective[r.0 as usize]),
            None => ([0; 3], 0),
        };
        assert_eq!(
            (matched, effective),
            (ov.matched[slot.0 as usize], ov.effective[slot.0 as usize]),
            "replica, shards={n} worker={w:?} query={q:?}"
        );
    }
}

/// `a` on the model and, as engine frames or a prediction, on the shards.
fn apply(model: &mut Model, sharded: &mut Sharded, a: &Action) {
    match a {
        Action::Store {
            inst,
            dp,
            parent,
            blocks,
            medium,
        } => {
            let (parent_hash, hashes, tokens) = model.store(*inst, *dp, *parent, blocks, *medium);
            let payload = frame(*dp, |b| {
                stored_event(b, &hashes, parent_hash, &tokens, MEDIA[*medium])
            });
            sharded.publish(*inst, &payload);
        }
        Action::Remove {
            inst,
            dp,
            picks,
            medium,
        } => {
            let hashes = model.remove(*inst, *dp, picks, *medium);
            let payload = frame(*dp, |b| {
                rmp::encode::write_array_len(b, 3).unwrap();
                rmp::encode::write_str(b, "BlockRemoved").unwrap();
                write_uints(b, &hashes);
                rmp::encode::write_str(b, MEDIA[*medium]).unwrap();
            });
            sharded.publish(*inst, &payload);
        }
        Action::Predict { inst, dp, blocks } => {
            let w = (*inst, dp.unwrap_or(0));
            let tokens: Vec<u32> = blocks.iter().flatten().copied().collect();
            let held = model.workers.get(&w);
            let predicted = model.predicted.entry(w).or_default();
            for depth in 1..=blocks.len() {
                let p = &tokens[..depth * BS];
                // A block the worker already holds (any tier) is not predicted.
                if !held.is_some_and(|m| m.values().any(|(q, _)| q == p)) {
                    predicted.insert(p.to_vec());
                }
            }
            sharded.predict(*inst, w.1, &tokens);
        }
        Action::Expire => {
            model.predicted.clear();
            sharded.expire();
        }
        Action::Group {
            inst,
            dp,
            groups,
            pick,
            depth,
            skip,
            stored,
        } => {
            for &group in groups {
                let hashes = model.group(*inst, *dp, group, (*pick, *depth, *skip), *stored);
                let payload = frame(*dp, |b| group_event(b, *inst, group, &hashes, *stored));
                sharded.publish(*inst, &payload);
            }
        }
        Action::Clear { inst, dp } => {
            model.workers.remove(&(*inst, dp.unwrap_or(0)));
            model.predicted.remove(&(*inst, dp.unwrap_or(0)));
            model.forget_groups();
            let payload = frame(*dp, |b| {
                rmp::encode::write_array_len(b, 1).unwrap();
                rmp::encode::write_str(b, "AllBlocksCleared").unwrap();
            });
            sharded.publish(*inst, &payload);
        }
    }
}

/// A positional vLLM `BlockStored` of `hashes` (block size [`BS`]).
fn stored_event(
    b: &mut Vec<u8>,
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    medium: &str,
) {
    rmp::encode::write_array_len(b, 7).unwrap();
    rmp::encode::write_str(b, "BlockStored").unwrap();
    write_uints(b, hashes);
    match parent {
        Some(h) => rmp::encode::write_uint(b, h).map(|_| ()).unwrap(),
        None => rmp::encode::write_nil(b).unwrap(),
    }
    let tokens: Vec<u64> = tokens.iter().map(|&t| t as u64).collect();
    write_uints(b, &tokens);
    rmp::encode::write_uint(b, BS as u64).unwrap();
    rmp::encode::write_nil(b).unwrap();
    rmp::encode::write_str(b, medium).unwrap();
}

/// A group's event as current vLLM writes it (a tagged map): a store names
/// its group's kind (and window), a removal its group alone. The tokens span
/// the named blocks (vLLM's span whole runs; kvix goes by the hashes).
fn group_event(b: &mut Vec<u8>, inst: u64, group: u32, hashes: &[u64], stored: bool) {
    let s = |b: &mut Vec<u8>, v: &str| rmp::encode::write_str(b, v).unwrap();
    if !stored {
        rmp::encode::write_map_len(b, 3).unwrap();
        s(b, "type");
        s(b, "BlockRemoved");
        s(b, "block_hashes");
        write_uints(b, hashes);
        s(b, "group_idx");
        rmp::encode::write_uint(b, group as u64).unwrap();
        return;
    }
    rmp::encode::write_map_len(b, if group % 2 == 1 { 8 } else { 7 }).unwrap();
    s(b, "type");
    s(b, "BlockStored");
    s(b, "block_hashes");
    write_uints(b, hashes);
    s(b, "parent_block_hash");
    rmp::encode::write_nil(b).unwrap();
    s(b, "token_ids");
    write_uints(b, &vec![0; hashes.len() * BS]);
    s(b, "block_size");
    rmp::encode::write_uint(b, BS as u64).unwrap();
    s(b, "group_idx");
    rmp::encode::write_uint(b, group as u64).unwrap();
    s(b, "kv_cache_spec_kind");
    s(
        b,
        if group % 2 == 1 {
            "sliding_window"
        } else {
            "mamba"
        },
    );
    if group % 2 == 1 {
        s(b, "kv_cache_spec_sliding_window");
        rmp::encode::write_uint(b, WINDOWS[inst as usize] as u64).unwrap();
    }
}

/// A msgpack array of unsigned integers.
fn write_uints(b: &mut Vec<u8>, values: &[u64]) {
    rmp::encode::write_array_len(b, values.len() as u32).unwrap();
    for v in values {
        rmp::encode::write_uint(b, *v).unwrap();
    }
}

/// The shards' answer to `q` is the model's for every worker (at most the model's
/// under a `budget`), and the shards stay within the budget.
fn check_query(model: &Model, sharded: &mut Sharded, budget: Option<usize>, q: &[u32]) {
    let n = sharded.shards.len();
    let (ov, who) = sharded.query(q);
    let mut want_freq = Vec::new();
    for depth in 0..q.len() / BS {
        let c = who
            .values()
            .filter(|w| model.matched(**w, q)[0] as usize > depth)
            .count() as u32;
        if c == 0 {
            break;
        }
        want_freq.push(c);
    }
    for (slot, w) in &who {
        let want = model.matched(*w, q);
        let got = ov.matched[slot.0 as usize];
        let size = (model.workers.get(w).map_or(0, |m| m.len())
            + model.predicted.get(w).map_or(0, |p| p.len())) as u32;
        let got_size = ov.tree_sizes[slot.0 as usize];
        if budget.is_none() {
            assert_eq!(got, want, "shards={n} worker={w:?} query={q:?}");
            assert_eq!(got_size, size, "tree size, shards={n} worker={w:?}");
            let effective = model.effective(*w, q).unwrap_or(want[0]);
            assert_eq!(
                ov.effective[slot.0 as usize], effective,
                "effective, shards={n} worker={w:?} query={q:?}"
            );
        } else {
            for (g, m) in got.iter().zip(want) {
                assert!(*g <= m, "bounded: shards={n} worker={w:?} query={q:?}");
            }
            assert!(
                got_size <= size,
                "bounded tree size, shards={n} worker={w:?}"
            );
        }
    }
    if budget.is_none() {
        assert_eq!(ov.frequencies, want_freq, "shards={n} query={q:?}");
    }
    if let Some(b) = budget {
        for shard in &sharded.shards {
            assert!(shard.tier_counts().0 <= b as u64, "over the budget");
        }
    }
}

fn tier_of(medium: usize) -> u8 {
    medium as u8 // GPU → device 0, CPU → host 1, SSD → disk 2
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sharded_index_matches_model(
        actions in prop::collection::vec(action(), 1..60),
        queries in prop::collection::vec(
            (0usize..1000, 0usize..2, prop::collection::vec(0u32..3, 0..6)), 1..8),
    ) {
        // Every shard in turn, and an index on fewer shards than there are.
        for (n, span) in [(1, 1), (2, 2), (4, 4), (2, 1), (4, 2)] {
            run(Partition::new(n, span), None, &actions, &queries);
        }
        // Eviction forgets that a worker holds a block, so a later prediction of it
        // counts where the model (which never forgets) would not predict it: the
        // bounded run leaves predictions out.
        let stored_only: Vec<Action> = actions
            .iter()
            .filter(|a| !matches!(a, Action::Predict { .. }))
            .cloned()
            .collect();
        run(Partition::spread_over(2), Some(5), &stored_only, &queries);
    }
}
