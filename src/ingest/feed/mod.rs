//! One listener's event feed: events → shard ops.
//!
//! Owns, per listener, the (index, dp rank) → worker slot it writes to and the
//! hashing of each stored block's tokens into its local hash. Ops name blocks as
//! the engine does (its block hashes, `parent_block_hash`); the shard owning the
//! slot resolves them through the slot's engine-hash map, so a store whose parent
//! is unknown is counted and skipped there, never guessed. Events that carry
//! standardized rolling hashes (Mooncake RFC #1527 `seq_hashes`) and no tokens
//! are indexed by those hashes directly. Must never touch shard memory: it only
//! emits ops.
//!
//! `stats.rs` counts; `groups.rs` is the KV-cache groups other than full
//! attention; `seed.rs` seeds a feed from a dump or snapshot.

mod groups;
mod seed;
mod stats;

pub use seed::{SeedBlock, SeedGroups};
pub use stats::FeedStats;

use crate::hash;
use crate::registry::{ListenerOpts, Registry, RegistryError};
use crate::ring::OpSink;
use crate::shard::ShardOp;
use crate::shard::hybrid::GroupSpec;
use crate::types::{BlockHash, DpRank, IndexId, InstanceId, SeqHash, Tier, TierSet, WorkerSlot};
use crate::wire::{Batch, Dialect, Event, EventOp, GroupKind, HashKind};
use std::sync::Arc;

struct SlotFeed {
    index: IndexId,
    dp: DpRank,
    slot: WorkerSlot,
    /// The rank's KV-cache groups other than full attention, as their stores
    /// described them (the shard was told each): (group_idx, spec). Usually empty.
    groups: Vec<(u32, GroupSpec)>,
    /// Groups other than 0 whose stores said full attention: their removals are
    /// the index's (vLLM's hit needs every group of a kind to hold a block).
    full_groups: Vec<u32>,
}

/// The feed of one registered listener (instance, registered dp rank).
pub struct WorkerFeed {
    /// The index the listener was registered into (its model and tenant).
    pub index: IndexId,
    pub instance: InstanceId,
    pub dp: DpRank,
    block_size: usize,
    opts: ListenerOpts,
    slots: Vec<SlotFeed>,
    /// Tenants named by events (`tenant_id`) other than the registered one.
    tenants: Vec<(String, IndexId)>,
    /// (model, tenant) of `index`, read from the registry when first needed.
    home: Option<(String, String)>,
    /// Scratch for multimodal block hashing (reused: no allocation per block).
    mm_sorted: Vec<u64>,
    mm_bytes: Vec<u8>,
    /// A stored event's local hashes (scratch).
    locals: Vec<BlockHash>,
    pub stats: Arc<FeedStats>,
}

/// Tier bits of a Mooncake Store object from its replica types; the store is a
/// host pool, so untyped replicas are host memory.
fn replica_tiers(ev: &Event<'_>, registry: &Registry) -> TierSet {
    let mut bits = TierSet::NONE;
    for r in ev.replicas.iter() {
        bits |= registry.tier_for(Some(r.kind.unwrap_or("memory"))).bit();
    }
    if bits.is_empty() {
        Tier::HOST.bit()
    } else {
        bits
    }
}

impl WorkerFeed {
    pub fn new(index: IndexId, instance: InstanceId, dp: DpRank, block_size: u32) -> Self {
        Self::with_opts(index, instance, dp, block_size, ListenerOpts::default())
    }

    /// Frees scratch vectors grown past `keep_bytes` each by a large event.
    pub fn trim_scratch(&mut self, keep_bytes: usize) {
        use crate::heap::trim;
        trim(&mut self.mm_sorted, keep_bytes);
        trim(&mut self.mm_bytes, keep_bytes);
        trim(&mut self.locals, keep_bytes);
    }

