//! One slot tracker: the workers of one (model, routing group) and the requests a
//! router booked on them. Pure state, owned by one shard; never does I/O, never
//! reads a clock of its own (callers pass `now`).
//!
//! Every call costs what it names or answers, never what the tracker holds:
//! booking or freeing walks the booking's path, a read walks the asked path once
//! and then costs its answer (a rank's overlap is a binary search, see
//! [`Tracker::potential`]). Releasing blocks (a free, an expiry, an unregistered
//! worker's bookings) beyond a small amount is queued and done in bounded steps
//! ([`Tracker::step`]) between requests.

use super::{SlotError, SlotLimits};
use crate::types::{DpRank, SeqHash};
use hashbrown::HashMap;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
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

/// A node of the tracker's prompt trie: the block at `hash` under the node `parent`.
type NodeKey = (u64, SeqHash);

/// A prompt block under its whole prefix, the same for every rank of a tracker:
/// counted by the bookings whose path runs through it.
#[derive(Debug)]
struct Node {
    id: u64,
    refs: u32,
}

/// The trie's root: no node has this id.
const ROOT: u64 = 0;

/// What one rank carries: the tracker's nodes its bookings run through, each
/// counted by those bookings. A block shared by several of its bookings (the same
/// hash under the same prefix) is one decode block. The set is closed under
/// prefixes: holding a node means holding its parent.
#[derive(Debug, Default)]
struct RankState {
    nodes: HashMap<u64, u32>,
    /// Exact, however large the bookings' counts: a sum that saturated could not
    /// give back what one booking added.
    prefill_tokens: u128,
    requests: usize,
}

impl RankState {
    fn load(&self) -> RankLoad {
        RankLoad {
            active_prefill_tokens: saturated(self.prefill_tokens),
            active_decode_blocks: self.nodes.len(),
            active_requests: self.requests,
        }
    }

    /// Blocks of a path already active here, given the path's nodes as far as the
    /// tracker has them ([`Trie::ids`]): the deepest node held, found by binary
    /// search since the held set is closed under prefixes.
    fn overlap(&self, ids: &[u64]) -> usize {
        ids.partition_point(|id| self.nodes.contains_key(id))
    }
}

fn saturated(n: u128) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The prompt paths of every booking of a tracker, as a trie of nodes with ids
/// that ranks name.
#[derive(Debug, Default)]
struct Trie {
    nodes: HashMap<NodeKey, Node>,
    next_id: u64,
}

impl Trie {
    /// The ids of `path`'s nodes, as far as the trie has them.
    fn ids(&self, path: &[SeqHash]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = ROOT;
        for &h in path {
            match self.nodes.get(&(at, h)) {
                Some(n) => {
                    at = n.id;
                    out.push(at);
                }
                None => break,
            }
        }
        out
    }

    /// Blocks of `path`'s prefix that `rank` holds, walking both.
    fn overlap(&self, rank: &RankState, path: &[SeqHash]) -> usize {
        let mut at = ROOT;
        for (depth, &h) in path.iter().enumerate() {
            match self.nodes.get(&(at, h)) {
                Some(n) if rank.nodes.contains_key(&n.id) => at = n.id,
                _ => return depth,
            }
        }
        path.len()
    }

    fn acquire(&mut self, rank: &mut RankState, path: &[SeqHash]) {
        let mut at = ROOT;
        for &h in path {
            let next = &mut self.next_id;
            let node = self.nodes.entry((at, h)).or_insert_with(|| {
                *next += 1;
                Node { id: *next, refs: 0 }
            });
            node.refs += 1;
            at = node.id;
            *rank.nodes.entry(at).or_insert(0) += 1;
        }
    }
}

/// A booking's blocks being given back, in two bounded walks: down the path to find
/// its nodes (changing nothing), then back up giving them back, deepest first, so
/// that a rank's held set stays closed under prefixes while the steps go on (what
/// [`RankState::overlap`]'s binary search needs). Ids are never reused and this
/// booking's references keep its nodes alive, so they stay where they are whatever
/// is booked or freed meanwhile.
#[derive(Debug)]
struct Release {
    /// `None` once its worker unregistered: only the trie is given back (a worker
    /// registered again under the same ranks starts from nothing).
    rank: Option<Rank>,
    path: Vec<SeqHash>,
    /// The path's nodes found so far, root first: (trie key, id).
    found: Vec<(NodeKey, u64)>,
    /// Whether the walk down is over (`found` holds every node there is).
    walked: bool,
}

impl Release {
    fn new(rank: Option<Rank>, path: Vec<SeqHash>) -> Self {
        Release {
            rank,
            path,
            found: Vec::new(),
            walked: false,
        }
    }

