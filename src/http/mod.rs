//! HTTP front-end: the service function every executor's connections run.
//!
//! Owns request routing, the access gate (one [`crate::access`] check per request,
//! before dispatch), the lifecycle gate (data routes answer only once the service is
//! Ready), body limits and timeouts, and the error → response mapping.
//! The handlers ([`api`]) parse, hash, scatter through [`ShardMesh`] and render
//! JSON ([`json`]). Never touches shard memory and never blocks the executor:
//! control calls go through [`ShardMesh::offload`].

pub mod api;
pub mod error;
pub mod json;
pub mod speculate;
pub mod token_ids;

use crate::access::Access;
use crate::mesh::ShardMesh;
use bytes::Bytes;
use error::ApiError;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted (Dynamo allows 8 MiB on the query routes).
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// A response body: whole (every route but one), or streamed (`/dump`). A streamed
/// body is polled only by its connection's task on the executor that made it, so it
/// need not be `Send` (it may wait on that executor's timers).
pub type Body = Either<Full<Bytes>, Streamed>;
pub type Streamed = std::pin::Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = Infallible>>>;
pub type Reply = Response<Body>;

/// Per-request limits and access rules, the same on every core.
#[derive(Clone, Debug)]
pub struct Options {
    /// From the end of the headers to the end of the body.
    pub body_timeout: Duration,
    /// Tokens and the endpoint allow list, loaded at start (open by default).
    pub access: Arc<Access>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            body_timeout: Duration::from_secs(30),
            access: Arc::default(),
        }
    }
}

/// Serve one request: route it, count it.
pub async fn handle<M: ShardMesh>(mesh: &M, opts: &Options, req: Request<Incoming>) -> Reply {
    let t0 = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let reply = route(mesh, opts, req).await;
    // Core-local counters (no atomics): gathered from every core on scrape.
    mesh.http_stats()
        .borrow_mut()
        .record(&path, &method, reply.status().as_u16(), t0.elapsed());
    reply
}

async fn body<M: ShardMesh>(
    mesh: &M,
    opts: &Options,
    req: Request<Incoming>,
) -> Result<Bytes, ApiError> {
    let collect = async {
        match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(ApiError::TooLarge(MAX_BODY))
            }
            Err(e) => Err(ApiError::BadRequest(format!("cannot read body: {e}"))),
        }
    };
    let timeout = async {
        mesh.sleep(opts.body_timeout).await;
        Err(ApiError::Timeout(opts.body_timeout))
    };
    futures_lite::future::or(collect, timeout).await
}

/// Routes that read or change the index: they answer only once the service is Ready.
fn gated(route: &str) -> bool {
    matches!(
        route,
        "/query"
            | "/query_by_hash"
            | "/speculate"
            | "/dump"
            | "/workers"
            | "/register"
            | "/unregister"
            | "/register_peer"
            | "/deregister_peer"
    )
}

async fn route<M: ShardMesh>(mesh: &M, opts: &Options, req: Request<Incoming>) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    // The conductor API under `/conductor/...` forces Mooncake's shapes; the shared
    // routes tell the two APIs apart by their bodies (`model_name` vs `model`/`modelname`).
    let (route, forced) = match path.strip_prefix("/conductor") {
        Some(rest) if rest.starts_with('/') => (rest, Some(api::Shape::Conductor)),
        _ => (path.as_str(), None),
    };
    let phase = mesh.app().lifecycle().phase();
    let auth = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let result = if let Err(denied) = opts.access.authorize(crate::access::need(route), auth) {
        Err(ApiError::from(denied))
    } else if gated(route) && !phase.serves_data() {
        Err(ApiError::NotReady(phase.name()))
    } else {
        match (method, route) {
            (Method::GET, "/health") => Ok(json::empty(StatusCode::OK)),
            (Method::GET, "/ready") => Ok(ready(phase)),
            (Method::GET, "/workers") => api::workers(mesh, &query),
            (Method::GET, "/dump") => api::dump(mesh).await,
            (Method::GET, "/peers") => api::peers(mesh),
            (Method::GET, "/metrics") => metrics(mesh).await,
            (Method::POST, r) => match body(mesh, opts, req).await {
                Err(e) => Err(e),
                Ok(b) => match r {
                    "/register" => api::register(mesh, &opts.access, b, forced).await,
                    "/unregister" => api::unregister(mesh, b, forced).await,
                    "/query" => api::query(mesh, &b, forced).await,
                    "/query_by_hash" => api::query_by_hash(mesh, &b, forced).await,
                    "/speculate" => speculate::speculate(mesh, &b).await,
                    "/register_peer" => api::register_peer(mesh, &b).await,
                    "/deregister_peer" => api::deregister_peer(mesh, &b).await,
                    _ => Err(ApiError::NoRoute(path.clone())),
                },
            },
            (_, "/health" | "/ready" | "/workers" | "/dump" | "/peers" | "/metrics") => {
                Err(ApiError::Method)
            }
            (
                _,
                "/register" | "/unregister" | "/query" | "/query_by_hash" | "/speculate"
                | "/register_peer" | "/deregister_peer",
            ) => Err(ApiError::Method),
            _ => Err(ApiError::NoRoute(path.clone())),
        }
    };
    result.unwrap_or_else(|e| {
        if matches!(e, ApiError::Unavailable(_)) {
            mesh.http_stats().borrow_mut().shard_failures += 1;
        }
        if e.status().is_server_error() && !matches!(e, ApiError::NotReady(_)) {
            tracing::error!(path, "{e}");
        }
        let mut r = json::bytes(e.status(), e.body());
        if matches!(e, ApiError::Unauthorized(_)) {
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer realm=\"kvix\""),
            );
        }
        r
    })
}

/// `GET /ready`: 200 only when Ready (for load balancers and Kubernetes readiness).
fn ready(phase: crate::lifecycle::Phase) -> Reply {
    let status = if phase == crate::lifecycle::Phase::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({ "status": phase.name() });
    json::bytes(status, body.to_string().into_bytes())
}

/// `GET /metrics`: every core's figures, gathered over the mesh, rendered off the
/// executor (it reads ingest-side state), as Prometheus text.
async fn metrics<M: ShardMesh>(mesh: &M) -> Result<Reply, ApiError> {
    let shards = mesh.stats().await?;
    let app = mesh.app().clone();
    let text = mesh
        .offload(move || crate::metrics::render(&app, &shards))
        .await;
    let mut r = Response::new(Either::Left(Full::new(Bytes::from(text))));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(r)
}
