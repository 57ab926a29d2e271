//! One slot tracker: the workers of one (model, routing group) and the requests a
//! router booked on them. Pure state, owned by one shard; never does I/O, never
//! reads a clock of its own (callers pass `now`).

use super::SlotError;
use crate::types::{DpRank, SeqHash};
use hashbrown::HashMap;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// A worker id as the slot-tracker API names it.
pub type WorkerId = u64;

/// Most dp ranks one worker may register (Dynamo's bound).
pub const MAX_DP_RANKS: u32 = 4096;

/// One registered worker and its dp ranks `dp_start..dp_start + dp_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpRange {
    pub dp_start: DpRank,
    pub dp_size: u32,
}

impl DpRange {
    /// Dynamo's checks, in Dynamo's order.
    pub fn checked(dp_start: DpRank, dp_size: u32) -> Result<Self, SlotError> {
        if dp_size == 0 {
            return Err(SlotError::InvalidDpSize);
        }
        if dp_size > MAX_DP_RANKS {
            return Err(SlotError::DpSizeTooLarge { dp_size });
        }
        if dp_start.checked_add(dp_size).is_none() {
            return Err(SlotError::InvalidDpRange { dp_start, dp_size });
        }
        Ok(DpRange { dp_start, dp_size })
    }

    fn ranks(self) -> impl Iterator<Item = DpRank> {
        self.dp_start..self.dp_start + self.dp_size
    }
}

/// A (worker, dp rank): where a request is booked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rank {
    pub worker_id: WorkerId,
    pub dp_rank: DpRank,
}

/// What a rank carries now (`/loads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankLoad {
    pub active_prefill_tokens: usize,
    pub active_decode_blocks: usize,
    pub active_requests: usize,
}

/// What a rank would carry with one more request (`/potential_loads`), fields in
/// Dynamo's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PotentialLoad {
    pub worker_id: WorkerId,
    pub dp_rank: DpRank,
    pub potential_prefill_tokens: usize,
    pub potential_decode_blocks: usize,
    pub active_requests: usize,
}

/// A node of a rank's prompt trie: the block at `hash` under `parent`.
type NodeKey = (u64, SeqHash);

/// The blocks of a rank's active prompts as a trie of paths, each node counted by
/// the requests whose prompt runs through it. A block shared by several active
/// requests (the same hash under the same parent) is one decode block.
#[derive(Debug, Default)]
struct RankState {
    nodes: HashMap<NodeKey, Node>,
    next_node: u64,
    prefill_tokens: usize,
    requests: usize,
}

#[derive(Debug)]
struct Node {
    id: u64,
    refs: u32,
}

/// The trie's root: no node has this id.
const ROOT: u64 = 0;

impl RankState {
    fn acquire(&mut self, path: &[SeqHash]) {
        let mut at = ROOT;
        for &h in path {
            let next = &mut self.next_node;
            let node = self.nodes.entry((at, h)).or_insert_with(|| {
                *next += 1;
                Node { id: *next, refs: 0 }
            });
            node.refs += 1;
            at = node.id;
        }
    }

    fn release(&mut self, path: &[SeqHash]) {
        let mut at = ROOT;
        for &h in path {
            let key = (at, h);
            let Some(node) = self.nodes.get_mut(&key) else {
                return;
            };
            node.refs -= 1;
            // Ids are never reused: the children stay reachable under this id.
            at = node.id;
            if node.refs == 0 {
                self.nodes.remove(&key);
            }
        }
    }

    /// Blocks of `path`'s prefix already active here.
    fn overlap(&self, path: &[SeqHash]) -> usize {
        let mut at = ROOT;
        for (depth, &h) in path.iter().enumerate() {
            match self.nodes.get(&(at, h)) {
                Some(n) => at = n.id,
                None => return depth,
            }
        }
        path.len()
    }

    fn load(&self) -> RankLoad {
        RankLoad {
            active_prefill_tokens: self.prefill_tokens,
            active_decode_blocks: self.nodes.len(),
            active_requests: self.requests,
        }
    }
}

/// A booked request.
#[derive(Debug)]
struct Booking {
    rank: Rank,
    path: Vec<SeqHash>,
    /// Prompt tokens still in prefill (0 once complete, or when none were given).
    prefill: usize,
    at: Instant,
}

/// One (model, routing group)'s workers and bookings.
#[derive(Debug)]
pub struct Tracker {
    block_size: u32,
    workers: BTreeMap<WorkerId, DpRange>,
    ranks: HashMap<Rank, RankState>,
    requests: HashMap<Box<str>, Booking>,
}

