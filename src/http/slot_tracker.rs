//! The slot tracker's HTTP API (`--slot-tracker-port`), answered as Dynamo
//! 1.6.1's standalone slot tracker answers it: the same routes, bodies, status
//! codes and JSON, the same wording of errors, including axum's for bodies it
//! cannot take (415 without a JSON content type, 400 for bad JSON, 422 for the
//! wrong shape). The rules live in [`crate::slot_tracker`]; this module parses, sends
//! the call to the shard that owns the tracker ([`ShardMesh::slots`]) and
//! renders. Never touches tracker state itself and never blocks the executor.

use super::error::ApiError;
use super::{Options, Reply, json};
use crate::access::Need;
use crate::mesh::ShardMesh;
use crate::slot_tracker::{
    Filter, LoadInfo, PotentialLoad, Rank, SlotError, SlotRep, SlotReq, TrackerKey, WorkerInfo,
};
use crate::types::SeqHash;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::de::{DeserializeOwned, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;

/// Dynamo's routing group when a body names none.
pub const DEFAULT_ROUTING_GROUP: &str = "default";

fn default_group() -> String {
    DEFAULT_ROUTING_GROUP.to_string()
}

// The bodies carry Dynamo's type names: serde names them in some refusals
// ("expected struct AddRequest with 7 elements").

#[derive(Deserialize)]
struct RegisterRequest {
    worker_id: u64,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    block_size: u32,
    dp_start: u32,
    dp_size: u32,
}

#[derive(Deserialize)]
struct UnregisterRequest {
    worker_id: u64,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
}

#[derive(Deserialize)]
struct AddRequest {
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    request_id: String,
    worker_id: u64,
    dp_rank: u32,
    #[serde(deserialize_with = "signed_hashes")]
    sequence_hashes: Vec<SeqHash>,
    #[serde(default)]
    new_isl_tokens: usize,
}

#[derive(Deserialize)]
struct LifecycleRequest {
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    request_id: String,
}

#[derive(Deserialize)]
struct PotentialLoadsRequest {
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    #[serde(deserialize_with = "signed_hashes")]
    sequence_hashes: Vec<SeqHash>,
    #[serde(default)]
    new_isl_tokens: usize,
}

/// Sequence hashes as Dynamo takes them: signed 64-bit JSON integers, their bits
/// taken as the unsigned hash (so `-1` is `u64::MAX`); above `i64::MAX` is refused.
pub fn signed_hashes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SeqHash>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<SeqHash>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of signed 64-bit sequence hashes")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
            while let Some(h) = seq.next_element::<i64>()? {
                out.push(SeqHash(h as u64));
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V)
}

/// The status of each refusal, as Dynamo maps them.
fn status(e: &SlotError) -> StatusCode {
    match e {
        SlotError::InvalidBlockSize
        | SlotError::InvalidDpSize
        | SlotError::DpSizeTooLarge { .. }
        | SlotError::InvalidDpRange { .. } => StatusCode::BAD_REQUEST,
        SlotError::BlockSizeMismatch { .. }
        | SlotError::DuplicateWorker { .. }
        | SlotError::DuplicateRequest { .. } => StatusCode::CONFLICT,
        SlotError::WorkerNotFound { .. }
        | SlotError::TrackerNotFound { .. }
        | SlotError::RankNotFound(_)
        | SlotError::RequestNotFound(_) => StatusCode::NOT_FOUND,
        SlotError::BookingTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        SlotError::RankFull { .. }
        | SlotError::TooManyBookings { .. }
        | SlotError::TrackerFull { .. } => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// A refusal's answer: Dynamo's `{"error": ...}`, and for a refusal by one of
/// kvix's bounds the field it is about, the bound and the flag that raises it.
fn refusal(e: &SlotError) -> Reply {
    let mut v = serde_json::json!({ "error": e.to_string() });
    if let Some((field, limit, flag)) = e.limit() {
        v["field"] = field.into();
        v["limit"] = limit.into();
        v["flag"] = flag.into();
    }
    json::bytes(status(e), v.to_string().into_bytes())
}

fn error(status: StatusCode, msg: impl fmt::Display) -> Reply {
    json::bytes(
        status,
        serde_json::json!({ "error": msg.to_string() })
            .to_string()
            .into_bytes(),
    )
}

/// A body refused the way axum's `Json` extractor refuses it.
struct Refused(StatusCode, String);

fn is_json(req: &Request<Incoming>) -> bool {
    let Some(ct) = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let Some((ty, sub)) = essence.split_once('/') else {
        return false;
    };
    ty == "application" && (sub == "json" || sub.ends_with("+json"))
}

/// Parse as axum does: no check for trailing data, errors prefixed by where they
/// are (`field: ...`).
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refused> {
    // Path tracking costs per element: only a body that fails (or has trailing
    // data, which axum ignores) is parsed again with it.
    if let Ok(v) = serde_json::from_slice(body) {
        return Ok(v);
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        if matches!(e.inner().classify(), serde_json::error::Category::Data) {
            Refused(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("Failed to deserialize the JSON body into the target type: {e}"),
            )
        } else {
            Refused(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse the request body as JSON: {e}"),
            )
        }
    })
}

/// A route of the slot tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Workers,
    Loads,
    Health,
    Post(Post),
}

