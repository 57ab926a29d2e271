//! Load tracking: Dynamo's slot tracker (`dynamo-kv-router` 1.6.1,
//! `services::slot_tracker`), kvix's own implementation of its rules.
//!
//! Owns the requests a router booked on its workers and what they load each
//! worker's dp ranks with. Never touches the KV index and never takes a lock: a
//! tracker lives on one shard and only that shard's executor changes it
//! ([`SlotShard`]), reached by message like the index. Its only I/O is
//! [`sync`]'s, on threads of their own.
//!
//! The rules, as Dynamo 1.6.1 keeps them:
//! - A tracker is one (model_name, routing_group) (group `default` when not
//!   named), created by the first `/register` and dropped with its last worker.
//!   `block_size` must be > 0 and the same for every worker of a tracker (409);
//!   `dp_size` must be 1..=4096 and `dp_start + dp_size` fit in a u32 (400); a
//!   worker registers once (409). Unregistering drops the worker's requests.
//! - `/add` books a request id on a registered (worker, dp_rank) (404 if the rank
//!   is not registered, checked first; 409 if the id is booked anywhere in the
//!   tracker). Its `sequence_hashes` become active on that rank: a rank's
//!   `active_decode_blocks` counts each prompt block once however many active
//!   requests share it (the same hash under the same prefix). `new_isl_tokens`
//!   > 0 counts as `active_prefill_tokens` until `/prefill_complete` or `/free`.
//! - `/prefill_complete` on an unknown request is 404, repeated is 200; `/free`
//!   is always 200 (unknown and repeated alike) once the tracker exists. Every
//!   request route answers 404 when the tracker does not exist.
//! - `/potential_loads` answers, for every registered rank: prefill tokens plus
//!   `new_isl_tokens`, decode blocks plus the request's blocks beyond the longest
//!   prefix already active there, and active requests.
//! - A request never freed expires after a TTL (Dynamo: 300 s); kvix counts
//!   expiries.
//!
//! Bounds of kvix's own ([`SlotLimits`], each with its flag): blocks per booking
//! (413), active blocks per rank and live bookings per tracker (429), each
//! refusal counted. Expiries and large frees give their blocks back in bounded
//! steps between requests ([`SlotShard::step`]), and reads cost their answer, so
//! that no call holds the executor for long whatever the trackers hold.
//!
//! - Replicas share each `/add`, `/prefill_complete` (every time) and `/free`
//!   (when it freed something) in Dynamo's replica-sync format ([`sync`]).
//!
//! Where kvix differs, on purpose: a prompt's blocks are matched by their whole
//! path (Dynamo compares a compressed edge by its last hash, trusting hashes to
//! chain); `/potential_loads` lists ranks sorted (Dynamo: hash-map order).
//!
//! `tracker.rs` is one tracker's rules; `limits.rs` the refusals; `message.rs`
//! the calls and answers; [`sync`] the replicas. Here: a shard's trackers.

mod limits;
mod message;
pub mod sync;
mod tracker;

pub use limits::{Refused, SlotError, SlotLimits};
pub use message::{
    Filter, LoadInfo, RankStat, SlotRep, SlotReq, SlotStats, TrackerKey, TrackerStat, WorkerInfo,
    sort_loads, sort_workers,
};
pub use tracker::{DpRange, MAX_DP_RANKS, PotentialLoad, Rank, RankLoad, Tracker, WorkerId};

use crate::types::SeqHash;
use hashbrown::HashMap;
use limits::count;
use std::time::{Duration, Instant};

/// The trackers one shard owns ([`TrackerKey::owner`]).
#[derive(Debug)]
pub struct SlotShard {
    trackers: HashMap<TrackerKey, Tracker>,
    ttl: Duration,
    limits: SlotLimits,
    expired: u64,
    refused: Refused,
    /// Where this replica's steps go to its peers, when it has any.
    links: Option<std::sync::Arc<sync::Links>>,
}

/// Dynamo's request TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// Blocks given back (and bookings expired) per step: small enough that requests
/// waiting behind a step barely notice it, even in a debug build.
pub const STEP_BLOCKS: usize = 2048;

impl Default for SlotShard {
    fn default() -> Self {
        SlotShard::new(DEFAULT_TTL, SlotLimits::default(), None)
    }
}

impl SlotShard {
    pub fn new(
        ttl: Duration,
        limits: SlotLimits,
        links: Option<std::sync::Arc<sync::Links>>,
    ) -> Self {
        SlotShard {
            trackers: HashMap::new(),
            ttl,
            limits,
            expired: 0,
            refused: Refused::default(),
            links,
        }
    }

    /// The links to the other replicas, if there are any.
    pub fn links(&self) -> Option<std::sync::Arc<sync::Links>> {
        self.links.clone()
    }

