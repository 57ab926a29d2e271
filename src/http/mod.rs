//! HTTP front-end: the service function every executor's connections run.
//!
//! Owns request routing, the access gate (one [`crate::access`] check per request,
//! before dispatch), the lifecycle gate (data routes answer only once the service is
//! Ready), body limits and timeouts, and the error → response mapping. Which route
//! needs what is one table ([`routes`]) that the gates and dispatch all read.
//! Each request gets one [`Ctx`]: the registry as it stood when it came in and the
//! services its handler may use. The handlers, one file per route family
//! ([`query`], [`tiered`], [`speculate`], [`control`], [`peers`], [`workers`],
//! [`dump`]), parse, hash, scatter through [`ShardMesh`] and render JSON
//! ([`json`]). Never touches shard memory and never blocks the executor: control
//! calls go off the executor ([`ShardMesh::offload`]), text prompts to the
//! tokenizing pool ([`crate::tokenize`]).

pub mod client;
pub mod context;
pub mod control;
pub mod dump;
pub mod error;
pub mod json;
pub mod peers;
pub mod query;
pub mod routes;
pub mod scope;
pub mod slot_tracker;
pub mod speculate;
pub mod tiered;
pub mod token_ids;
pub mod workers;

use crate::access::{Access, Need};
use crate::app::App;
use crate::mesh::ShardMesh;
use bytes::Bytes;
use context::Ctx;
use error::ApiError;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use routes::Route;
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
    /// Largest body the slot tracker's routes take (`--slot-max-body-bytes`).
    pub slot_max_body: usize,
}

/// Largest body the slot tracker's routes take by default: Dynamo's (axum's
/// default body limit).
pub const SLOT_MAX_BODY: usize = 2 * 1024 * 1024;

impl Default for Options {
    fn default() -> Self {
        Options {
            body_timeout: Duration::from_secs(30),
            access: Arc::default(),
            slot_max_body: SLOT_MAX_BODY,
        }
    }
}

/// Serve one request: route it, count it, hand it to the access log.
pub async fn handle<M: ShardMesh>(
    mesh: &M,
    app: &Arc<App>,
    opts: &Options,
    req: Request<Incoming>,
) -> Reply {
    let t0 = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let log = app.access_log().cloned();
    // As Dynamo's: the time the request came in.
    let at = log.as_ref().map(|_| std::time::SystemTime::now());
    let trace_id = log
        .as_ref()
        .and_then(|l| req.headers().get(l.trace_header()).cloned());
    let mut body = Bytes::new();
    // The body is kept (a second reference to it) only for the log.
    let keep = log.as_ref().map(|_| &mut body);
    let reply = route(mesh, app, opts, req, keep).await;
    let status = reply.status().as_u16();
    // Core-local counters (no atomics): gathered from every core on scrape.
    mesh.http_stats()
        .borrow_mut()
        .record(&path, &method, status, t0.elapsed());
    if let (Some(log), Some(at)) = (log, at) {
        let route = matched(&path);
        if route.is_none_or(|(p, _)| p != "/metrics") {
            log.push(crate::access_log::Request {
                at,
                trace_id,
                method,
                route,
                body,
                status,
                duration: t0.elapsed(),
            });
        }
    }
    reply
}

/// `path` without its `/conductor` prefix, and whether it had one (the conductor
/// API under `/conductor/...`).
fn conductor(path: &str) -> (&str, bool) {
    match path.strip_prefix("/conductor") {
        Some(rest) if rest.starts_with('/') => (rest, true),
        _ => (path, false),
    }
}

/// The route `path` names, without its `/conductor` prefix, and whether it had one.
fn matched(path: &str) -> Option<(&'static str, bool)> {
    let (route, under) = conductor(path);
    routes::find(route).map(|s| (s.path, under))
}

/// `refused`, once the request's body is in: hyper closes a connection whose
/// request body was left unread, and a client that pooled it fails its next
/// request. A body too large or too slow answers as such instead.
pub(crate) async fn once_read<M: ShardMesh>(
    mesh: &M,
    opts: &Options,
    req: Request<Incoming>,
    refused: Reply,
) -> Reply {
    match body(mesh, opts, req).await {
        Ok(_) => refused,
        Err(e) => error_reply(&e),
    }
}