/// A route that takes a JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Post {
    Register,
    Unregister,
    Add,
    PrefillComplete,
    Free,
    PotentialLoads,
}

/// Every route: path, method, and the token it takes (routers book and free with
/// the query token; adding workers takes the admin token).
const ROUTES: [(Route, &str, Method, Need); 9] = [
    (
        Route::Post(Post::Register),
        "/register",
        Method::POST,
        Need::Admin,
    ),
    (
        Route::Post(Post::Unregister),
        "/unregister",
        Method::POST,
        Need::Admin,
    ),
    (Route::Workers, "/workers", Method::GET, Need::Read),
    (Route::Post(Post::Add), "/add", Method::POST, Need::Read),
    (
        Route::Post(Post::PrefillComplete),
        "/prefill_complete",
        Method::POST,
        Need::Read,
    ),
    (Route::Post(Post::Free), "/free", Method::POST, Need::Read),
    (Route::Loads, "/loads", Method::GET, Need::Read),
    (
        Route::Post(Post::PotentialLoads),
        "/potential_loads",
        Method::POST,
        Need::Read,
    ),
    (Route::Health, "/health", Method::GET, Need::Open),
];

/// Serve one request of the slot-tracker listener.
pub async fn handle<M: ShardMesh>(mesh: &M, opts: &Options, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_string();
    let Some((route, _, method, need)) = ROUTES.iter().find(|r| r.1 == path) else {
        return super::once_read(
            mesh,
            opts,
            req,
            error(StatusCode::NOT_FOUND, "route not found"),
        )
        .await;
    };
    // Axum answers HEAD on a GET route as the GET.
    if req.method() != method && !(*method == Method::GET && req.method() == Method::HEAD) {
        let refused = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        return super::once_read(mesh, opts, req, refused).await;
    }
    let auth = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if let Err(denied) = opts.access.authorize(*need, auth) {
        // Not read: the answer announces the connection's close.
        return super::error_reply(&ApiError::from(denied));
    }
    match serve(mesh, opts, *route, req).await {
        Ok(r) => r,
        Err(e) => super::error_reply(&e),
    }
}

async fn serve<M: ShardMesh>(
    mesh: &M,
    opts: &Options,
    route: Route,
    req: Request<Incoming>,
) -> Result<Reply, ApiError> {
    let filter = || {
        let mut f = Filter::default();
        for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
            match &*k {
                "model_name" => f.model_name = Some(v.into_owned()),
                "routing_group" => f.routing_group = Some(v.into_owned()),
                _ => {}
            }
        }
        f
    };
    match route {
        Route::Health => Ok(json::empty(StatusCode::OK)),
        Route::Workers => {
            let all = every_shard(mesh, SlotReq::Workers(filter()), |r| match r {
                SlotRep::Workers(w) => w,
                _ => Vec::new(),
            });
            let mut all: Vec<WorkerInfo> = all.await?;
            crate::slot_tracker::sort_workers(&mut all);
            Ok(list(&all))
        }
        Route::Loads => {
            let all = every_shard(mesh, SlotReq::Loads(filter()), |r| match r {
                SlotRep::Loads(l) => l,
                _ => Vec::new(),
            });
            let mut all: Vec<LoadInfo> = all.await?;
            crate::slot_tracker::sort_loads(&mut all);
            Ok(list(&all))
        }
        Route::Post(post) => post_call(mesh, opts, post, req).await,
    }
}

/// Every shard's part of a listing, joined.
async fn every_shard<M: ShardMesh, T>(
    mesh: &M,
    req: SlotReq,
    part: impl Fn(SlotRep) -> Vec<T>,
) -> Result<Vec<T>, ApiError> {
    Ok(mesh
        .slot_tracker(req)
        .await?
        .into_iter()
        .flat_map(part)
        .collect())
}

async fn post_call<M: ShardMesh>(
    mesh: &M,
    opts: &Options,
    route: Post,
    req: Request<Incoming>,
) -> Result<Reply, ApiError> {
    if !is_json(&req) {
        let refused = error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expected request with `Content-Type: application/json`",
        );
        return Ok(super::once_read(mesh, opts, req, refused).await);
    }
    let limit = opts.slot_max_body;
    let body = super::body_within(mesh, opts, req, limit, || ApiError::BodyLimit {
        limit,
        flag: "--slot-max-body-bytes",
    })
    .await
    .inspect_err(|e| {
        if matches!(e, ApiError::BodyLimit { .. }) {
            mesh.http_stats().borrow_mut().slot_bodies_refused += 1;
        }
    })?;
    let call = match call(route, &body) {
        Ok(c) => c,
        Err(Refused(status, msg)) => return Ok(error(status, msg)),
    };
    let created = matches!(route, Post::Register | Post::Add);
    let rep = mesh.slot_tracker(call).await?.into_iter().next();
    Ok(match rep {
        Some(SlotRep::Done(Ok(()))) if created => json::ok(StatusCode::CREATED),
        Some(SlotRep::Done(Ok(()))) => json::ok(StatusCode::OK),
        Some(SlotRep::Potential(Ok(p))) => list(&p),
        Some(SlotRep::Done(Err(e)) | SlotRep::Potential(Err(e))) => refusal(&e),
        other => {
            return Err(ApiError::Internal(format!(
                "slot tracker answered {other:?}"
            )));
        }
    })
}

