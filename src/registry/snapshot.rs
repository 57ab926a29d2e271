//! The registry as readers see it: an immutable [`Snapshot`] of the indexes,
//! their slots and listeners, and the names of instances and tiers; and the
//! changes a writer makes to its own copy before publishing it.
//!
//! Owns the shape of the control-plane state. Must never publish: only the
//! [`Registry`](super::Registry)'s writer, holding its mutex, swaps a copy in.

use super::{InstanceKey, NAMED_BASE, RegistryError};
use crate::types::{DpRank, IndexId, InstanceId, Tier, WorkerSlot};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

/// One worker (instance, dp rank) as a slot of an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    pub instance: InstanceId,
    pub dp: DpRank,
    /// False once unregistered; its blocks are being cleared and must not be scored.
    pub live: bool,
}

/// One registered ZMQ listener.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    /// The registered publisher kind, if given.
    pub publisher: Option<String>,
}

/// One (model, tenant) index.
#[derive(Clone, Debug)]
pub struct IndexInfo {
    pub id: IndexId,
    pub model: String,
    pub tenant: String,
    pub block_size: u32,
    pub slots: Vec<SlotInfo>,
    pub slot_of: imbl::HashMap<(InstanceId, DpRank), WorkerSlot>,
    /// Registered listeners: instance → dp rank → endpoint.
    /// Several listeners may feed one (instance, dp rank) when their publisher
    /// kinds differ (an engine and a Mooncake Store publisher for its pools).
    pub endpoints: imbl::OrdMap<InstanceId, BTreeMap<DpRank, Vec<Endpoint>>>,
    /// Live `/speculate` predictions of the index over every shard: kept by the
    /// shards, shared by every copy of this entry.
    pub live_predictions: Arc<AtomicUsize>,
}

impl Endpoint {
    pub fn new(endpoint: String, replay_endpoint: Option<String>) -> Self {
        Endpoint {
            endpoint,
            replay_endpoint,
            publisher: None,
        }
    }
}

impl IndexInfo {
    pub fn slot(&self, s: WorkerSlot) -> &SlotInfo {
        &self.slots[s.0 as usize]
    }

    /// Slots of `instance` (all dp ranks, or one).
    pub fn slots_of(&self, instance: InstanceId, dp: Option<DpRank>) -> Vec<WorkerSlot> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.instance == instance && dp.is_none_or(|d| d == s.dp))
            .map(|(i, _)| WorkerSlot(i as u32))
            .collect()
    }
}

/// An immutable view of the registry.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub(super) by_name: HashMap<String, HashMap<String, IndexId>>,
    pub indexes: Vec<Arc<IndexInfo>>,
    /// Names of tiers beyond the three well-known ones, by tier id - 3.
    pub extra_tiers: Vec<String>,
    /// Router-facing names of instances registered by string (Mooncake's
    /// `instance_id`), by their ids from [`NAMED_BASE`] up; integer instances are
    /// their own name.
    pub(super) names: imbl::HashMap<InstanceId, String>,
    pub(super) ids: imbl::HashMap<String, InstanceId>,
}

impl Snapshot {
    pub fn lookup(&self, model: &str, tenant: &str) -> Option<&Arc<IndexInfo>> {
        let id = self.by_name.get(model)?.get(tenant)?;
        self.indexes.get(id.0 as usize)
    }

    /// Every index that still has a name (deleted ones keep their id but are not listed).
    pub fn live_indexes(&self) -> Vec<&Arc<IndexInfo>> {
        let mut v: Vec<&Arc<IndexInfo>> = self
            .by_name
            .values()
            .flat_map(|t| t.values())
            .map(|id| &self.indexes[id.0 as usize])
            .collect();
        v.sort_by_key(|ix| ix.id);
        v
    }