pub(crate) async fn body<M: ShardMesh>(
    mesh: &M,
    opts: &Options,
    req: Request<Incoming>,
) -> Result<Bytes, ApiError> {
    body_within(mesh, opts, req, MAX_BODY, || ApiError::TooLarge(MAX_BODY)).await
}

/// The body, if it is at most `limit` bytes; else `too_large()`.
pub(crate) async fn body_within<M: ShardMesh>(
    mesh: &M,
    opts: &Options,
    req: Request<Incoming>,
    limit: usize,
    too_large: impl Fn() -> ApiError,
) -> Result<Bytes, ApiError> {
    // A body announced too large is refused before it is asked for: hyper sends
    // `100 Continue` only once the body is read.
    let announced = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let collect = async {
        match Limited::new(req.into_body(), limit).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
            Err(e) => Err(ApiError::BadRequest(format!("cannot read body: {e}"))),
        }
    };
    let timeout = async {
        mesh.sleep(opts.body_timeout).await;
        Err(ApiError::Timeout(opts.body_timeout))
    };
    futures_lite::future::or(collect, timeout).await
}

/// Answer `req`; its body, once read, is left in `body_read` if given (for the
/// access log).
async fn route<M: ShardMesh>(
    mesh: &M,
    app: &Arc<App>,
    opts: &Options,
    req: Request<Incoming>,
    body_read: Option<&mut Bytes>,
) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    // The conductor API under `/conductor/...` forces Mooncake's shapes; the shared
    // routes tell the two APIs apart by their bodies (`model_name` vs `model`/`modelname`).
    let (route, under) = conductor(&path);
    let forced = under.then_some(scope::Shape::Conductor);
    let phase = app.lifecycle().phase();
    let auth = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let spec = routes::find(route);
    // A path kvix does not serve has nothing to guard: it answers 404.
    let need = spec.map_or(Need::Open, |s| s.need);
    // A request refused before its handler reads its body has the body read first
    // ([`once_read`]); an unauthorized one is not read, and its answer announces
    // the connection's close ([`error_reply`]).
    let refusal = if let Err(denied) = opts.access.authorize(need, auth) {
        return error_reply(&ApiError::from(denied));
    } else if spec.is_some_and(|s| s.gated) && !phase.serves_data() {
        ApiError::NotReady(phase.name())
    } else {
        match spec {
            Some(s) if s.method == method => {
                let cx = Ctx::new(mesh, app, opts);
                let result = dispatch(&cx, s, req, &query, phase, forced, body_read).await;
                return result.unwrap_or_else(|e| {
                    if matches!(e, ApiError::Unavailable(_)) {
                        cx.mesh.http_stats().borrow_mut().shard_failures += 1;
                    }
                    if e.status().is_server_error() {
                        tracing::error!(path, "{e}");
                    }
                    error_reply(&e)
                });
            }
            // A POST to a path kvix does not serve, or to a GET route, is a 404.
            _ if method == Method::POST => ApiError::NoRoute(path.clone()),
            Some(_) => ApiError::Method,
            None => ApiError::NoRoute(path.clone()),
        }
    };
    once_read(mesh, opts, req, error_reply(&refusal)).await
}