    pub fn with_opts(
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
        block_size: u32,
        opts: ListenerOpts,
    ) -> Self {
        WorkerFeed {
            index,
            instance,
            dp,
            block_size: block_size as usize,
            opts,
            slots: Vec::new(),
            tenants: Vec::new(),
            home: None,
            mm_sorted: Vec::new(),
            mm_bytes: Vec::new(),
            locals: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// Slots this feed has written to (for clearing them on unregister).
    pub fn slots(&self) -> impl Iterator<Item = (IndexId, DpRank, WorkerSlot)> + '_ {
        self.slots.iter().map(|s| (s.index, s.dp, s.slot))
    }

    /// The index for an event's `tenant_id`: the registered one unless the event names another.
    fn index_for(&mut self, tenant: Option<&str>, registry: &Registry) -> Option<IndexId> {
        let Some(t) = tenant.filter(|t| !t.is_empty()) else {
            return Some(self.index);
        };
        if self.home.is_none() {
            let snap = registry.snapshot();
            let ix = snap.indexes.get(self.index.0 as usize)?;
            self.home = Some((ix.model.clone(), ix.tenant.clone()));
        }
        let (model, home_tenant) = self.home.as_ref()?;
        if t == home_tenant {
            return Some(self.index);
        }
        if let Some((_, id)) = self.tenants.iter().find(|(name, _)| name == t) {
            return Some(*id);
        }
        match registry.ensure_event_index(model, t, self.block_size as u32) {
            Ok(id) => {
                self.tenants.push((t.to_string(), id));
                Some(id)
            }
            // Counted and logged once per interval by the registry.
            Err(RegistryError::EventLimit { .. }) => None,
            Err(e) => {
                crate::warn_throttled!(
                    instance = self.instance,
                    tenant = t,
                    "cannot index tenant: {e}"
                );
                None
            }
        }
    }

    fn slot_feed(&mut self, index: IndexId, dp: DpRank, registry: &Registry) -> Option<usize> {
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| s.index == index && s.dp == dp)
        {
            return Some(i);
        }
        let slot = match registry.slot_for(index, self.instance, dp) {
            Ok(s) => s,
            Err(RegistryError::EventLimit { .. }) => return None,
            Err(e) => {
                crate::warn_throttled!(
                    instance = self.instance,
                    dp,
                    "cannot intern worker slot: {e}"
                );
                return None;
            }
        };
        self.slots.push(SlotFeed {
            index,
            dp,
            slot,
            groups: Vec::new(),
            full_groups: Vec::new(),
        });
        Some(self.slots.len() - 1)
    }

    /// Forget what this feed wrote to `index` (for `dp`, or every rank) without
    /// emitting ops; returns the slots for the caller to clear in the shards.
    pub fn forget(&mut self, index: IndexId, dp: Option<DpRank>) -> Vec<(IndexId, WorkerSlot)> {
        let mut gone = Vec::new();
        self.slots.retain(|s| {
            let hit = s.index == index && dp.is_none_or(|d| d == s.dp);
            if hit {
                gone.push((s.index, s.slot));
            }
            !hit
        });
        gone
    }

    /// Forget everything (the listener stops); returns every slot it fed.
    pub fn forget_all(&mut self) -> Vec<(IndexId, WorkerSlot)> {
        self.slots.drain(..).map(|s| (s.index, s.slot)).collect()
    }