    /// Tell the peers (if any) about a step this replica took.
    fn publish(&self, key: &TrackerKey, request_id: &str, rank: Rank, step: sync::Step) {
        let (Some(links), Some(t)) = (&self.links, self.trackers.get(key)) else {
            return;
        };
        links.publish(sync::Event {
            key: key.clone(),
            block_size: t.block_size(),
            request_id: request_id.to_string(),
            rank,
            step,
            router_id: links.router_id,
        });
    }

    fn add(
        &mut self,
        key: &TrackerKey,
        request_id: &str,
        rank: Rank,
        path: Vec<SeqHash>,
        new_tokens: usize,
        now: Instant,
    ) -> Result<(), SlotError> {
        let shared = self.links.is_some().then(|| path.clone());
        let cutoff = now.checked_sub(self.ttl);
        let limits = self.limits;
        let t = self.tracker(key)?;
        let stale = cutoff.is_some_and(|c| t.expire_one(request_id, c));
        let r = t.add(request_id, rank, path, new_tokens, now, &limits);
        self.expired += u64::from(stale);
        self.count(&r);
        r?;
        if let Some(path) = shared {
            self.publish(key, request_id, rank, sync::Step::Add { path, new_tokens });
        }
        Ok(())
    }

    /// A peer's step, on the tracker it names if this replica has it with the
    /// same block size; refusals (a rank not registered here, a duplicate) are
    /// dropped, as Dynamo drops them.
    fn replica(&mut self, e: sync::Event, now: Instant) {
        let Some(t) = self.trackers.get_mut(&e.key) else {
            return;
        };
        if t.block_size() != e.block_size {
            return;
        }
        if let Some(c) = now.checked_sub(self.ttl)
            && t.expire_one(&e.request_id, c)
        {
            self.expired += 1;
        }
        match e.step {
            sync::Step::Add { path, new_tokens } => {
                let r = t.add(&e.request_id, e.rank, path, new_tokens, now, &self.limits);
                count(&mut self.refused, &r);
            }
            sync::Step::PrefillComplete => {
                let _ = t.prefill_complete(&e.request_id);
            }
            sync::Step::Free => {
                t.free(&e.request_id);
            }
        }
    }

    /// Counts a refusal by the bounds.
    fn count(&mut self, r: &Result<(), SlotError>) {
        count(&mut self.refused, r);
    }

    /// Answer `req` as of `now`, after a step of expiry; a request the call names
    /// that is past its TTL is expired first, however far the steps are.
    pub fn answer(&mut self, req: SlotReq, now: Instant) -> SlotRep {
        self.step(now);
        match req {
            SlotReq::Register {
                key,
                worker,
                block_size,
                dp_start,
                dp_size,
            } => SlotRep::Done(self.register(key, worker, block_size, dp_start, dp_size)),
            SlotReq::Unregister { key, worker } => SlotRep::Done(self.unregister(&key, worker)),
            SlotReq::Add {
                key,
                request_id,
                rank,
                path,
                new_tokens,
            } => SlotRep::Done(self.add(&key, &request_id, rank, path, new_tokens, now)),
            SlotReq::PrefillComplete { key, request_id } => {
                self.expire_one(&key, &request_id, now);
                let r = self
                    .tracker(&key)
                    .and_then(|t| t.prefill_complete(&request_id));
                if let Ok(rank) = r {
                    self.publish(&key, &request_id, rank, sync::Step::PrefillComplete);
                }
                SlotRep::Done(r.map(|_| ()))
            }
            SlotReq::Free { key, request_id } => {
                self.expire_one(&key, &request_id, now);
                let r = self.tracker(&key).map(|t| t.free(&request_id));
                if let Ok(Some(rank)) = r {
                    self.publish(&key, &request_id, rank, sync::Step::Free);
                }
                SlotRep::Done(r.map(|_| ()))
            }
            SlotReq::Replica(e) => {
                self.replica(*e, now);
                SlotRep::Done(Ok(()))
            }
            SlotReq::Workers(f) => SlotRep::Workers(self.workers(&f)),
            SlotReq::Loads(f) => SlotRep::Loads(self.loads(&f)),
            SlotReq::Potential {
                key,
                path,
                new_tokens,
            } => SlotRep::Potential(
                self.trackers
                    .get(&key)
                    .map(|t| t.potential(&path, new_tokens))
                    .ok_or_else(|| key.not_found()),
            ),
        }
    }

