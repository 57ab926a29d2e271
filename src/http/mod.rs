//! HTTP front-end: hyper 1.x on every executor, one listener per core (`SO_REUSEPORT`).
//!
//! Owns request routing, body limits and the error → response mapping. The
//! handlers ([`api`]) parse, hash, scatter through [`crate::runtime::Core`] and
//! render JSON ([`json`]). Never touches shard memory directly.

pub mod api;
pub mod error;
pub mod json;
pub mod token_ids;

use crate::runtime::Core;
use crate::runtime::io::HyperStream;
use bytes::Bytes;
use error::ApiError;
use glommio::net::TcpListener;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

/// Largest request body accepted (Dynamo allows 8 MiB on the query routes).
pub const MAX_BODY: usize = 8 * 1024 * 1024;

pub type Reply = Response<Full<Bytes>>;

/// Accept connections on `addr` forever, serving each on this executor.
pub async fn serve(core: Rc<Core>, addr: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    // The last executor to bind tells systemd (Type=notify) that kvix serves on every core.
    if core.app.listening.fetch_add(1, Ordering::AcqRel) + 1 == core.shards {
        tracing::info!(
            "kvix listening on http://{addr} with {} shards",
            core.shards
        );
        if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
            tracing::warn!("cannot notify systemd: {e}");
        }
    }
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let core = core.clone();
        glommio::spawn_local(async move {
            let service = hyper::service::service_fn(move |req| {
                let core = core.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(core, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(HyperStream(stream), service)
                .await
            {
                tracing::debug!("connection closed: {e}");
            }
        })
        .detach();
    }
}

async fn body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::TooLarge(MAX_BODY)),
        Err(e) => Err(ApiError::BadRequest(format!("cannot read body: {e}"))),
    }
}

async fn handle(core: Rc<Core>, req: Request<Incoming>) -> Reply {
    let t0 = std::time::Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let reply = route(&core, req).await;
    // Core-local counters (no atomics): gathered from every core on scrape.
    core.http_stats
        .borrow_mut()
        .record(&path, &method, reply.status().as_u16(), t0.elapsed());
    reply
}

async fn route(core: &Rc<Core>, req: Request<Incoming>) -> Reply {
    let core = core.clone();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    // The conductor API under `/conductor/...` forces Mooncake's shapes; the shared
    // routes tell the two APIs apart by their bodies (`model_name` vs `model`/`modelname`).
    let (route, forced) = match path.strip_prefix("/conductor") {
        Some(rest) if rest.starts_with('/') => (rest, Some(api::Shape::Conductor)),
        _ => (path.as_str(), None),
    };
    let result = match (method, route) {
        (Method::GET, "/health") => Ok(json::empty(StatusCode::OK)),
        (Method::GET, "/workers") => api::workers(&core, &query),
        (Method::GET, "/dump") => api::dump(&core).await,
        (Method::GET, "/peers") => api::peers(&core),
        (Method::GET, "/metrics") => Ok(metrics(&core).await),
        (Method::POST, r) => match body(req).await {
            Err(e) => Err(e),
            Ok(b) => match r {
                "/register" => api::register(&core, &b, forced),
                "/unregister" => api::unregister(&core, &b, forced),
                "/query" => api::query(&core, &b, forced).await,
                "/query_by_hash" => api::query_by_hash(&core, &b, forced).await,
                "/register_peer" => api::register_peer(&core, &b),
                "/deregister_peer" => api::deregister_peer(&core, &b),
                _ => Err(ApiError::NoRoute(path.clone())),
            },
        },
        (_, "/health" | "/workers" | "/dump" | "/peers" | "/metrics") => Err(ApiError::Method),
        (
            _,
            "/register" | "/unregister" | "/query" | "/query_by_hash" | "/register_peer"
            | "/deregister_peer",
        ) => Err(ApiError::Method),
        _ => Err(ApiError::NoRoute(path.clone())),
    };
    result.unwrap_or_else(|e| {
        if e.status().is_server_error() {
            tracing::error!(path, "{e}");
        }
        json::bytes(e.status(), e.body())
    })
}

/// `GET /metrics`: every core's figures, gathered over the mesh, as Prometheus text.
async fn metrics(core: &Core) -> Reply {
    let shards = core.stats().await;
    let text = crate::metrics::render(&core.app, &shards);
    let mut r = hyper::Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