    /// Gives back at most `budget` blocks' worth of work; whether it is done.
    fn advance(
        &mut self,
        trie: &mut Trie,
        ranks: &mut HashMap<Rank, RankState>,
        budget: &mut usize,
    ) -> bool {
        while !self.walked {
            let pos = self.found.len();
            if pos == self.path.len() {
                self.walked = true;
                break;
            }
            if *budget == 0 {
                return false;
            }
            *budget -= 1;
            let at = self.found.last().map_or(ROOT, |&(_, id)| id);
            let key = (at, self.path[pos]);
            match trie.nodes.get(&key) {
                Some(node) => self.found.push((key, node.id)),
                None => self.walked = true,
            }
        }
        let mut state = self.rank.and_then(|r| ranks.get_mut(&r));
        while let Some(&(key, id)) = self.found.last() {
            if *budget == 0 {
                return false;
            }
            *budget -= 1;
            self.found.pop();
            if let Some(node) = trie.nodes.get_mut(&key) {
                node.refs -= 1;
                if node.refs == 0 {
                    trie.nodes.remove(&key);
                }
            }
            if let Some(s) = state.as_deref_mut()
                && let hashbrown::hash_map::Entry::Occupied(mut e) = s.nodes.entry(id)
            {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        true
    }
}

/// A booked request.
#[derive(Debug)]
struct Booking {
    rank: Rank,
    path: Vec<SeqHash>,
    /// Prompt tokens still in prefill (0 once complete, or when none were given).
    prefill: usize,
    /// When it was booked, and its place among the bookings of that instant.
    age: (Instant, u64),
}

/// Blocks a free gives back at once (no more than a step's); a larger booking is
/// given back in steps, as expiries are.
const FREE_AT_ONCE: usize = super::STEP_BLOCKS;

/// One (model, routing group)'s workers and bookings.
#[derive(Debug)]
pub struct Tracker {
    block_size: u32,
    workers: BTreeMap<WorkerId, DpRange>,
    ranks: HashMap<Rank, RankState>,
    trie: Trie,
    requests: HashMap<Box<str>, Booking>,
    /// The bookings, oldest first: expiry takes them from the front.
    by_age: BTreeMap<(Instant, u64), Box<str>>,
    next_seq: u64,
    /// Blocks of freed bookings not given back yet, in order.
    releasing: VecDeque<Release>,
    /// Path blocks the bookings and the releases under way keep (bounded by
    /// [`SlotLimits::max_tracker_blocks`]).
    booked_blocks: usize,
}

impl Tracker {
    pub fn new(block_size: u32) -> Self {
        Tracker {
            block_size,
            workers: BTreeMap::new(),
            ranks: HashMap::new(),
            trie: Trie::default(),
            requests: HashMap::new(),
            by_age: BTreeMap::new(),
            next_seq: 0,
            booked_blocks: 0,
            releasing: VecDeque::new(),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Registered ranks.
    pub fn rank_count(&self) -> usize {
        self.ranks.len()
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
    /// was not registered. Their blocks leave the trie in steps.
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
        let gone: Vec<Box<str>> = self
            .requests
            .iter()
            .filter(|(_, b)| b.rank.worker_id == worker)
            .map(|(id, _)| id.clone())
            .collect();
        // Releases under way no longer touch these ranks: a worker registered
        // again under them must not lose what it books anew.
        for r in &mut self.releasing {
            if r.rank.is_some_and(|rank| rank.worker_id == worker) {
                r.rank = None;
            }
        }
        for id in gone {
            if let Some(b) = self.requests.remove(&id) {
                self.by_age.remove(&b.age);
                self.releasing.push_back(Release::new(None, b.path));
            }
        }
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
    /// `prefill_tokens` (if any) count until its prefill completes. Within
    /// Dynamo's rules, `limits` bound what one booking, one rank and the tracker
    /// hold.
    pub fn add(
        &mut self,
        request_id: &str,
        rank: Rank,
        path: Vec<SeqHash>,
        prefill_tokens: usize,
        now: Instant,
        limits: &SlotLimits,
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
        if path.len() > limits.max_booking_blocks {
            return Err(SlotError::BookingTooLarge {
                blocks: path.len(),
                max: limits.max_booking_blocks,
            });
        }
        if self.requests.len() >= limits.max_bookings {
            return Err(SlotError::TooManyBookings {
                max: limits.max_bookings,
            });
        }
        let booked = self.booked_blocks + path.len();
        if booked > limits.max_tracker_blocks {
            return Err(SlotError::TrackerFull {
                blocks: booked,
                max: limits.max_tracker_blocks,
            });
        }
        let blocks = state.nodes.len() + (path.len() - self.trie.overlap(state, &path));
        if blocks > limits.max_rank_blocks {
            return Err(SlotError::RankFull {
                rank,
                blocks,
                max: limits.max_rank_blocks,
            });
        }
        self.trie.acquire(state, &path);
        self.booked_blocks = booked;
        state.prefill_tokens += prefill_tokens as u128;
        state.requests += 1;
        self.next_seq += 1;
        let age = (now, self.next_seq);
        let id: Box<str> = request_id.into();
        self.by_age.insert(age, id.clone());
        self.requests.insert(
            id,
            Booking {
                rank,
                path,
                prefill: prefill_tokens,
                age,
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
            state.prefill_tokens -= b.prefill as u128;
        }
        b.prefill = 0;
        Ok(b.rank)
    }

    /// The request is done: its blocks and tokens stop counting. An unknown (or
    /// already freed) request is no error. Returns where it was booked.
    pub fn free(&mut self, request_id: &str) -> Option<Rank> {
        let rank = self.drop_booking(request_id)?;
        // A small booking's blocks go at once, so that the next read sees them gone;
        // releases are independent of each other's order.
        if self
            .releasing
            .back()
            .is_some_and(|r| r.path.len() <= FREE_AT_ONCE)
            && let Some(mut r) = self.releasing.pop_back()
        {
            let mut all = usize::MAX;
            r.advance(&mut self.trie, &mut self.ranks, &mut all);
            self.booked_blocks -= r.path.len();
        }
        Some(rank)
    }

    /// Takes the booking out: its tokens and request stop counting now, its
    /// blocks are queued to be given back.
    fn drop_booking(&mut self, request_id: &str) -> Option<Rank> {
        let b = self.requests.remove(request_id)?;
        self.by_age.remove(&b.age);
        if let Some(state) = self.ranks.get_mut(&b.rank) {
            state.prefill_tokens -= b.prefill as u128;
            state.requests -= 1;
        }
        self.releasing.push_back(Release::new(Some(b.rank), b.path));
        Some(b.rank)
    }

    /// Whether `request_id` is booked before `cutoff`: if so it is freed now, as
    /// its expiry would have, and `true`.
    pub fn expire_one(&mut self, request_id: &str, cutoff: Instant) -> bool {
        let stale = self
            .requests
            .get(request_id)
            .is_some_and(|b| b.age.0 < cutoff);
        if stale {
            self.free(request_id);
        }
        stale
    }

    fn step_releases(&mut self, budget: &mut usize) {
        while let Some(r) = self.releasing.front_mut() {
            if !r.advance(&mut self.trie, &mut self.ranks, budget) {
                return;
            }
            self.booked_blocks -= r.path.len();
            self.releasing.pop_front();
        }
    }

    /// One bounded step of giving back blocks and of freeing the requests booked
    /// before `cutoff` (oldest first): at most `budget` blocks and bookings.
    /// Returns how many requests expired, and whether work is left.
    pub fn step(&mut self, cutoff: Option<Instant>, budget: &mut usize) -> (u64, bool) {
        let mut expired = 0;
        loop {
            self.step_releases(budget);
            if *budget == 0 {
                break;
            }
            let Some(entry) = self.by_age.first_entry() else {
                break;
            };
            if cutoff.is_none_or(|c| entry.key().0 >= c) {
                break;
            }
            let id = entry.remove();
            *budget -= 1;
            self.drop_booking(&id);
            expired += 1;
        }
        (expired, self.pending(cutoff))
    }

    /// Whether blocks are left to give back or requests to expire.
    pub fn pending(&self, cutoff: Option<Instant>) -> bool {
        !self.releasing.is_empty()
            || cutoff.is_some_and(|c| self.by_age.first_key_value().is_some_and(|(k, _)| k.0 < c))
    }

    /// Every registered rank's load, by worker then rank.
    pub fn loads(&self) -> Vec<(Rank, RankLoad)> {
        let mut out: Vec<(Rank, RankLoad)> =
            self.ranks.iter().map(|(r, s)| (*r, s.load())).collect();
        out.sort_unstable_by_key(|(r, _)| *r);
        out
    }

    /// Every rank's load summed (saturating).
    pub fn total_load(&self) -> RankLoad {
        self.ranks.values().fold(RankLoad::default(), |t, s| {
            let l = s.load();
            RankLoad {
                active_prefill_tokens: t
                    .active_prefill_tokens
                    .saturating_add(l.active_prefill_tokens),
                active_decode_blocks: t.active_decode_blocks + l.active_decode_blocks,
                active_requests: t.active_requests + l.active_requests,
            }
        })
    }

    /// What every rank would carry if a request with prompt `path` and
    /// `new_tokens` prompt tokens were booked on it: its prefill tokens plus
    /// `new_tokens`, its decode blocks plus the prompt's blocks beyond the prefix
    /// already active there. The path is walked once; each rank then costs a
    /// binary search over it.
    pub fn potential(&self, path: &[SeqHash], new_tokens: usize) -> Vec<PotentialLoad> {
        let ids = self.trie.ids(path);
        let mut out: Vec<PotentialLoad> = self
            .ranks
            .iter()
            .map(|(r, s)| PotentialLoad {
                worker_id: r.worker_id,
                dp_rank: r.dp_rank,
                potential_prefill_tokens: saturated(s.prefill_tokens + new_tokens as u128),
                potential_decode_blocks: s.nodes.len() + (path.len() - s.overlap(&ids)),
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
