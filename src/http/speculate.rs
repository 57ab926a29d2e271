//! `POST /speculate`: a router's routing decision, as short-lived predicted holders.
//!
//! Owns the request shape and its flow: parse → the index and the registered
//! worker's slot → hash the prompt's blocks → steps of at most [`PREDICT_STEP`]
//! blocks on the shard owning the slot ([`ShardMesh::predict`]), the executors
//! serving between them → `{"predicted_blocks", "ttl_ms"}`. Until its TTL ends or
//! the worker's `BlockStored` confirms it, a predicted block scores as held on the
//! worker's device in every query route. Models named by `--approximate` (no events)
//! get their index and workers created on first use, the router TTL and a prune
//! bound. A large body is parsed and hashed, and a registry write (a new index or
//! slot) made, off the executor; nothing here blocks.

use super::Reply;
use super::context::Ctx;
use super::error::{ApiError, parse as parse_json};
use super::json;
use super::scope::{HashNum, InstanceRef, Named, Scope, TokenIds, named};
use crate::hash;
use crate::mesh::ShardMesh;
use crate::registry::IndexInfo;
use crate::shard::predict::deadline_after;
use crate::shard::{ChainAt, PREDICT_STEP, PredictRefused, PredictStep, PruneBound};
use crate::types::{BlockHash, DpRank, InstanceId, WorkerSlot};
use bytes::Bytes;
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
    /// P/D disaggregation: the prefill worker the request was also routed to, which
    /// will hold the same blocks (its dp rank defaults to 0).
    prefill_instance_id: Option<InstanceRef>,
    prefill_dp_rank: Option<DpRank>,
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
    if req.prefill_dp_rank.is_some() && req.prefill_instance_id.is_none() {
        return Err(ApiError::Field {
            field: "prefill_instance_id".into(),
            msg: "`prefill_dp_rank` names the rank of a `prefill_instance_id`".into(),
        });
    }
    let named = named(&mut req.scope, None)?;
    Ok(Parsed {
        req,
        named,
        instance,
        input,
    })
}

/// Bodies longer than this are parsed and hashed off the executor: a body of
/// megabytes takes it tens of milliseconds, which the executor's other
/// connections would wait.
const PARSE_OFF_EXECUTOR: usize = 64 * 1024;

/// A parsed body and its blocks' local hashes (`block_size` blocks of token ids
/// hashed once the index is known).
fn hashed(mut p: Parsed, block_size: usize) -> (Parsed, Vec<BlockHash>) {
    let locals = match std::mem::replace(&mut p.input, Input::Locals(Vec::new())) {
        Input::Ids(ids) => {
            let seed = hash::block_seed(p.named.lora.as_deref(), p.req.cache_salt.as_deref());
            ids.chunks_exact(block_size)
                .map(|c| hash::local_hash(c, seed))
                .collect()
        }
        Input::Locals(l) => l,
    };
    (p, locals)
}

pub async fn speculate<M: ShardMesh>(cx: &Ctx<'_, M>, body: Bytes) -> Result<Reply, ApiError> {
    let mesh = cx.mesh;
    let off = body.len() > PARSE_OFF_EXECUTOR;
    let parsed = if off {
        mesh.offload(move || parse(&body)).await?
    } else {
        parse(&body)?
    };
    let spec = cx.speculation();
    let approximate = spec.is_approximate(&parsed.named.model);
    let ix = index(cx, &parsed.named, parsed.req.scope.block_size, approximate).await?;
    let dp = parsed.req.dp_rank.unwrap_or(0);
    let decode = slot(cx, &ix, &parsed.instance, dp, approximate).await?;
    // Both workers are checked before anything is predicted.
    let prefill = match &parsed.req.prefill_instance_id {
        None => None,
        Some(p) => {
            let pdp = parsed.req.prefill_dp_rank.unwrap_or(0);
            let s = slot(cx, &ix, p, pdp, approximate)
                .await
                .map_err(as_prefill)?;
            (s != decode).then_some(s)
        }
    };
    let field = match parsed.input {
        Input::Ids(_) => "token_ids",
        Input::Locals(_) => "block_hashes",
    };
    let bs = ix.block_size as usize;
    let (parsed, locals) = if off {
        mesh.offload(move || hashed(parsed, bs)).await
    } else {
        hashed(parsed, bs)
    };
    let predicted = locals.len();

    let default_ttl = if approximate {
        spec.router_ttl
    } else {
        spec.ttl
    };
    let ttl_ms = parsed.req.ttl_ms.unwrap_or(default_ttl.as_millis() as u64);
    let expires = deadline_after(Duration::from_millis(ttl_ms));
    let shards = mesh.shards();
    let prune = approximate.then(|| {
        let max = (spec.max_tree_size / shards).max(1);
        PruneBound {
            max,
            target: ((max as f64 * spec.prune_target_ratio) as usize).min(max),
        }
    });
    // The caps are checked once, on the decode worker's first step, for the
    // request's every block: a refusal leaves nothing predicted.
    let workers = 1 + usize::from(prefill.is_some());
    let on = |slot, total| Predict {
        ix: &ix,
        slot,
        locals: &locals,
        expires,
        total,
        prune,
        field,
    };
    on(decode, predicted * workers).run(mesh).await?;
    let mut body = serde_json::json!({
        "predicted_blocks": predicted,
        "ttl_ms": ttl_ms,
    });
    if let Some(p) = prefill {
        on(p, 0).run(mesh).await?;
    }
    if parsed.req.prefill_instance_id.is_some() {
        body["prefill_predicted_blocks"] = predicted.into();
    }
    Ok(json::bytes(StatusCode::OK, body.to_string().into_bytes()))
}

