//! `POST /speculate`: a router's routing decision, as short-lived predicted holders.
//!
//! Owns the request shape and its flow: parse → the index and the worker's slot →
//! hash the prompt's blocks → one `Predict` op per block, on the shard owning it
//! ([`ShardMesh::predict`]) → `{"predicted_blocks", "ttl_ms"}`. Until its TTL ends or
//! the worker's `BlockStored` confirms it, a predicted block scores as held on the
//! worker's device in every query route. Models named by `--approximate` (no events)
//! get their index created on first use, the router TTL and a prune bound. A
//! registry write (a new index or slot) runs off the executor; nothing here blocks.

use super::Reply;
use super::api::{HashNum, InstanceRef, Named, Scope, TokenIds, index_for, known_instance, named};
use super::error::{ApiError, parse as parse_json};
use super::json;
use crate::hash;
use crate::mesh::ShardMesh;
use crate::registry::IndexInfo;
use crate::shard::PruneBound;
use crate::shard::predict::deadline_after;
use crate::types::{BlockHash, DpRank, InstanceId, WorkerSlot};
use hyper::StatusCode;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// Longest TTL a request may ask for: an hour (approximate indexes use minutes).
const MAX_TTL_MS: u64 = 3_600_000;

#[derive(Deserialize)]
pub(super) struct SpeculateReq {
    /// Exactly one of `token_ids` and `block_hashes` (Dynamo's local block hashes).
    token_ids: Option<TokenIds>,
    block_hashes: Option<Vec<HashNum>>,
    dp_rank: Option<DpRank>,
    ttl_ms: Option<u64>,
    cache_salt: Option<String>,
    #[serde(flatten)]
    scope: Scope,
}

/// A `/speculate` body, checked as far as it can be without the registry.
pub(super) struct Parsed {
    req: SpeculateReq,
    named: Named,
    instance: InstanceRef,
    input: Input,
}

enum Input {
    Ids(Vec<u32>),
    Locals(Vec<BlockHash>),
}

/// Parse and check a body: one input, an instance, a TTL in range, a model.
pub(super) fn parse(body: &[u8]) -> Result<Parsed, ApiError> {
    let mut req: SpeculateReq = parse_json(body)?;
    let input = match (req.token_ids.take(), req.block_hashes.take()) {
        (Some(ids), None) => Input::Ids(ids.0),
        (None, Some(h)) => Input::Locals(h.into_iter().map(|h| BlockHash(h.0)).collect()),
        (None, None) => {
            return Err(ApiError::Field {
                field: "token_ids".into(),
                msg: "missing field `token_ids` (or `block_hashes`)".into(),
            });
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::Field {
                field: "block_hashes".into(),
                msg: "a speculation carries one of `token_ids` and `block_hashes`".into(),
            });
        }
    };
    if let Some(t) = req.ttl_ms
        && !(1..=MAX_TTL_MS).contains(&t)
    {
        return Err(ApiError::Field {
            field: "ttl_ms".into(),
            msg: format!("must lie in 1..={MAX_TTL_MS}"),
        });
    }
    let instance = req
        .scope
        .instance_id
        .take()
        .ok_or_else(|| ApiError::Field {
            field: "instance_id".into(),
            msg: "missing field `instance_id` (the worker the request was routed to)".into(),
        })?;
    let named = named(&mut req.scope, None)?;
    Ok(Parsed {
        req,
        named,
        instance,
        input,
    })
}

pub async fn speculate<M: ShardMesh>(mesh: &M, body: &[u8]) -> Result<Reply, ApiError> {
    let Parsed {
        req,
        named,
        instance,
        input,
    } = parse(body)?;
    let spec = mesh.app().speculation();
    let approximate = spec.is_approximate(&named.model);
    let ix = index(mesh, &named, req.scope.block_size, approximate).await?;
    let dp = req.dp_rank.unwrap_or(0);
    let slot = slot(mesh, &ix, &instance, dp, approximate).await?;

    let mut locals = Vec::new();
    match input {
        Input::Ids(ids) => {
            let seed = hash::block_seed(named.lora.as_deref(), req.cache_salt.as_deref());
            locals.extend(
                ids.chunks_exact(ix.block_size as usize)
                    .map(|c| hash::local_hash(c, seed)),
            );
        }
        Input::Locals(l) => locals = l,
    }
    let predicted = locals.len();

    let default_ttl = if approximate {
        spec.router_ttl
    } else {
        spec.ttl
    };
    let ttl_ms = req.ttl_ms.unwrap_or(default_ttl.as_millis() as u64);
    let expires = deadline_after(Duration::from_millis(ttl_ms));
    let shards = mesh.shards();
    let prune = approximate.then(|| {
        let max = (spec.max_tree_size / shards).max(1);
        PruneBound {
            max,
            target: ((max as f64 * spec.prune_target_ratio) as usize).min(max),
        }
    });
    mesh.predict(ix.id, slot, locals, expires, prune).await?;
    let body = serde_json::json!({
        "predicted_blocks": predicted,
        "ttl_ms": ttl_ms,
    });
    Ok(json::bytes(StatusCode::OK, body.to_string().into_bytes()))
}