    /// Apply one decoded batch: every event becomes shard ops on `sink`.
    pub fn apply(
        &mut self,
        batch: &Batch,
        payload: &[u8],
        registry: &Registry,
        sink: &mut impl OpSink,
    ) {
        let stats = self.stats.clone();
        FeedStats::bump(&stats.batches, 1);
        FeedStats::bump(&stats.events, batch.events.len() as u64);
        FeedStats::bump(&stats.ignored_events, batch.ignored as u64);
        // Full attention first: a step's other groups name the blocks its
        // full-attention stores file, whichever group vLLM numbered first.
        let mut grouped = false;
        for ev in batch.events(payload) {
            if ev.op == EventOp::Updated {
                // A replica list changed; which blocks an object holds did not.
                FeedStats::bump(&stats.ignored_events, 1);
                continue;
            }
            let Some(i) = self.slot_of(&ev, batch, registry) else {
                continue;
            };
            // A store is counted where it goes to the shard (past its checks).
            let kind = match ev.op {
                EventOp::Removed => Some(&stats.removed_events),
                EventOp::Cleared => Some(&stats.cleared_events),
                EventOp::Stored | EventOp::Updated => None,
            };
            if let Some(kind) = kind {
                FeedStats::bump(kind, 1);
            }
            if let (EventOp::Stored, GroupKind::Full, Some(g @ 1..)) =
                (ev.op, ev.group_kind, ev.group_idx)
                && !self.slots[i].full_groups.contains(&g)
            {
                self.slots[i].full_groups.push(g);
            }
            match (ev.op, self.group_of(i, &ev)) {
                (EventOp::Stored, Some(g)) => {
                    grouped = true;
                    self.learn_group(i, g, &ev, sink);
                }
                (_, Some(_)) => grouped = true,
                (EventOp::Stored, None) => self.store(i, &ev, registry, sink),
                (EventOp::Removed, None) => self.remove(i, &ev, registry, sink),
                (EventOp::Cleared, None) => self.clear(i, &ev, registry, sink),
                (EventOp::Updated, None) => {}
            }
        }
        if grouped {
            for ev in batch.events(payload) {
                let Some(i) = self.slot_of(&ev, batch, registry) else {
                    continue;
                };
                if let Some(g) = self.group_of(i, &ev) {
                    self.group_event(i, g, &ev, sink);
                }
            }
        }
    }

    /// The slot feed an event goes to.
    fn slot_of(&mut self, ev: &Event<'_>, batch: &Batch, registry: &Registry) -> Option<usize> {
        if ev.op == EventOp::Updated {
            return None;
        }
        let dp = ev.dp_rank.or(batch.dp_rank).unwrap_or(self.dp);
        let index = self.index_for(ev.tenant_id, registry)?;
        self.slot_feed(index, dp, registry)
    }

    /// Tier bits an event applies to.
    fn tiers_of(ev: &Event<'_>, registry: &Registry) -> TierSet {
        match (ev.medium, ev.dialect) {
            (None, Dialect::MooncakeLegacy) => replica_tiers(ev, registry),
            (m, _) => registry.tier_for(m).bit(),
        }
    }