    /// Expires `request_id` now if it is past its TTL.
    fn expire_one(&mut self, key: &TrackerKey, request_id: &str, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.ttl) else {
            return;
        };
        if let Some(t) = self.trackers.get_mut(key)
            && t.expire_one(request_id, cutoff)
        {
            self.expired += 1;
        }
    }

    fn tracker(&mut self, key: &TrackerKey) -> Result<&mut Tracker, SlotError> {
        self.trackers.get_mut(key).ok_or_else(|| key.not_found())
    }

    fn register(
        &mut self,
        key: TrackerKey,
        worker: WorkerId,
        block_size: u32,
        dp_start: u32,
        dp_size: u32,
    ) -> Result<(), SlotError> {
        if block_size == 0 {
            return Err(SlotError::InvalidBlockSize);
        }
        let range = DpRange::checked(dp_start, dp_size)?;
        let t = self
            .trackers
            .entry(key.clone())
            .or_insert_with(|| Tracker::new(block_size));
        if t.block_size() != block_size {
            return Err(SlotError::BlockSizeMismatch {
                model_name: key.model_name.clone(),
                routing_group: key.routing_group.clone(),
                existing: t.block_size(),
                requested: block_size,
            });
        }
        if !t.register(worker, range) {
            return Err(SlotError::DuplicateWorker {
                worker_id: worker,
                model_name: key.model_name.clone(),
                routing_group: key.routing_group.clone(),
            });
        }
        Ok(())
    }

    fn unregister(&mut self, key: &TrackerKey, worker: WorkerId) -> Result<(), SlotError> {
        let found = self
            .trackers
            .get_mut(key)
            .is_some_and(|t| t.unregister(worker));
        if !found {
            return Err(SlotError::WorkerNotFound {
                worker_id: worker,
                model_name: key.model_name.clone(),
                routing_group: key.routing_group.clone(),
            });
        }
        if self.trackers.get(key).is_some_and(Tracker::is_empty) {
            self.trackers.remove(key);
        }
        Ok(())
    }

    fn workers(&self, f: &Filter) -> Vec<WorkerInfo> {
        let mut out = Vec::new();
        for (key, t) in self.trackers.iter().filter(|(k, _)| k.matches(f)) {
            out.extend(t.workers().map(|(worker_id, r)| WorkerInfo {
                worker_id,
                model_name: key.model_name.clone(),
                routing_group: key.routing_group.clone(),
                block_size: t.block_size(),
                dp_start: r.dp_start,
                dp_size: r.dp_size,
            }));
        }
        out
    }

    fn loads(&self, f: &Filter) -> Vec<LoadInfo> {
        let mut out = Vec::new();
        for (key, t) in self.trackers.iter().filter(|(k, _)| k.matches(f)) {
            out.extend(t.loads().into_iter().map(|(r, l)| LoadInfo {
                model_name: key.model_name.clone(),
                routing_group: key.routing_group.clone(),
                worker_id: r.worker_id,
                dp_rank: r.dp_rank,
                active_prefill_tokens: l.active_prefill_tokens,
                active_decode_blocks: l.active_decode_blocks,
            }));
        }
        out
    }

    /// [`Self::step`] now, when there is a tracker to step (the drain loop calls it
    /// every pass; without trackers it reads no clock).
    pub fn step_if_any(&mut self) -> bool {
        !self.trackers.is_empty() && self.step(Instant::now())
    }

    /// One bounded step (about [`STEP_BLOCKS`] blocks and bookings) of giving
    /// back freed blocks and of expiring the requests older than the TTL, oldest
    /// first; whether work is left for another step.
    pub fn step(&mut self, now: Instant) -> bool {
        let cutoff = now.checked_sub(self.ttl);
        let mut budget = STEP_BLOCKS;
        let mut more = false;
        for t in self.trackers.values_mut() {
            if budget == 0 {
                more |= t.pending(cutoff);
                continue;
            }
            let (expired, left) = t.step(cutoff, &mut budget);
            self.expired += expired;
            more |= left;
        }
        more
    }

    /// Figures for `/metrics`: per tracker, and per rank while this shard holds at
    /// most [`SlotLimits::metrics_max_ranks`] ranks (the series stay few).
    pub fn stats(&mut self, now: Instant) -> SlotStats {
        self.step(now);
        let total: usize = self.trackers.values().map(Tracker::rank_count).sum();
        let mut ranks = Vec::new();
        let mut trackers = Vec::new();
        for (key, t) in &self.trackers {
            if total <= self.limits.metrics_max_ranks {
                ranks.extend(t.loads().into_iter().map(|(rank, load)| RankStat {
                    key: key.clone(),
                    rank,
                    load,
                }));
            }
            trackers.push(TrackerStat {
                key: key.clone(),
                ranks: t.rank_count(),
                load: t.total_load(),
            });
        }
        SlotStats {
            ranks,
            trackers,
            refused: self.refused,
            metrics_max_ranks: self.limits.metrics_max_ranks,
            expired: self.expired,
            sync: self.links.as_ref().map(|l| l.counts()),
        }
    }
}

#[cfg(test)]
mod tests;
