//! The peer routes: `/register_peer`, `/deregister_peer` and `/peers`, the list of
//! kvix replicas this one recovers from (P2P recovery).
//!
//! Owns their bodies' parsing and the URL rules a peer must pass; the list itself
//! is the control plane's. Never asks a peer anything: recovery does that.

use super::Reply;
use super::context::Ctx;
use super::error::{ApiError, parse};
use super::json;
use crate::mesh::ShardMesh;
use hyper::StatusCode;
use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct PeerReq {
    url: String,
}

/// A `/register_peer` body whose URL a peer may have (`own`: this service's address,
/// when known, which a peer must not be).
pub(super) fn parse_new_peer(
    body: &[u8],
    own: Option<std::net::SocketAddr>,
) -> Result<PeerReq, ApiError> {
    let r: PeerReq = parse(body)?;
    crate::access::check_peer_url(&r.url, own).map_err(|e| match e {
        crate::access::PeerUrlError::Invalid(msg) => ApiError::Field {
            field: "url".into(),
            msg,
        },
        e @ crate::access::PeerUrlError::Itself(_) => ApiError::BadRequest(e.to_string()),
    })?;
    Ok(r)
}

pub async fn register_peer<M: ShardMesh>(cx: &Ctx<'_, M>, body: &[u8]) -> Result<Reply, ApiError> {
    let r = parse_new_peer(body, cx.lifecycle().addr())?;
    cx.add_peer(r.url);
    Ok(json::ok(StatusCode::CREATED))
}

pub async fn deregister_peer<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    body: &[u8],
) -> Result<Reply, ApiError> {
    let r: PeerReq = parse(body)?;
    if cx.remove_peer(&r.url) {
        Ok(json::ok(StatusCode::OK))
    } else {
        Err(ApiError::NotFound("peer not found".into()))
    }
}

pub fn peers<M: ShardMesh>(cx: &Ctx<'_, M>) -> Result<Reply, ApiError> {
    Ok(json::bytes(
        StatusCode::OK,
        serde_json::to_vec(&*cx.peers()).unwrap_or_default(),
    ))
}