/// The index a speculation names: it must exist, unless the model is approximate
/// (then the request's `block_size` creates it).
async fn index<M: ShardMesh>(
    mesh: &M,
    n: &Named,
    block_size: Option<u32>,
    approximate: bool,
) -> Result<Arc<IndexInfo>, ApiError> {
    let ix = match index_for(mesh, &n.model, Some(&n.tenant)) {
        Ok(ix) => ix,
        Err(ApiError::NotFound(_)) if approximate => {
            let bs = block_size.ok_or_else(|| ApiError::Field {
                field: "block_size".into(),
                msg: format!(
                    "the approximate model {} has no index yet: name its block_size",
                    n.model
                ),
            })?;
            let (reg, model, tenant) = (
                mesh.app().registry().clone(),
                n.model.clone(),
                n.tenant.clone(),
            );
            mesh.offload(move || reg.ensure_index(&model, &tenant, bs))
                .await?;
            index_for(mesh, &n.model, Some(&n.tenant))?
        }
        Err(e) => return Err(e),
    };
    if let Some(bs) = block_size
        && bs != ix.block_size
    {
        return Err(ApiError::BadRequest(format!(
            "block_size {bs} does not match block_size {} of the indexer for {}:{}",
            ix.block_size, n.model, n.tenant
        )));
    }
    Ok(ix)
}

/// The slot of (instance, dp rank) in `ix`, made if new (within the event-data
/// limits). An approximate model's workers may be named before any registration.
async fn slot<M: ShardMesh>(
    mesh: &M,
    ix: &IndexInfo,
    instance: &InstanceRef,
    dp: DpRank,
    approximate: bool,
) -> Result<WorkerSlot, ApiError> {
    let id: InstanceId = match instance {
        InstanceRef::Int(i) => InstanceId::from(*i),
        InstanceRef::Name(_) if !approximate => known_instance(mesh, instance)?,
        InstanceRef::Name(_) => {
            let (reg, key) = (mesh.app().registry().clone(), instance.key());
            mesh.offload(move || reg.intern(&key)).await
        }
    };
    if let Some(&s) = ix.slot_of.get(&(id, dp))
        && ix.slot(s).live
    {
        return Ok(s);
    }
    let (reg, index) = (mesh.app().registry().clone(), ix.id);
    Ok(mesh.offload(move || reg.slot_for(index, id, dp)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(body: &str) -> String {
        match parse(body.as_bytes()) {
            Err(ApiError::Field { field, .. }) => field,
            Err(e) => panic!("{body}: {e}"),
            Ok(_) => panic!("{body}: accepted"),
        }
    }

    #[test]
    fn a_body_names_its_faulty_field() {
        assert_eq!(field(r#"{"model_name":"m","instance_id":1}"#), "token_ids");
        assert_eq!(
            field(r#"{"model_name":"m","instance_id":1,"token_ids":[1],"block_hashes":[2]}"#),
            "block_hashes"
        );
        assert_eq!(
            field(r#"{"model_name":"m","token_ids":[1]}"#),
            "instance_id"
        );
        assert_eq!(
            field(r#"{"model_name":"m","instance_id":1,"token_ids":[1],"ttl_ms":0}"#),
            "ttl_ms"
        );
        assert_eq!(field(r#"{"instance_id":1,"token_ids":[1]}"#), "model_name");
        assert_eq!(
            field(r#"{"model_name":"m","instance_id":1,"token_ids":[-1]}"#),
            "token_ids"
        );
        assert!(
            parse(br#"{"model_name":"m","instance_id":"w1","dp_rank":2,"block_hashes":["0x1f",-3],"ttl_ms":500}"#)
                .is_ok()
        );
    }
}
