//! Route handlers of Dynamo's standalone-indexer API.
//!
//! Owns request shapes and the flow of each route: parse → registry → hash →
//! scatter (via [`Core`]) → gather → render. Control routes call the service;
//! query routes never lock.

use super::Reply;
use super::error::{ApiError, parse};
use super::json;
use crate::hash;
use crate::query::gather;
use crate::registry::IndexInfo;
use crate::runtime::Core;
use crate::service::{ControlError, registration};
use crate::types::{BlockHash, EngineHash, SeqHash, WorkerSlot};
use hyper::StatusCode;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;

const DEFAULT_TENANT: &str = "default";

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Registry(r) => r.into(),
            ControlError::Endpoint(m) | ControlError::Listen(m) => ApiError::BadRequest(m),
        }
    }
}

/// `tenant_id` (kvix, seed 000) or `routing_group` (Dynamo 1.6.1) selects the index.
fn tenant(tenant_id: Option<String>, routing_group: Option<String>) -> Option<String> {
    tenant_id.or(routing_group)
}

#[derive(Deserialize)]
struct RegisterReq {
    instance_id: u64,
    endpoint: String,
    model_name: String,
    block_size: u32,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    dp_rank: Option<u32>,
    replay_endpoint: Option<String>,
}

pub fn register(core: &Core, body: &[u8]) -> Result<Reply, ApiError> {
    let r: RegisterReq = parse(body)?;
    let tenant = tenant(r.tenant_id, r.routing_group).unwrap_or_else(|| DEFAULT_TENANT.into());
    core.app.register(registration(
        r.model_name,
        tenant,
        r.block_size,
        r.instance_id,
        r.dp_rank.unwrap_or(0),
        r.endpoint,
        r.replay_endpoint,
    ))?;
    Ok(json::ok(StatusCode::CREATED))
}

#[derive(Deserialize)]
struct UnregisterReq {
    instance_id: u64,
    model_name: String,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    dp_rank: Option<u32>,
}

pub fn unregister(core: &Core, body: &[u8]) -> Result<Reply, ApiError> {
    let r: UnregisterReq = parse(body)?;
    let tenant = tenant(r.tenant_id, r.routing_group);
    core.app
        .unregister(&r.model_name, tenant.as_deref(), r.instance_id, r.dp_rank)?;
    Ok(json::ok(StatusCode::OK))
}

pub fn workers(core: &Core, query: &str) -> Result<Reply, ApiError> {
    let mut model = None;
    let mut tenant = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "model_name" => model = Some(v.into_owned()),
            "tenant_id" | "routing_group" => tenant = Some(v.into_owned()),
            _ => {}
        }
    }
    let snap = core.app.registry.snapshot();
    let mut out = Vec::new();
    for ix in snap.live_indexes() {
        if model.as_deref().is_some_and(|m| m != ix.model)
            || tenant.as_deref().is_some_and(|t| t != ix.tenant)
        {
            continue;
        }
        for (inst, eps) in &ix.endpoints {
            let endpoints: serde_json::Map<String, serde_json::Value> = eps
                .iter()
                .map(|(dp, e)| (dp.to_string(), e.endpoint.clone().into()))
                .collect();
            let listeners: serde_json::Map<String, serde_json::Value> = eps
                .iter()
                .map(|(dp, e)| {
                    (
                        dp.to_string(),
                        serde_json::json!({"endpoint": e.endpoint, "status": "active"}),
                    )
                })
                .collect();
            out.push(serde_json::json!({
                "instance_id": inst,
                "source": "zmq",
                "status": "active",
                "model_name": ix.model,
                "tenant_id": ix.tenant,
                "routing_group": ix.tenant,
                "block_size": ix.block_size,
                "endpoints": endpoints,
                "listeners": listeners,
            }));
        }
    }
    Ok(json::bytes(
        StatusCode::OK,
        serde_json::Value::Array(out).to_string().into_bytes(),
    ))
}

fn index_for(core: &Core, model: &str, tenant: Option<&str>) -> Result<Arc<IndexInfo>, ApiError> {
    let tenant = tenant.unwrap_or(DEFAULT_TENANT);
    core.app
        .registry
        .snapshot()
        .lookup(model, tenant)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no indexer for model={model} tenant={tenant}")))
}

