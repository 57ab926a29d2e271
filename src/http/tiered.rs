//! `POST /query_tiered_by_hash`: the tiered lookup Dynamo's router (frontend and
//! standalone selection service, `--remote-indexer-url`) asks a standalone indexer
//! for, answered in dynamo-kv-router's `WireTieredMatchDetails` shape.
//!
//! Owns the request's parsing; the walk itself is [`crate::score::tiered`], the
//! answer's bytes [`json::tiered`]. Never touches shard memory: the shards are asked
//! through [`ShardMesh::lookup`] as for `/query_by_hash`.

use super::Reply;
use super::context::Ctx;
use super::error::{ApiError, parse};
use super::json;
use super::scope::{HashNum, Named, Scope, named, resolve_named};
use crate::mesh::ShardMesh;
use crate::score;
use crate::shard::PromptBlocks;
use crate::types::{BlockHash, WorkerSlot};
use hyper::StatusCode;
use serde::Deserialize;
use std::sync::Arc;

#[derive(Deserialize)]
struct TieredReq {
    /// Dynamo local block hashes (its router sends them as i64).
    block_hashes: Option<Vec<HashNum>>,
    /// Only the device match (dynamo-kv-router's `IndexerQueryRequest`).
    #[serde(default)]
    device_only: bool,
    #[serde(flatten)]
    scope: Scope,
}

/// Dynamo's names of [`score::LOWER_TIERS`], in its walk order.
const LOWER_TIER_NAMES: [&str; 3] = ["host_pinned", "disk", "external"];

/// A request as parsed and checked before the registry is asked: its hashes, and
/// its scope with the names taken out (for [`super::routes::check_body`] too).
pub(super) struct Checked {
    hashes: Vec<HashNum>,
    device_only: bool,
    named: Named,
    scope: Scope,
}

pub(super) fn check(body: &[u8]) -> Result<Checked, ApiError> {
    let mut r: TieredReq = parse(body)?;
    let hashes = r.block_hashes.ok_or_else(|| ApiError::Field {
        field: "block_hashes".into(),
        msg: "missing field `block_hashes`".into(),
    })?;
    // Always Dynamo's shape: its router is the client.
    let named = named(&mut r.scope, Some(super::scope::Shape::Dynamo))?;
    Ok(Checked {
        hashes,
        device_only: r.device_only,
        named,
        scope: r.scope,
    })
}

pub async fn query_tiered_by_hash<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    body: &[u8],
) -> Result<Reply, ApiError> {
    let Checked {
        hashes,
        device_only,
        named,
        scope,
    } = check(body)?;
    let t = resolve_named(cx, named, scope)?;
    let ix = &t.ix;
    let prompt = PromptBlocks::Locals(hashes.iter().map(|h| BlockHash(h.0)).collect());
    let merged = score::merge(
        cx.mesh
            .lookup(ix.id, ix.slots.len(), Arc::new(prompt))
            .await?,
    );
    // Dynamo's workers are integers: one registered by name has no id to send, and
    // is left out of the frequencies too.
    let live = |s: WorkerSlot| {
        let info = ix.slot(s);
        info.live
            && u64::try_from(info.instance).is_ok()
            && t.only.is_none_or(|i| i == info.instance)
    };
    let overlap = score::gather(&merged, ix.slots.len(), live);
    let tiers = score::tiered(&merged, ix.slots.len(), live);
    let body = json::tiered(
        ix,
        &overlap.frequencies,
        &tiers,
        &LOWER_TIER_NAMES,
        device_only,
    );
    Ok(json::bytes(StatusCode::OK, body))
}
