//! Who is registered: (model, tenant) indexes, their workers and slots, media.
//!
//! Owns the control-plane state. Readers (every query, every ingest thread)
//! take an immutable [`Snapshot`] with one lock-free `ArcSwap` load; writers
//! (register, unregister, a dp rank or medium seen for the first time — all
//! rare) serialize on a mutex, copy, change and publish. Never touched per block.

mod names;
mod snapshot;

pub use names::{InstanceKey, MAX_NAME_BYTES, NAMED_BASE, name_ok, topic_name_ok};
pub use snapshot::{Endpoint, IndexInfo, SlotInfo, Snapshot};

use crate::types::{DpRank, IndexId, InstanceId, Tier, WorkerSlot};
use arc_swap::ArcSwap;
use snapshot::{check_block_size, ensure_index_in, forget_name, intern_name, intern_slot};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RegistryError {
    #[error(
        "block_size {requested} does not match block_size {existing} of the existing indexer for {model}:{tenant}"
    )]
    BlockSizeMismatch {
        model: String,
        tenant: String,
        existing: u32,
        requested: u32,
    },
    #[error("block_size must be positive")]
    ZeroBlockSize,
    #[error("instance {instance} dp_rank {dp} is already registered for {model}:{tenant}")]
    AlreadyRegistered {
        model: String,
        tenant: String,
        instance: InstanceId,
        dp: DpRank,
    },
    #[error("no instance {instance} registered for model {model}")]
    UnknownInstance { model: String, instance: InstanceId },
    #[error("too many worker slots in one index")]
    SlotsExhausted,
    #[error("event data may create at most {limit} {what}; raise --max-event-{what}")]
    EventLimit { what: &'static str, limit: usize },
    #[error("an approximate index holds at most {limit} workers (--max-event-slots)")]
    WorkerLimit { limit: usize },
}

/// Per-listener defaults for what its events may leave out (Mooncake's `/register`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerOpts {
    /// `additionalsalt`: hash namespace for events that carry no salt of their own.
    pub salt: Option<String>,
    /// `lora_name`: adapter for events that name none.
    pub lora_name: Option<String>,
    /// `type`: the publisher kind as registered (`vLLM`, `SGLang`, `Mooncake`), for `/workers`.
    pub publisher: Option<String>,
    /// `attention_chunk_size`: the chunk (tokens) of the model's chunked local
    /// attention groups, which vLLM's events do not carry.
    pub attention_chunk_size: Option<u32>,
    /// `hybrid_align_tokens`: the alignment (tokens) of a hybrid model's hits,
    /// when not the least common multiple of its groups' block sizes.
    pub hybrid_align_tokens: Option<u32>,
}

/// Per index touched by an unregister: the dp ranks whose listeners went and
/// the slots that stopped being live.
pub type Unregistered = (IndexId, Vec<DpRank>, Vec<WorkerSlot>);

/// What one successful [`Registry::register`] changed.
#[derive(Clone, Copy, Debug)]
pub struct Registered {
    pub index: IndexId,
    pub slot: WorkerSlot,
    created_index: bool,
    slot_was_live: bool,
}

/// What `/register` asks for.
#[derive(Clone, Debug)]
pub struct Registration {
    pub model: String,
    pub tenant: String,
    pub block_size: u32,
    pub instance: InstanceId,
    pub dp: DpRank,
    pub endpoint: Endpoint,
    pub opts: ListenerOpts,
}

/// What `/unregister` asks for: `instance`'s listeners (one dp rank, or all) in
/// the model's indexes (one tenant's, or every tenant's).
#[derive(Clone, Copy, Debug)]
pub struct Unregistration<'a> {
    pub model: &'a str,
    pub tenant: Option<&'a str>,
    pub instance: InstanceId,
    pub dp: Option<DpRank>,
}

/// Caps on what event data (an event's `tenant_id`, a batch's dp rank) may create:
/// a publisher must not grow the registry without bound.
#[derive(Clone, Copy, Debug)]
pub struct EventLimits {
    /// Indexes created for tenants named by events, process-wide.
    pub indexes: usize,
    /// Worker slots per index created for dp ranks seen on the wire.
    pub slots: usize,
}

impl Default for EventLimits {
    fn default() -> Self {
        EventLimits {
            indexes: 256,
            slots: 1024,
        }
    }
}

/// A hybrid model's settings from the command line (`--attention-chunk-size`,
/// `--hybrid-align-tokens`), for registrations that give none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HybridDefaults {
    pub attention_chunk_size: Option<u32>,
    pub hybrid_align_tokens: Option<u32>,
}

