//! `GET /workers`: every registered worker, one model or all, one tenant or all,
//! as Dynamo's standalone indexer lists them.
//!
//! Renders from the request's registry snapshot, off the executor (thousands of
//! workers are megabytes of JSON); never asks the shards.

use super::Reply;
use super::context::Ctx;
use super::error::ApiError;
use super::json;
use crate::mesh::ShardMesh;
use hyper::StatusCode;

pub async fn workers<M: ShardMesh>(cx: &Ctx<'_, M>, query: &str) -> Result<Reply, ApiError> {
    let mut model = None;
    let mut tenant = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "model_name" => model = Some(v.into_owned()),
            "tenant_id" | "routing_group" => tenant = Some(v.into_owned()),
            _ => {}
        }
    }
    let snap = cx.snap().clone();
    // Written off the executor, which serves queries meanwhile.
    let body = cx
        .mesh
        .offload(move || workers_json(&snap, model, tenant))
        .await;
    Ok(json::bytes(StatusCode::OK, body))
}

/// The `/workers` list of `snap`, one model or all, one tenant or all.
fn workers_json(
    snap: &crate::registry::Snapshot,
    model: Option<String>,
    tenant: Option<String>,
) -> Vec<u8> {
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
                .map(|(dp, e)| (dp.to_string(), e[0].endpoint.clone().into()))
                .collect();
            let listeners: serde_json::Map<String, serde_json::Value> = eps
                .iter()
                .map(|(dp, e)| {
                    let list: Vec<serde_json::Value> = e
                        .iter()
                        .map(|l| {
                            serde_json::json!({"endpoint": l.endpoint, "type": l.publisher,
                                               "replay_endpoint": l.replay_endpoint, "status": "active"})
                        })
                        .collect();
                    (dp.to_string(), list.into())
                })
                .collect();
            let instance_id = snap.instance_key(*inst).to_json();
            out.push(serde_json::json!({
                "instance_id": instance_id,
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
    serde_json::Value::Array(out).to_string().into_bytes()
}