impl Tracker {
    pub fn new(block_size: u32) -> Self {
        Tracker {
            block_size,
            workers: BTreeMap::new(),
            ranks: HashMap::new(),
            requests: HashMap::new(),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Registers `worker` with its ranks, which start empty; `false` if it is
    /// registered already. The caller checked the block size.
    pub fn register(&mut self, worker: WorkerId, range: DpRange) -> bool {
        if self.workers.contains_key(&worker) {
            return false;
        }
        self.workers.insert(worker, range);
        for dp_rank in range.ranks() {
            let rank = Rank {
                worker_id: worker,
                dp_rank,
            };
            self.ranks.insert(rank, RankState::default());
        }
        true
    }

    /// Drops `worker`, its ranks and every request booked on them; `false` if it
    /// was not registered.
    pub fn unregister(&mut self, worker: WorkerId) -> bool {
        let Some(range) = self.workers.remove(&worker) else {
            return false;
        };
        for dp_rank in range.ranks() {
            self.ranks.remove(&Rank {
                worker_id: worker,
                dp_rank,
            });
        }
        self.requests.retain(|_, b| b.rank.worker_id != worker);
        true
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The registered workers, by id.
    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, DpRange)> + '_ {
        self.workers.iter().map(|(w, r)| (*w, *r))
    }

    /// Books `request_id` on `rank`: its prompt's blocks become active there, and
    /// `prefill_tokens` (if any) count until its prefill completes.
    pub fn add(
        &mut self,
        request_id: &str,
        rank: Rank,
        path: Vec<SeqHash>,
        prefill_tokens: usize,
        now: Instant,
    ) -> Result<(), SlotError> {
        let Some(state) = self.ranks.get_mut(&rank) else {
            return Err(SlotError::RankNotFound(rank));
        };
        if let Some(b) = self.requests.get(request_id) {
            return Err(SlotError::DuplicateRequest {
                request_id: request_id.to_string(),
                rank: b.rank,
            });
        }
        state.acquire(&path);
        state.prefill_tokens = state.prefill_tokens.saturating_add(prefill_tokens);
        state.requests += 1;
        self.requests.insert(
            request_id.into(),
            Booking {
                rank,
                path,
                prefill: prefill_tokens,
                at: now,
            },
        );
        Ok(())
    }

    /// The request's prefill is done: its prompt tokens stop counting. Repeating it
    /// is no error while the request is booked. Returns where it is booked.
    pub fn prefill_complete(&mut self, request_id: &str) -> Result<Rank, SlotError> {
        let Some(b) = self.requests.get_mut(request_id) else {
            return Err(SlotError::RequestNotFound(request_id.to_string()));
        };
        if let Some(state) = self.ranks.get_mut(&b.rank) {
            state.prefill_tokens = state.prefill_tokens.saturating_sub(b.prefill);
        }
        b.prefill = 0;
        Ok(b.rank)
    }

    /// The request is done: its blocks and tokens stop counting. An unknown (or
    /// already freed) request is no error. Returns where it was booked.
    pub fn free(&mut self, request_id: &str) -> Option<Rank> {
        let b = self.requests.remove(request_id)?;
        let rank = b.rank;
        self.release(b);
        Some(rank)
    }

    fn release(&mut self, b: Booking) {
        if let Some(state) = self.ranks.get_mut(&b.rank) {
            state.release(&b.path);
            state.prefill_tokens = state.prefill_tokens.saturating_sub(b.prefill);
            state.requests -= 1;
        }
    }

    /// Frees every request booked before `cutoff`; returns how many.
    pub fn expire(&mut self, cutoff: Instant) -> u64 {
        let old: Vec<Box<str>> = self
            .requests
            .iter()
            .filter(|(_, b)| b.at < cutoff)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &old {
            if let Some(b) = self.requests.remove(id) {
                self.release(b);
            }
        }
        old.len() as u64
    }

    /// Every registered rank's load, by worker then rank.
    pub fn loads(&self) -> Vec<(Rank, RankLoad)> {
        let mut out: Vec<(Rank, RankLoad)> =
            self.ranks.iter().map(|(r, s)| (*r, s.load())).collect();
        out.sort_unstable_by_key(|(r, _)| *r);
        out
    }

    /// What every rank would carry if a request with prompt `path` and
    /// `new_tokens` prompt tokens were booked on it: its prefill tokens plus
    /// `new_tokens`, its decode blocks plus the prompt's blocks beyond the prefix
    /// already active there.
    pub fn potential(&self, path: &[SeqHash], new_tokens: usize) -> Vec<PotentialLoad> {
        let mut out: Vec<PotentialLoad> = self
            .ranks
            .iter()
            .map(|(r, s)| PotentialLoad {
                worker_id: r.worker_id,
                dp_rank: r.dp_rank,
                potential_prefill_tokens: s.prefill_tokens.saturating_add(new_tokens),
                potential_decode_blocks: s.nodes.len() + (path.len() - s.overlap(path)),
                active_requests: s.requests,
            })
            .collect();
        out.sort_unstable_by_key(|p| (p.worker_id, p.dp_rank));
        out
    }

    /// Booked requests and active decode blocks, over every rank.
    pub fn totals(&self) -> (usize, usize) {
        let blocks = self.ranks.values().map(|s| s.nodes.len()).sum();
        (self.requests.len(), blocks)
    }
}