async fn score(core: &Core, ix: &IndexInfo, seqs: &[SeqHash]) -> Reply {
    let replies = core.lookup(ix.id, seqs).await;
    let overlap = gather(seqs, &replies, ix.slots.len(), |s: WorkerSlot| {
        ix.slot(s).live
    });
    json::bytes(StatusCode::OK, json::scores(ix, &overlap))
}

#[derive(Deserialize)]
struct QueryReq {
    token_ids: Vec<u32>,
    model_name: String,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
}

pub async fn query(core: &Core, body: &[u8]) -> Result<Reply, ApiError> {
    let r: QueryReq = parse(body)?;
    let ix = index_for(
        core,
        &r.model_name,
        tenant(r.tenant_id, r.routing_group).as_deref(),
    )?;
    let seed = hash::block_seed(r.lora_name.as_deref(), r.cache_salt.as_deref());
    let mut seqs = Vec::with_capacity(r.token_ids.len() / ix.block_size as usize + 1);
    hash::seq_hashes_for_tokens(&r.token_ids, ix.block_size as usize, seed, &mut seqs);
    Ok(score(core, &ix, &seqs).await)
}

/// A local block hash as JSON: any integer; negative values are two's-complement u64 bits.
struct HashNum(u64);

impl<'de> Deserialize<'de> for HashNum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = HashNum;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a 64-bit integer block hash")
            }
            fn visit_u64<E>(self, v: u64) -> Result<HashNum, E> {
                Ok(HashNum(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<HashNum, E> {
                Ok(HashNum(v as u64))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct QueryByHashReq {
    block_hashes: Vec<HashNum>,
    model_name: String,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    cache_salt: Option<serde_json::Value>,
}

pub async fn query_by_hash(core: &Core, body: &[u8]) -> Result<Reply, ApiError> {
    let r: QueryByHashReq = parse(body)?;
    if r.cache_salt.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::BadRequest(
            "cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt"
                .into(),
        ));
    }
    let ix = index_for(
        core,
        &r.model_name,
        tenant(r.tenant_id, r.routing_group).as_deref(),
    )?;
    let locals: Vec<BlockHash> = r.block_hashes.iter().map(|h| BlockHash(h.0)).collect();
    let mut seqs = Vec::with_capacity(locals.len());
    hash::seq_hashes_for_locals(&locals, &mut seqs);
    Ok(score(core, &ix, &seqs).await)
}

pub async fn dump(core: &Core) -> Result<Reply, ApiError> {
    let indexes: Vec<Arc<IndexInfo>> = core
        .app
        .registry
        .snapshot()
        .live_indexes()
        .into_iter()
        .cloned()
        .collect();
    let mut out = Vec::from(&b"{"[..]);
    for (i, ix) in indexes.iter().enumerate() {
        // Engine hashes first, then the shards (see json::dump_events).
        let engine: HashMap<(WorkerSlot, SeqHash), EngineHash> = core
            .app
            .ingest
            .engine_hashes(ix.id)
            .into_iter()
            .map(|(slot, seq, eh)| ((slot, seq), eh))
            .collect();
        let blocks = core.dump(ix.id).await;
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(
            serde_json::to_string(&format!("{}:{}", ix.model, ix.tenant))
                .unwrap_or_default()
                .as_bytes(),
        );
        out.extend_from_slice(b":{\"block_size\":");
        out.extend_from_slice(ix.block_size.to_string().as_bytes());
        out.extend_from_slice(b",\"events\":");
        json::dump_events(&mut out, ix, &blocks, &engine);
        out.push(b'}');
    }
    out.push(b'}');
    Ok(json::bytes(StatusCode::OK, out))
}

#[derive(Deserialize)]
struct PeerReq {
    url: String,
}

pub fn register_peer(core: &Core, body: &[u8]) -> Result<Reply, ApiError> {
    let r: PeerReq = parse(body)?;
    core.app.add_peer(r.url);
    Ok(json::ok(StatusCode::CREATED))
}

pub fn deregister_peer(core: &Core, body: &[u8]) -> Result<Reply, ApiError> {
    let r: PeerReq = parse(body)?;
    if core.app.remove_peer(&r.url) {
        Ok(json::ok(StatusCode::OK))
    } else {
        Err(ApiError::NotFound("peer not found".into()))
    }
}

pub fn peers(core: &Core) -> Result<Reply, ApiError> {
    Ok(json::bytes(
        StatusCode::OK,
        serde_json::to_vec(&core.app.peers()).unwrap_or_default(),
    ))
}