    /// Indexes of one model, every tenant.
    pub fn tenants_of<'a>(&'a self, model: &str) -> impl Iterator<Item = &'a Arc<IndexInfo>> + 'a {
        let ids: Vec<IndexId> = self
            .by_name
            .get(model)
            .map(|t| t.values().copied().collect())
            .unwrap_or_default();
        ids.into_iter().map(move |id| &self.indexes[id.0 as usize])
    }

    /// An instance as routers name it.
    pub fn instance_key(&self, id: InstanceId) -> InstanceKey {
        if let Ok(i) = u64::try_from(id) {
            return InstanceKey::Id(i);
        }
        match self.names.get(&id) {
            Some(n) => InstanceKey::Name(n.clone()),
            // Not reachable: named ids are only made by `intern`, with their name.
            None => InstanceKey::Name(id.to_string()),
        }
    }

    /// The id of an instance, if it is an integer or a known name.
    pub fn find(&self, key: &InstanceKey) -> Option<InstanceId> {
        match key {
            InstanceKey::Id(i) => Some(InstanceId::from(*i)),
            InstanceKey::Name(n) => self.ids.get(n).copied(),
        }
    }

    pub fn tier_name(&self, t: Tier) -> &str {
        match t {
            Tier::DEVICE => "GPU",
            Tier::HOST => "CPU",
            Tier::DISK => "DISK",
            Tier(n) => self
                .extra_tiers
                .get(n as usize - 3)
                .map(String::as_str)
                .unwrap_or("OTHER"),
        }
    }

    pub fn tier_of(&self, medium: Option<&str>) -> Option<Tier> {
        Tier::well_known(medium).or_else(|| {
            let m = medium?;
            self.extra_tiers
                .iter()
                .position(|n| n.eq_ignore_ascii_case(m))
                .map(|i| Tier(3 + i as u8))
        })
    }
}

/// The id of instance name `name`, given one from [`NAMED_BASE`] up if it has none.
pub(super) fn intern_name(s: &mut Snapshot, name: &str) -> InstanceId {
    if let Some(id) = s.ids.get(name) {
        return *id;
    }
    let id = NAMED_BASE + s.names.len() as InstanceId;
    s.names.insert(id, name.to_string());
    s.ids.insert(name.to_string(), id);
    id
}

/// Drop an index's name: it keeps its id (slots and clears in flight stay valid) but
/// is no longer listed or found.
pub(super) fn forget_name(s: &mut Snapshot, model: &str, tenant: &str) {
    if let Some(t) = s.by_name.get_mut(model) {
        t.remove(tenant);
        if t.is_empty() {
            s.by_name.remove(model);
        }
    }
}

pub(super) fn check_block_size(ix: &IndexInfo, block_size: u32) -> Result<(), RegistryError> {
    if ix.block_size != block_size {
        return Err(RegistryError::BlockSizeMismatch {
            model: ix.model.clone(),
            tenant: ix.tenant.clone(),
            existing: ix.block_size,
            requested: block_size,
        });
    }
    Ok(())
}

pub(super) fn ensure_index_in(
    s: &mut Snapshot,
    model: &str,
    tenant: &str,
    block_size: u32,
) -> Result<IndexId, RegistryError> {
    if let Some(ix) = s.lookup(model, tenant) {
        check_block_size(ix, block_size)?;
        return Ok(ix.id);
    }
    let id = IndexId(s.indexes.len() as u32);
    s.indexes.push(Arc::new(IndexInfo {
        id,
        model: model.to_string(),
        tenant: tenant.to_string(),
        block_size,
        slots: Vec::new(),
        slot_of: imbl::HashMap::new(),
        endpoints: imbl::OrdMap::new(),
        live_predictions: Arc::default(),
    }));
    s.by_name
        .entry(model.to_string())
        .or_default()
        .insert(tenant.to_string(), id);
    Ok(id)
}

/// Slot ids are never reused within an index: a returning worker gets its old slot back,
/// so a clear still in flight for it can only ever apply to its own blocks.
pub(super) fn intern_slot(
    ix: &mut IndexInfo,
    instance: InstanceId,
    dp: DpRank,
) -> Result<WorkerSlot, RegistryError> {
    if let Some(&s) = ix.slot_of.get(&(instance, dp)) {
        ix.slots[s.0 as usize].live = true;
        return Ok(s);
    }
    if ix.slots.len() as u32 >= WorkerSlot::MAX {
        return Err(RegistryError::SlotsExhausted);
    }
    let s = WorkerSlot(ix.slots.len() as u32);
    ix.slots.push(SlotInfo {
        instance,
        dp,
        live: true,
    });
    ix.slot_of.insert((instance, dp), s);
    Ok(s)
}
