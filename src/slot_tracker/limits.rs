//! What a slot tracker refuses: Dynamo's errors, and kvix's own bounds on what
//! the trackers hold ([`SlotLimits`]), each refusal counted.
//!
//! Owns the wording of every refusal. Must never decide one: the trackers
//! check their rules and bounds and answer with these.

use super::{MAX_DP_RANKS, Rank, WorkerId};
use thiserror::Error;

/// Why a slot-tracker call is refused, worded as Dynamo words it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SlotError {
    #[error("block_size must be greater than 0")]
    InvalidBlockSize,
    #[error("dp_size must be greater than 0")]
    InvalidDpSize,
    #[error("dp_size {dp_size} exceeds the maximum {MAX_DP_RANKS}")]
    DpSizeTooLarge { dp_size: u32 },
    #[error("dp range overflows u32: start={dp_start} size={dp_size}")]
    InvalidDpRange { dp_start: u32, dp_size: u32 },
    #[error(
        "block_size mismatch for model={model_name} routing_group={routing_group}: existing={existing}, requested={requested}"
    )]
    BlockSizeMismatch {
        model_name: String,
        routing_group: String,
        existing: u32,
        requested: u32,
    },
    #[error(
        "worker {worker_id} already registered for model={model_name} routing_group={routing_group}"
    )]
    DuplicateWorker {
        worker_id: WorkerId,
        model_name: String,
        routing_group: String,
    },
    #[error("worker {worker_id} not found for model={model_name} routing_group={routing_group}")]
    WorkerNotFound {
        worker_id: WorkerId,
        model_name: String,
        routing_group: String,
    },
    #[error("no slot tracker for model={model_name} routing_group={routing_group}")]
    TrackerNotFound {
        model_name: String,
        routing_group: String,
    },
    #[error("Worker WorkerWithDpRank {{ worker_id: {}, dp_rank: {} }} not found", .0.worker_id, .0.dp_rank)]
    RankNotFound(Rank),
    #[error(
        "Request {request_id} already exists (assigned to worker WorkerWithDpRank {{ worker_id: {}, dp_rank: {} }})",
        .rank.worker_id, .rank.dp_rank
    )]
    DuplicateRequest { request_id: String, rank: Rank },
    #[error("Request {0} not found")]
    RequestNotFound(String),
    #[error(
        "sequence_hashes holds {blocks} blocks, more than the {max} one booking may hold (raise --slot-max-booking-blocks)"
    )]
    BookingTooLarge { blocks: usize, max: usize },
    #[error(
        "worker {} dp_rank {} would hold {blocks} active blocks, more than the {max} one rank may hold (raise --slot-max-rank-blocks)",
        .rank.worker_id, .rank.dp_rank
    )]
    RankFull {
        rank: Rank,
        blocks: usize,
        max: usize,
    },
    #[error(
        "the tracker holds {max} booked requests, as many as it may (raise --slot-max-bookings)"
    )]
    TooManyBookings { max: usize },
    #[error(
        "the tracker's bookings would name {blocks} blocks, more than the {max} it may hold (raise --slot-max-tracker-blocks)"
    )]
    TrackerFull { blocks: usize, max: usize },
}

impl SlotError {
    /// For a refusal by one of kvix's bounds: the field it is about, the bound and
    /// the flag that raises it.
    pub fn limit(&self) -> Option<(&'static str, usize, &'static str)> {
        match self {
            SlotError::BookingTooLarge { max, .. } => {
                Some(("sequence_hashes", *max, "--slot-max-booking-blocks"))
            }
            SlotError::RankFull { max, .. } => {
                Some(("sequence_hashes", *max, "--slot-max-rank-blocks"))
            }
            SlotError::TooManyBookings { max } => Some(("request_id", *max, "--slot-max-bookings")),
            SlotError::TrackerFull { max, .. } => {
                Some(("sequence_hashes", *max, "--slot-max-tracker-blocks"))
            }
            _ => None,
        }
    }
}

/// Bounds on what the slot trackers hold and report, beyond Dynamo's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLimits {
    /// Sequence hashes one `/add` may book.
    pub max_booking_blocks: usize,
    /// Active decode blocks one rank may hold.
    pub max_rank_blocks: usize,
    /// Requests booked and not freed, per tracker.
    pub max_bookings: usize,
    /// Blocks the booked requests' paths name, per tracker (shared prefixes once
    /// per booking: what the bookings keep in memory).
    pub max_tracker_blocks: usize,
    /// Registered ranks (over every tracker) up to which `/metrics` has per-rank
    /// series; above, per-tracker ones only.
    pub metrics_max_ranks: usize,
}

/// The defaults of `--slot-max-booking-blocks`, `--slot-max-rank-blocks`,
/// `--slot-max-bookings` and `--slot-metrics-max-ranks`.
impl Default for SlotLimits {
    fn default() -> Self {
        SlotLimits {
            max_booking_blocks: 1 << 17,
            max_rank_blocks: 1 << 20,
            max_bookings: 1 << 16,
            max_tracker_blocks: 1 << 24,
            metrics_max_ranks: 1024,
        }
    }
}

/// Refusals by [`SlotLimits`], since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refused {
    pub booking_blocks: u64,
    pub rank_blocks: u64,
    pub bookings: u64,
    pub tracker_blocks: u64,
}

/// Counts a refusal by the bounds in `refused`.
pub(super) fn count(refused: &mut Refused, r: &Result<(), SlotError>) {
    match r {
        Err(SlotError::BookingTooLarge { .. }) => refused.booking_blocks += 1,
        Err(SlotError::RankFull { .. }) => refused.rank_blocks += 1,
        Err(SlotError::TooManyBookings { .. }) => refused.bookings += 1,
        Err(SlotError::TrackerFull { .. }) => refused.tracker_blocks += 1,
        _ => {}
    }
}