/// One worker's prediction of a prompt's blocks.
struct Predict<'a> {
    ix: &'a IndexInfo,
    slot: WorkerSlot,
    locals: &'a [BlockHash],
    expires: crate::shard::predict::Tick,
    /// Blocks the caps are checked against (0: checked already).
    total: usize,
    prune: Option<PruneBound>,
    field: &'static str,
}

impl Predict<'_> {
    /// In steps, the executors serving between them; each goes on below the last
    /// block the step before predicted.
    async fn run<M: ShardMesh>(self, mesh: &M) -> Result<(), ApiError> {
        let (mut at, mut total, mut prune) = (ChainAt::default(), self.total, self.prune);
        let mut steps = self.locals.chunks(PREDICT_STEP).peekable();
        loop {
            let step = PredictStep {
                slot: self.slot,
                locals: steps.next().unwrap_or_default().to_vec(),
                expires: self.expires,
                at,
                total: std::mem::take(&mut total),
                live: self.ix.live_predictions.clone(),
            };
            at = match mesh.predict(self.ix.id, step, prune.take()).await? {
                Ok(at) => at,
                Err(r @ PredictRefused::TooLong { .. }) => {
                    return Err(ApiError::TooLong {
                        field: self.field.into(),
                        msg: r.to_string(),
                    });
                }
                Err(r @ PredictRefused::Full { .. }) => {
                    return Err(ApiError::AtCapacity(r.to_string()));
                }
            };
            if at.is_lost() || steps.peek().is_none() {
                return Ok(());
            }
            mesh.pauser()().await;
        }
    }
}

/// A prefill worker's 404 names the prefill fields.
fn as_prefill(e: ApiError) -> ApiError {
    match e {
        ApiError::Unknown { field, msg } if field == "instance_id" || field == "dp_rank" => {
            ApiError::Unknown {
                field: format!("prefill_{field}"),
                msg: format!("prefill: {msg}"),
            }
        }
        e => e,
    }
}

/// The index a speculation names: it must exist, unless the model is approximate
/// (then the request's `block_size` creates it).
async fn index<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    n: &Named,
    block_size: Option<u32>,
    approximate: bool,
) -> Result<Arc<IndexInfo>, ApiError> {
    let ix = match cx.index(&n.model, Some(&n.tenant)) {
        Ok(ix) => ix,
        Err(ApiError::NotFound(_)) if approximate => {
            let bs = block_size.ok_or_else(|| ApiError::Field {
                field: "block_size".into(),
                msg: format!(
                    "the approximate model {} has no index yet: name its block_size",
                    n.model
                ),
            })?;
            let (reg, model, tenant) = (cx.registry().clone(), n.model.clone(), n.tenant.clone());
            cx.mesh
                .offload(move || reg.ensure_index(&model, &tenant, bs))
                .await?;
            cx.index_created(&n.model, Some(&n.tenant))?
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

/// The slot of (instance, dp rank) in `ix`. On a model fed by events, only a
/// registered worker's: a prediction never makes a slot there (event data's
/// slots are capped, and a worker no engine reports for must not score). An
/// approximate model's workers are named by `/speculate` alone, so there the
/// slot is made if new, within the cap on slots per index.
async fn slot<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    ix: &IndexInfo,
    instance: &InstanceRef,
    dp: DpRank,
    approximate: bool,
) -> Result<WorkerSlot, ApiError> {
    let id: InstanceId = match instance {
        InstanceRef::Int(i) => InstanceId::from(*i),
        InstanceRef::Name(_) if !approximate => cx
            .instance(&instance.key())
            .map_err(|_| unknown_worker(ix, instance, None))?,
        InstanceRef::Name(_) => {
            let (reg, key) = (cx.registry().clone(), instance.key());
            cx.mesh.offload(move || reg.intern(&key)).await
        }
    };
    if let Some(&s) = ix.slot_of.get(&(id, dp))
        && ix.slot(s).live
        && (approximate || ix.endpoints.contains_key(&id))
    {
        return Ok(s);
    }
    if !approximate {
        let dp = ix.endpoints.contains_key(&id).then_some(dp);
        return Err(unknown_worker(ix, instance, dp));
    }
    let (reg, index) = (cx.registry().clone(), ix.id);
    Ok(cx
        .mesh
        .offload(move || reg.speculated_slot(index, id, dp))
        .await?)
}

/// A 404 naming the field to blame: the instance, or (for an instance that is
/// registered) its dp rank.
fn unknown_worker(ix: &IndexInfo, instance: &InstanceRef, dp: Option<DpRank>) -> ApiError {
    let (model, tenant, key) = (&ix.model, &ix.tenant, instance.key());
    match dp {
        None => ApiError::Unknown {
            field: "instance_id".into(),
            msg: format!("no worker instance {key} is registered for {model}:{tenant}"),
        },
        Some(dp) => ApiError::Unknown {
            field: "dp_rank".into(),
            msg: format!("worker instance {key} of {model}:{tenant} has no dp_rank {dp}"),
        },
    }
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