/// `e` as its answer: the JSON error, `WWW-Authenticate` on a 401, and
/// `Connection: close` where the request's body was left unread (unauthorized,
/// too large, too slow), so that no client sends another request on it.
pub(crate) fn error_reply(e: &ApiError) -> Reply {
    use hyper::header::{CONNECTION, HeaderValue, WWW_AUTHENTICATE};
    let mut r = json::bytes(e.status(), e.body());
    if matches!(e, ApiError::Unauthorized(_)) {
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"kvix\""),
        );
    }
    if matches!(
        e,
        ApiError::Unauthorized(_)
            | ApiError::TooLarge(_)
            | ApiError::BodyLimit { .. }
            | ApiError::Timeout(_)
    ) {
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// Answers a request for `spec`'s route with its method; a POST's body is read
/// first (the handler parses it) and left in `body_read` too if given (a reference,
/// not a copy).
async fn dispatch<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    spec: &routes::Spec,
    req: Request<Incoming>,
    query: &str,
    phase: crate::lifecycle::Phase,
    forced: Option<scope::Shape>,
    body_read: Option<&mut Bytes>,
) -> Result<Reply, ApiError> {
    let client = req.extensions().get::<client::Client>().copied();
    let b = if spec.method == Method::POST {
        body(cx.mesh, cx.opts, req).await?
    } else {
        Bytes::new()
    };
    if let Some(kept) = body_read {
        *kept = b.clone();
    }
    match spec.route {
        Route::Health => Ok(json::empty(StatusCode::OK)),
        Route::Ready => Ok(ready(cx.lifecycle(), phase)),
        Route::Workers => workers::workers(cx, query).await,
        Route::Dump => dump::dump(cx).await,
        Route::Peers => peers::peers(cx),
        Route::Metrics => metrics(cx).await,
        Route::Register => control::register(cx, b, forced).await,
        Route::Unregister => control::unregister(cx, b, forced).await,
        Route::Query => query::query(cx, &b, forced, client).await,
        Route::QueryByHash => query::query_by_hash(cx, &b, forced).await,
        Route::QueryTieredByHash => tiered::query_tiered_by_hash(cx, &b).await,
        Route::Speculate => speculate::speculate(cx, b).await,
        Route::RegisterPeer => peers::register_peer(cx, &b).await,
        Route::DeregisterPeer => peers::deregister_peer(cx, &b).await,
        Route::ReopenLogs => reopen_logs(cx).await,
    }
}

/// `POST /reopen_logs`: the access log's file is closed and its path opened again
/// (after logrotate moved it), off the executor. Without `--access-log` there is
/// nothing to reopen, which is no error (a rotation script need not know).
async fn reopen_logs<M: ShardMesh>(cx: &Ctx<'_, M>) -> Result<Reply, ApiError> {
    let Some(log) = cx.access_log().cloned() else {
        return Ok(json::bytes(
            StatusCode::OK,
            br#"{"status":"ok","reopened":false}"#.to_vec(),
        ));
    };
    cx.mesh
        .offload(move || log.reopen())
        .await
        .map_err(ApiError::Internal)?;
    Ok(json::bytes(
        StatusCode::OK,
        br#"{"status":"ok","reopened":true}"#.to_vec(),
    ))
}

/// `GET /ready`: 200 only when Ready and every executor has beaten within the stall
/// bound (for load balancers and Kubernetes readiness). A stalled core answers none
/// of its own connections; the others say which cores are stalled.
fn ready(life: &crate::lifecycle::Lifecycle, phase: crate::lifecycle::Phase) -> Reply {
    let stalled: Vec<usize> = life.stalled_cores(life.stall_after()).collect();
    let body = match (phase, stalled.is_empty()) {
        (crate::lifecycle::Phase::Ready, true) => {
            return json::bytes(StatusCode::OK, br#"{"status":"ready"}"#.to_vec());
        }
        (crate::lifecycle::Phase::Ready, false) => serde_json::json!({
            "status": "stalled",
            "stalled_cores": stalled,
            "error": format!(
                "executor core(s) {stalled:?} ran no heartbeat within {} ms (--stall-timeout-ms)",
                life.stall_after().as_millis()
            ),
        }),
        (phase, _) => serde_json::json!({ "status": phase.name() }),
    };
    json::bytes(
        StatusCode::SERVICE_UNAVAILABLE,
        body.to_string().into_bytes(),
    )
}

/// `GET /metrics`: every core's figures, gathered over the mesh, rendered off the
/// executor (it reads ingest-side state), as Prometheus text.
async fn metrics<M: ShardMesh>(cx: &Ctx<'_, M>) -> Result<Reply, ApiError> {
    let shards = cx.mesh.stats().await?;
    let text = cx.render_metrics(shards).await;
    let mut r = Response::new(Either::Left(Full::new(Bytes::from(text))));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(r)
}

#[cfg(test)]
mod tests;