#[derive(Default)]
pub struct Registry {
    snap: ArcSwap<Snapshot>,
    /// Per model, its hybrid settings from the command line.
    hybrid: Vec<(String, HybridDefaults)>,
    write: Mutex<()>,
    limits: EventLimits,
    /// Indexes created by event data so far.
    event_indexes: AtomicUsize,
    /// Creations refused by [`EventLimits`] (counted in `/metrics`).
    pub event_refusals: AtomicU64,
    /// When a refusal was last logged (ms since `epoch`), for logging once per interval.
    last_refusal_log: AtomicU64,
    epoch: OnceLock<std::time::Instant>,
}

impl Registry {
    /// The command line's hybrid settings of `model` (none set: defaults).
    pub fn hybrid_defaults(&self, model: &str) -> HybridDefaults {
        self.hybrid
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, d)| *d)
            .unwrap_or_default()
    }

    /// With the command line's per-model hybrid settings.
    pub fn with_hybrid(mut self, hybrid: Vec<(String, HybridDefaults)>) -> Self {
        self.hybrid = hybrid;
        self
    }

    pub fn with_limits(limits: EventLimits) -> Self {
        Registry {
            limits,
            ..Registry::default()
        }
    }

    /// Count a refused creation; log it at most once per 10 s.
    fn refuse(&self, e: RegistryError) -> RegistryError {
        let n = self.event_refusals.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self
            .epoch
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
            + 1;
        let last = self.last_refusal_log.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= 10_000)
            && self
                .last_refusal_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(refused_so_far = n, "event data refused: {e}");
        }
        e
    }

    /// The index an event's `tenant_id` names, created (within [`EventLimits`]) if it
    /// does not exist.
    pub fn ensure_event_index(
        &self,
        model: &str,
        tenant: &str,
        block_size: u32,
    ) -> Result<IndexId, RegistryError> {
        if let Some(ix) = self.snapshot().lookup(model, tenant) {
            return check_block_size(ix, block_size).map(|_| ix.id);
        }
        if self.event_indexes.load(Ordering::Relaxed) >= self.limits.indexes {
            return Err(self.refuse(RegistryError::EventLimit {
                what: "indexes",
                limit: self.limits.indexes,
            }));
        }
        let r = self.update(|s| {
            let existed = s.lookup(model, tenant).is_some();
            ensure_index_in(s, model, tenant, block_size).map(|id| (id, existed))
        });
        let (id, existed) = r?;
        if !existed {
            self.event_indexes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(id)
    }

    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snap.load()
    }

    pub fn snapshot_arc(&self) -> Arc<Snapshot> {
        self.snap.load_full()
    }

    fn update<R>(&self, f: impl FnOnce(&mut Snapshot) -> R) -> R {
        // Control-plane writers only; a poisoned lock still guards a consistent snapshot
        // because the snapshot is published only after `f` returns.
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = Snapshot::clone(&self.snap.load());
        let r = f(&mut next);
        self.snap.store(Arc::new(next));
        r
    }

    /// The id of an instance: an integer is its own id; a name gets an id from
    /// [`NAMED_BASE`] up, stable for the life of the process.
    pub fn intern(&self, key: &InstanceKey) -> InstanceId {
        let name = match key {
            InstanceKey::Id(i) => return InstanceId::from(*i),
            InstanceKey::Name(n) => n,
        };
        if let Some(id) = self.snapshot().ids.get(name) {
            return *id;
        }
        self.update(|s| intern_name(s, name))
    }

    /// Find or create the index for (model, tenant).
    pub fn ensure_index(
        &self,
        model: &str,
        tenant: &str,
        block_size: u32,
    ) -> Result<IndexId, RegistryError> {
        if block_size == 0 {
            return Err(RegistryError::ZeroBlockSize);
        }
        if let Some(ix) = self.snapshot().lookup(model, tenant) {
            return check_block_size(ix, block_size).map(|_| ix.id);
        }
        self.update(|s| ensure_index_in(s, model, tenant, block_size))
    }

    /// Register a listener; returns what changed, so a failed start can be undone
    /// exactly ([`Registry::undo`]).
    pub fn register(&self, r: &Registration) -> Result<Registered, RegistryError> {
        if r.block_size == 0 {
            return Err(RegistryError::ZeroBlockSize);
        }
        self.update(|s| {
            let created_index = s.lookup(&r.model, &r.tenant).is_none();
            let id = ensure_index_in(s, &r.model, &r.tenant, r.block_size)?;
            let ix = Arc::make_mut(&mut s.indexes[id.0 as usize]);
            let taken = ix
                .endpoints
                .get(&r.instance)
                .and_then(|e| e.get(&r.dp))
                .is_some_and(|eps| {
                    eps.iter().any(|e| {
                        e.endpoint == r.endpoint.endpoint || e.publisher == r.endpoint.publisher
                    })
                });
            if taken {
                return Err(RegistryError::AlreadyRegistered {
                    model: r.model.clone(),
                    tenant: r.tenant.clone(),
                    instance: r.instance,
                    dp: r.dp,
                });
            }
            ix.endpoints
                .entry(r.instance)
                .or_default()
                .entry(r.dp)
                .or_default()
                .push(r.endpoint.clone());

            let slot_was_live = ix
                .slot_of
                .get(&(r.instance, r.dp))
                .is_some_and(|s| ix.slot(*s).live);
            let slot = intern_slot(ix, r.instance, r.dp)?;
            Ok(Registered {
                index: id,
                slot,
                created_index,
                slot_was_live,
            })
        })
    }

    /// Undo exactly what `register(r)` did: its one listener, the slot if it made it
    /// live, the index if it created it. Other listeners of the worker stay.
    pub fn undo(&self, r: &Registration, done: &Registered) {
        self.update(|s| {
            let ix = Arc::make_mut(&mut s.indexes[done.index.0 as usize]);
            if let Some(by_dp) = ix.endpoints.get_mut(&r.instance) {
                if let Some(eps) = by_dp.get_mut(&r.dp) {
                    eps.retain(|e| e != &r.endpoint);
                    if eps.is_empty() {
                        by_dp.remove(&r.dp);
                    }
                }
                if by_dp.is_empty() {
                    ix.endpoints.remove(&r.instance);
                }
            }
            if !done.slot_was_live {
                ix.slots[done.slot.0 as usize].live = false;
            }
            if done.created_index && ix.endpoints.is_empty() {
                let (model, tenant) = (ix.model.clone(), ix.tenant.clone());
                forget_name(s, &model, &tenant);
            }
        })
    }

    /// Slot for a dp rank first seen on the wire (batch `data_parallel_rank`), within
    /// [`EventLimits`].
    pub fn slot_for(
        &self,
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
    ) -> Result<WorkerSlot, RegistryError> {
        if let Some(ix) = self.snapshot().indexes.get(index.0 as usize)
            && let Some(&s) = ix.slot_of.get(&(instance, dp))
            && ix.slot(s).live
        {
            return Ok(s);
        }
        let limit = self.limits.slots;
        let r = self.update(|s| {
            let ix = Arc::make_mut(&mut s.indexes[index.0 as usize]);
            if !ix.slot_of.contains_key(&(instance, dp)) && ix.slots.len() >= limit {
                return Err(RegistryError::EventLimit {
                    what: "slots",
                    limit,
                });
            }
            intern_slot(ix, instance, dp)
        });
        r.map_err(|e| match e {
            RegistryError::EventLimit { .. } => self.refuse(e),
            e => e,
        })
    }

    /// Register a pod first heard on a bound socket (`--zmq-bind`): its (model,
    /// tenant) index, created if need be, and its (pod, dp rank) slot, listed with
    /// `endpoint` (the bound one). Topics are event data: a new index counts against
    /// [`EventLimits::indexes`] and a new slot against [`EventLimits::slots`], and a
    /// pod's name is kept only once it is let in. An existing index keeps its block
    /// size. Returns the index, the pod's instance id and the index's block size.
    pub fn register_pod(
        &self,
        model: &str,
        tenant: &str,
        block_size: u32,
        pod: &str,
        dp: DpRank,
        endpoint: &Endpoint,
    ) -> Result<(IndexId, InstanceId, u32), RegistryError> {
        let key = InstanceKey::parse(pod);
        let limits = self.limits;
        let r = self.update(|s| {
            let created = match s.lookup(model, tenant) {
                Some(_) => false,
                None if self.event_indexes.load(Ordering::Relaxed) >= limits.indexes => {
                    return Err(RegistryError::EventLimit {
                        what: "indexes",
                        limit: limits.indexes,
                    });
                }
                None => true,
            };
            let known = s.find(&key);
            let ix = s.lookup(model, tenant);
            let full = ix.is_some_and(|ix| {
                ix.slots.len() >= limits.slots
                    && known.is_none_or(|id| !ix.slot_of.contains_key(&(id, dp)))
            });
            if full {
                return Err(RegistryError::EventLimit {
                    what: "slots",
                    limit: limits.slots,
                });
            }
            let bs = ix.map_or(block_size, |ix| ix.block_size);
            let id = ensure_index_in(s, model, tenant, bs)?;
            let instance = match known {
                Some(i) => i,
                None => intern_name(s, pod),
            };
            let ix = Arc::make_mut(&mut s.indexes[id.0 as usize]);
            let eps = ix
                .endpoints
                .entry(instance)
                .or_default()
                .entry(dp)
                .or_default();
            if !eps.contains(endpoint) {
                eps.push(endpoint.clone());
            }
            intern_slot(ix, instance, dp)?;
            Ok((id, instance, bs, created))
        });
        match r {
            Ok((id, instance, bs, created)) => {
                if created {
                    self.event_indexes.fetch_add(1, Ordering::Relaxed);
                }
                Ok((id, instance, bs))
            }
            Err(e @ RegistryError::EventLimit { .. }) => Err(self.refuse(e)),
            Err(e) => Err(e),
        }
    }

    /// Slot of a worker an approximate index's `/speculate` names (no events
    /// feed it, so no registration names its workers), within the same cap on
    /// slots per index as event data; a refusal is not event data's.
    pub fn speculated_slot(
        &self,
        index: IndexId,
        instance: InstanceId,
        dp: DpRank,
    ) -> Result<WorkerSlot, RegistryError> {
        let limit = self.limits.slots;
        self.update(|s| {
            let ix = Arc::make_mut(&mut s.indexes[index.0 as usize]);
            if !ix.slot_of.contains_key(&(instance, dp)) && ix.slots.len() >= limit {
                return Err(RegistryError::WorkerLimit { limit });
            }
            intern_slot(ix, instance, dp)
        })
    }

    /// Tier for a medium, interning an unknown one (up to 4 extra tiers; later ones
    /// share the last; [`Tier::PREDICTED`] is never a medium's).
    pub fn tier_for(&self, medium: Option<&str>) -> Tier {
        if let Some(t) = self.snapshot().tier_of(medium) {
            return t;
        }
        let m = medium.unwrap_or_default().to_ascii_uppercase();
        self.update(|s| {
            if let Some(t) = s.tier_of(Some(&m)) {
                return t;
            }
            if s.extra_tiers.len() < Tier::MEDIA - 3 {
                s.extra_tiers.push(m);
            }
            Tier(3 + s.extra_tiers.len() as u8 - 1)
        })
    }

    /// Unregister listeners of `instance` in the matching indexes. Returns, per index,
    /// the removed listeners' dp ranks and the slots that stop being live.
    pub fn unregister(&self, u: &Unregistration) -> Result<Vec<Unregistered>, RegistryError> {
        let Unregistration {
            model,
            tenant,
            instance,
            dp,
        } = *u;
        self.update(|s| {
            let ids: Vec<IndexId> = match tenant {
                Some(t) => s.lookup(model, t).map(|ix| ix.id).into_iter().collect(),
                None => s.tenants_of(model).map(|ix| ix.id).collect(),
            };
            let mut out = Vec::new();
            for id in ids {
                let ix = Arc::make_mut(&mut s.indexes[id.0 as usize]);
                let slots: Vec<WorkerSlot> = ix
                    .slots_of(instance, dp)
                    .into_iter()
                    .filter(|s| ix.slot(*s).live)
                    .collect();
                let mut dps = Vec::new();
                if let Some(eps) = ix.endpoints.get_mut(&instance) {
                    eps.retain(|d, _| {
                        let hit = dp.is_none_or(|x| x == *d);
                        if hit {
                            dps.push(*d);
                        }
                        !hit
                    });
                    if eps.is_empty() {
                        ix.endpoints.remove(&instance);
                    }
                }
                if slots.is_empty() && dps.is_empty() {
                    continue;
                }
                for sl in &slots {
                    ix.slots[sl.0 as usize].live = false;
                }
                if ix.endpoints.is_empty() {
                    // Like Dynamo, an index with no registered worker left is deleted.
                    let (model, tenant) = (ix.model.clone(), ix.tenant.clone());
                    forget_name(s, &model, &tenant);
                }
                out.push((id, dps, slots));
            }
            if out.is_empty() {
                return Err(RegistryError::UnknownInstance {
                    model: model.to_string(),
                    instance,
                });
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_ids_and_names_never_meet() {
        assert_eq!(
            InstanceKey::parse("18446744073709551615"),
            InstanceKey::Id(u64::MAX)
        );
        assert_eq!(InstanceKey::parse("0"), InstanceKey::Id(0));
        for name in ["vllm-1", "007", "+7", "18446744073709551616", "-1", ""] {
            assert_eq!(InstanceKey::parse(name), InstanceKey::Name(name.into()));
        }
        let r = Registry::default();
        let named = r.intern(&InstanceKey::Name("vllm-1".into()));
        assert!(named >= NAMED_BASE);
        for i in [0, 1 << 63, u64::MAX] {
            let id = r.intern(&InstanceKey::Id(i));
            assert_eq!(id, InstanceId::from(i));
            assert_ne!(id, named);
            assert_eq!(r.snapshot().instance_key(id), InstanceKey::Id(i));
        }
        assert_eq!(r.intern(&InstanceKey::Name("vllm-1".into())), named);
        let snap = r.snapshot();
        assert_eq!(snap.instance_key(named), InstanceKey::Name("vllm-1".into()));
        assert_eq!(snap.find(&InstanceKey::Name("vllm-1".into())), Some(named));
        assert_eq!(snap.find(&InstanceKey::Name("other".into())), None);
    }
}