    fn store(&mut self, i: usize, ev: &Event<'_>, registry: &Registry, sink: &mut impl OpSink) {
        let (instance, block_size) = (self.instance, self.block_size);
        let stats = self.stats.clone();
        if ev.hashes.is_empty() {
            // An opaque Mooncake object key: no block identity to index.
            FeedStats::bump(&stats.ignored_events, 1);
            return;
        }
        // Blocks of another size hash differently: indexed, they could never match a
        // query, even when the token count happens to fit (or there are no tokens).
        if let Some(declared) = ev.block_size
            && declared as usize != block_size
        {
            FeedStats::bump(&stats.block_size_mismatch, 1);
            crate::warn_throttled!(
                instance,
                declared,
                block_size,
                "stored event declares another block size than the registration; skipped"
            );
            return;
        }
        let tiers = Self::tiers_of(ev, registry);
        let lora = ev
            .lora_name
            .filter(|n| !n.is_empty())
            .map(std::borrow::Cow::Borrowed)
            .or_else(|| lora_from_id(ev.lora_id).map(std::borrow::Cow::Owned));
        let lora = lora.or_else(|| {
            self.opts
                .lora_name
                .as_deref()
                .map(std::borrow::Cow::Borrowed)
        });
        let salt = ev
            .cache_salt
            .or(ev.additional_salt)
            .filter(|s| !s.is_empty())
            .or(self.opts.salt.as_deref());
        let (mm_sorted, mm_bytes) = (&mut self.mm_sorted, &mut self.mm_bytes);
        let sf = &self.slots[i];
        let (index, slot, dp) = (sf.index, sf.slot, sf.dp);
        if ev.tokens.is_empty() && ev.hash_kind == HashKind::Seq {
            // Standardized rolling hashes are kvix sequence hashes already.
            for tier in tiers.iter() {
                let parent = ev.parent.map(|p| SeqHash(p.0));
                let seqs = ev.hashes.iter().map(|h| SeqHash(h.0));
                for op in ShardOp::keyed_chain(index, slot, tier, parent, seqs) {
                    sink.push(op);
                }
            }
            FeedStats::bump(&stats.blocks_stored, ev.hashes.len() as u64);
            FeedStats::bump(&stats.stored_events, 1);
            return;
        }
        if ev.tokens.len() != ev.hashes.len() * block_size {
            FeedStats::bump(&stats.block_size_mismatch, 1);
            crate::warn_throttled!(
                instance,
                dp,
                tokens = ev.tokens.len(),
                blocks = ev.hashes.len(),
                block_size,
                "stored event does not match the indexer's block size; skipped"
            );
            return;
        }
        let seed = hash::block_seed(lora.as_deref(), salt);
        let mut mm = ev.mm;
        let locals = &mut self.locals;
        locals.clear();
        for (b, chunk) in ev.tokens.chunks_exact(block_size).enumerate() {
            mm_sorted.clear();
            while let Some(&(blk, h)) = mm.first()
                && blk as usize <= b
            {
                if blk as usize == b {
                    mm_sorted.push(h);
                }
                mm = &mm[1..];
            }
            mm_sorted.sort_unstable();
            locals.push(hash::local_hash_mm(chunk, mm_sorted, seed, mm_bytes));
        }
        // A tier at a time: each tier's blocks are one run for the shard.
        for tier in tiers.iter() {
            let mut parent = ev.parent;
            for (k, (&block, &local)) in ev.hashes.iter().zip(locals.iter()).enumerate() {
                sink.push(ShardOp::Store {
                    index,
                    slot,
                    tier,
                    parent,
                    block,
                    local,
                    by_seq: ev.hash_kind == HashKind::Seq,
                    event_start: k == 0,
                });
                parent = Some(block);
            }
        }
        FeedStats::bump(&stats.blocks_stored, ev.hashes.len() as u64);
        FeedStats::bump(&stats.stored_events, 1);
    }

    fn remove(&mut self, i: usize, ev: &Event<'_>, registry: &Registry, sink: &mut impl OpSink) {
        let tiers = Self::tiers_of(ev, registry);
        let sf = &self.slots[i];
        for &block in ev.hashes {
            sink.push(ShardOp::Remove {
                index: sf.index,
                slot: sf.slot,
                block,
                tiers,
            });
        }
        FeedStats::bump(&self.stats.blocks_removed, ev.hashes.len() as u64);
    }

    /// A clear is scoped to its stream: an event naming a medium clears that
    /// tier; a Mooncake Store `RemoveAllEvent` clears the store's host and disk
    /// tiers; an engine's `AllBlocksCleared` clears every tier of the worker.
    fn clear(&mut self, i: usize, ev: &Event<'_>, registry: &Registry, sink: &mut impl OpSink) {
        let tiers = match (ev.medium, ev.dialect) {
            (Some(m), _) => registry.tier_for(Some(m)).bit(),
            (None, Dialect::MooncakeLegacy) => Tier::HOST.bit() | Tier::DISK.bit(),
            (None, _) => TierSet::ALL,
        };
        let sf = &self.slots[i];
        sink.push(ShardOp::ClearSlot {
            index: sf.index,
            slot: sf.slot,
            tiers,
        });
    }
}

/// The hash namespace of a legacy integer LoRA id (vLLM's `lora_id`, Mooncake's
/// `lora_id`): absent, zero or negative (Mooncake's `-1`) mean the base model;
/// adapter `n` hashes as if its name were `"n"`. Queries with `lora_id` use the same rule.
pub fn lora_from_id(id: Option<i64>) -> Option<String> {
    id.filter(|n| *n > 0).map(|n| n.to_string())
}