/// The call a body asks for.
fn call(route: Post, body: &[u8]) -> Result<SlotReq, Refused> {
    let key = |model_name, routing_group| TrackerKey {
        model_name,
        routing_group,
    };
    Ok(match route {
        Post::Register => {
            let b: RegisterRequest = parse(body)?;
            SlotReq::Register {
                key: key(b.model_name, b.routing_group),
                worker: b.worker_id,
                block_size: b.block_size,
                dp_start: b.dp_start,
                dp_size: b.dp_size,
            }
        }
        Post::Unregister => {
            let b: UnregisterRequest = parse(body)?;
            SlotReq::Unregister {
                key: key(b.model_name, b.routing_group),
                worker: b.worker_id,
            }
        }
        Post::Add => {
            let b: AddRequest = parse(body)?;
            SlotReq::Add {
                key: key(b.model_name, b.routing_group),
                request_id: b.request_id,
                rank: Rank {
                    worker_id: b.worker_id,
                    dp_rank: b.dp_rank,
                },
                path: b.sequence_hashes,
                new_tokens: b.new_isl_tokens,
            }
        }
        Post::PrefillComplete | Post::Free => {
            let b: LifecycleRequest = parse(body)?;
            let key = key(b.model_name, b.routing_group);
            let request_id = b.request_id;
            if route == Post::Free {
                SlotReq::Free { key, request_id }
            } else {
                SlotReq::PrefillComplete { key, request_id }
            }
        }
        Post::PotentialLoads => {
            let b: PotentialLoadsRequest = parse(body)?;
            SlotReq::Potential {
                key: key(b.model_name, b.routing_group),
                path: b.sequence_hashes.into(),
                new_tokens: b.new_isl_tokens,
            }
        }
    })
}

fn list<T: serde::Serialize>(items: &[T]) -> Reply {
    json::bytes(
        StatusCode::OK,
        serde_json::to_vec(items).unwrap_or_else(|_| b"[]".to_vec()),
    )
}

/// `/query`'s `loads`: `{"<worker_id>": {"<dp_rank>": {...}}}`, what
/// `/potential_loads` answers for the same hashes and token count.
pub fn loads_object(p: &[PotentialLoad]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for l in p {
        let w = out
            .entry(l.worker_id.to_string())
            .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
        if let serde_json::Value::Object(ranks) = w {
            ranks.insert(
                l.dp_rank.to_string(),
                serde_json::json!({
                    "potential_prefill_tokens": l.potential_prefill_tokens,
                    "potential_decode_blocks": l.potential_decode_blocks,
                    "active_requests": l.active_requests,
                }),
            );
        }
    }
    serde_json::Value::Object(out)
}

/// What a `/query` or `/query_by_hash` body asks of the slot tracker: with
/// `"loads": true`, the answer carries what `/potential_loads` would answer for
/// the prompt's sequence hashes and `new_isl_tokens` (default: the prompt's
/// tokens; by hash, its blocks times the block size), in the model's tracker
/// for its routing group (tenant).
#[derive(Deserialize, Default, Debug)]
pub struct LoadsAsk {
    #[serde(default)]
    loads: bool,
    new_isl_tokens: Option<usize>,
}

impl LoadsAsk {
    /// The `/potential_loads` call, when loads are asked for.
    pub fn call(
        &self,
        model: &str,
        group: &str,
        seqs: impl FnOnce() -> Vec<SeqHash>,
        tokens: usize,
    ) -> Option<SlotReq> {
        self.loads.then(|| SlotReq::Potential {
            key: TrackerKey {
                model_name: model.to_string(),
                routing_group: group.to_string(),
            },
            path: seqs().into(),
            new_tokens: self.new_isl_tokens.unwrap_or(tokens),
        })
    }
}

/// The loads a [`LoadsAsk::call`] finds; none when the tracker does not exist
/// (no worker registered there).
pub async fn potential<M: ShardMesh>(
    mesh: &M,
    call: SlotReq,
) -> Result<Vec<PotentialLoad>, crate::mesh::ShardUnavailable> {
    Ok(match mesh.slot_tracker(call).await?.into_iter().next() {
        Some(SlotRep::Potential(Ok(p))) => p,
        _ => Vec::new(),
    })
}

/// A JSON object's body with `"loads"` added as its last member.
pub fn append_loads(mut body: Vec<u8>, loads: &[PotentialLoad]) -> Vec<u8> {
    if body.last() != Some(&b'}') {
        return body;
    }
    body.pop();
    let empty = body.last() == Some(&b'{');
    body.extend_from_slice(if empty { b"\"loads\":" } else { b",\"loads\":" });
    body.extend_from_slice(loads_object(loads).to_string().as_bytes());
    body.push(b'}');
    body
}
