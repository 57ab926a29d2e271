//! What the layers above ask of the executor mesh, as one narrow trait.
//!
//! [`ShardMesh`] is implemented by the runtime (one per executor) and used by the HTTP
//! handlers, the exports (`/dump`, snapshots) and `/metrics`. It names operations, not
//! glommio: scatter/gather lookups, per-shard exports and figures, running blocking
//! control work off the executor, and timers. Implementations must never block the
//! calling executor.

use crate::metrics::{HttpStats, ShardStats};
use crate::shard::{ChainAt, PredictRefused, PredictStep, PruneBound, ShardExport};
use crate::shard::{PromptBlocks, ShardReply};
use crate::slot_tracker::{SlotRep, SlotReq};
use crate::types::{IndexId, ShardId};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// A shard did not answer its part of a request (its executor is gone or its reply
/// was lost). Callers fail the request rather than answer with a part missing.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("shard {} did not answer", .0.0)]
pub struct ShardUnavailable(pub ShardId);

pub trait ShardMesh {
    /// This executor's HTTP figures (executor-local, gathered on scrape).
    fn http_stats(&self) -> &RefCell<HttpStats>;

    /// The holders of the prompt's blocks, one reply per shard that can hold one
    /// of the index's first `slots` slots ([`crate::partition::Partition::holds_any`]): the
    /// others are not asked.
    fn lookup(
        &self,
        index: IndexId,
        slots: usize,
        prompt: Arc<PromptBlocks>,
    ) -> impl Future<Output = Result<Vec<ShardReply>, ShardUnavailable>>;

    /// Every (block, holder) of one index held by one shard, after the shard applied
    /// what its rings hold, in the steps the shard read it in (joining them is a
    /// copy of the whole index, for a thread off the executor), and how the shard's
    /// slots name those blocks ([`crate::shard::Shard::engine_names`]) and their
    /// other KV-cache groups ([`crate::shard::Shard::group_specs`]).
    fn export(
        &self,
        shard: ShardId,
        index: IndexId,
    ) -> impl Future<Output = Result<ShardExport, ShardUnavailable>>;

    /// One step of a prediction ([`crate::shard::Shard::predict_step`]) on the
    /// shard owning its slot; with `prune`, every shard bounds the index first.
    /// Returns once that shard applied it (so a query sent after sees it), with
    /// where the step ended or why the shard refused the prediction.
    fn predict(
        &self,
        index: IndexId,
        step: PredictStep,
        prune: Option<PruneBound>,
    ) -> impl Future<Output = Result<Result<ChainAt, PredictRefused>, ShardUnavailable>>;

    /// A slot-tracker call ([`crate::slot_tracker`]), answered by the shard that owns its
    /// tracker, or by every shard (one answer each) for a call that names none.
    fn slot_tracker(
        &self,
        req: SlotReq,
    ) -> impl Future<Output = Result<Vec<SlotRep>, ShardUnavailable>>;

    /// Every shard's figures.
    fn stats(&self) -> impl Future<Output = Result<Vec<ShardStats>, ShardUnavailable>>;

    /// Number of shards.
    fn shards(&self) -> usize;

    /// Run blocking work (control calls that wait on ingest threads, CPU-heavy
    /// ordering) off the executor; the executor keeps serving meanwhile.
    fn offload<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> impl Future<Output = R>;

    /// A timer on this executor.
    fn sleep(&self, d: Duration) -> impl Future<Output = ()>;

    /// Pauses that let requests that arrived meanwhile be served before a long job
    /// goes on (a yield does not: connections are only heard from when the executor
    /// waits). Outlives the mesh borrow, so a response body can pause between chunks.
    fn pauser(&self) -> impl Fn() -> Pin<Box<dyn Future<Output = ()>>> + 'static;
}
