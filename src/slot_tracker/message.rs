//! What reaches a slot shard and what it answers: the calls ([`SlotReq`]) by
//! tracker name, the replies, and the figures `/metrics` reads.
//!
//! Owns the shapes that cross the mesh, and Dynamo's field order and sort order
//! for `/workers` and `/loads`. Must never change a tracker: [`SlotShard`]
//! answers the calls.
//!
//! [`SlotShard`]: super::SlotShard

use super::{PotentialLoad, Rank, RankLoad, Refused, SlotError, WorkerId, sync};
use crate::types::{SeqHash, ShardId};
use serde::Serialize;

/// A tracker's name: (model_name, routing_group).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackerKey {
    pub model_name: String,
    pub routing_group: String,
}

impl TrackerKey {
    /// The shard that owns this tracker, of `shards`.
    pub fn owner(&self, shards: usize) -> ShardId {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(
            self.routing_group.as_bytes(),
            xxhash_rust::xxh3::xxh3_64(self.model_name.as_bytes()),
        );
        ShardId((h % shards.max(1) as u64) as usize)
    }

    pub(super) fn matches(&self, f: &Filter) -> bool {
        f.model_name.as_ref().is_none_or(|m| *m == self.model_name)
            && f.routing_group
                .as_ref()
                .is_none_or(|g| *g == self.routing_group)
    }

    pub(super) fn not_found(&self) -> SlotError {
        SlotError::TrackerNotFound {
            model_name: self.model_name.clone(),
            routing_group: self.routing_group.clone(),
        }
    }
}

/// `/workers` and `/loads` filters (unset: any).
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub model_name: Option<String>,
    pub routing_group: Option<String>,
}

/// A call to a shard's trackers.
#[derive(Clone, Debug)]
pub enum SlotReq {
    Register {
        key: TrackerKey,
        worker: WorkerId,
        block_size: u32,
        dp_start: u32,
        dp_size: u32,
    },
    Unregister {
        key: TrackerKey,
        worker: WorkerId,
    },
    Add {
        key: TrackerKey,
        request_id: String,
        rank: Rank,
        path: Vec<SeqHash>,
        new_tokens: usize,
    },
    PrefillComplete {
        key: TrackerKey,
        request_id: String,
    },
    Free {
        key: TrackerKey,
        request_id: String,
    },
    Workers(Filter),
    Loads(Filter),
    Potential {
        key: TrackerKey,
        path: std::sync::Arc<[SeqHash]>,
        new_tokens: usize,
    },
    /// A step another replica took ([`sync`]): applied if this replica has the
    /// tracker with the same block size, never published again.
    Replica(Box<sync::Event>),
}

impl SlotReq {
    /// The tracker the call is for (`None`: every tracker on every shard).
    pub fn key(&self) -> Option<&TrackerKey> {
        match self {
            SlotReq::Register { key, .. }
            | SlotReq::Unregister { key, .. }
            | SlotReq::Add { key, .. }
            | SlotReq::PrefillComplete { key, .. }
            | SlotReq::Free { key, .. }
            | SlotReq::Potential { key, .. } => Some(key),
            SlotReq::Replica(e) => Some(&e.key),
            SlotReq::Workers(_) | SlotReq::Loads(_) => None,
        }
    }
}

/// `/workers`: one registered worker, fields in Dynamo's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    pub worker_id: WorkerId,
    pub model_name: String,
    pub routing_group: String,
    pub block_size: u32,
    pub dp_start: u32,
    pub dp_size: u32,
}

/// `/loads`: one registered rank's load, fields in Dynamo's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoadInfo {
    pub model_name: String,
    pub routing_group: String,
    pub worker_id: WorkerId,
    pub dp_rank: u32,
    pub active_prefill_tokens: usize,
    pub active_decode_blocks: usize,
}

/// A shard's answer to a [`SlotReq`].
#[derive(Debug)]
pub enum SlotRep {
    Done(Result<(), SlotError>),
    Workers(Vec<WorkerInfo>),
    Loads(Vec<LoadInfo>),
    Potential(Result<Vec<PotentialLoad>, SlotError>),
}

/// One rank's figures for `/metrics`.
#[derive(Clone, Debug)]
pub struct RankStat {
    pub key: TrackerKey,
    pub rank: Rank,
    pub load: RankLoad,
}

/// One tracker's figures for `/metrics`: its ranks' loads summed.
#[derive(Clone, Debug)]
pub struct TrackerStat {
    pub key: TrackerKey,
    pub ranks: usize,
    pub load: RankLoad,
}

/// A shard's trackers' figures for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct SlotStats {
    /// Every rank's, unless this shard holds more than
    /// [`SlotLimits::metrics_max_ranks`]: then none.
    pub ranks: Vec<RankStat>,
    pub trackers: Vec<TrackerStat>,
    /// Refusals by the bounds, since start.
    pub refused: Refused,
    /// [`SlotLimits::metrics_max_ranks`].
    pub metrics_max_ranks: usize,
    /// Requests freed by the TTL, since start.
    pub expired: u64,
    /// The replica links' counters (the same on every shard), when there are links.
    pub sync: Option<sync::Counts>,
}

/// `/workers` from every shard's part, in Dynamo's order.
pub fn sort_workers(w: &mut [WorkerInfo]) {
    w.sort_by(|a, b| {
        (&a.model_name, &a.routing_group, a.worker_id).cmp(&(
            &b.model_name,
            &b.routing_group,
            b.worker_id,
        ))
    });
}

/// `/loads` from every shard's part, in Dynamo's order.
pub fn sort_loads(l: &mut [LoadInfo]) {
    l.sort_by(|a, b| {
        (&a.model_name, &a.routing_group, a.worker_id, a.dp_rank).cmp(&(
            &b.model_name,
            &b.routing_group,
            b.worker_id,
            b.dp_rank,
        ))
    });
}
