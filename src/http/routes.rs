//! The one table of kvix's HTTP routes: each path with its method, the access it
//! needs ([`Need`]) and whether it waits for the service to be Ready. The access
//! gate, the readiness gate, dispatch and the 405 answer all read this table, so
//! a route cannot be served without an access rule, and dispatch matches on
//! [`Route`] exhaustively, so none is left without a handler; [`check_body`] is
//! each POST route's own parsing, reached through the same table (the fuzz
//! targets call it). Holds no state and does no I/O; the handlers live in one
//! file per route family beside this one.

use super::error::{ApiError, parse};
use super::scope::Shape;
use crate::access::Need;
use hyper::Method;

/// A route kvix serves (under `/conductor` too: the prefix only forces
/// Mooncake's shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Health,
    Ready,
    Workers,
    Dump,
    Peers,
    Metrics,
    Register,
    Unregister,
    Query,
    QueryByHash,
    QueryTieredByHash,
    Speculate,
    RegisterPeer,
    DeregisterPeer,
    ReopenLogs,
}

/// One row of [`ROUTES`].
#[derive(Debug)]
pub struct Spec {
    pub route: Route,
    pub path: &'static str,
    pub method: Method,
    /// The token a caller must present.
    pub need: Need,
    /// Reads or changes the index: answers only once the service is Ready.
    pub gated: bool,
}

const fn spec(route: Route, path: &'static str, method: Method, need: Need, gated: bool) -> Spec {
    Spec {
        route,
        path,
        method,
        need,
        gated,
    }
}

/// Every route. Liveness and readiness stay open and ungated (load balancers and
/// Kubernetes probes); `/peers` and `/metrics` answer while the service starts.
pub static ROUTES: [Spec; 15] = {
    use Need::{Admin, Open, Read};
    use Route::*;
    const GET: Method = Method::GET;
    const POST: Method = Method::POST;
    [
        spec(Health, "/health", GET, Open, false),
        spec(Ready, "/ready", GET, Open, false),
        spec(Workers, "/workers", GET, Read, true),
        spec(Dump, "/dump", GET, Read, true),
        spec(Peers, "/peers", GET, Read, false),
        spec(Metrics, "/metrics", GET, Read, false),
        spec(Register, "/register", POST, Admin, true),
        spec(Unregister, "/unregister", POST, Admin, true),
        spec(Query, "/query", POST, Read, true),
        spec(QueryByHash, "/query_by_hash", POST, Read, true),
        spec(QueryTieredByHash, "/query_tiered_by_hash", POST, Read, true),
        spec(Speculate, "/speculate", POST, Read, true),
        spec(RegisterPeer, "/register_peer", POST, Admin, true),
        spec(DeregisterPeer, "/deregister_peer", POST, Admin, true),
        // logrotate's postrotate: answers while the service starts too.
        spec(ReopenLogs, "/reopen_logs", POST, Admin, false),
    ]
};

/// The row of `path` (without its `/conductor` prefix), if kvix serves it.
pub fn find(path: &str) -> Option<&'static Spec> {
    ROUTES.iter().find(|s| s.path == path)
}

/// Parse and check a POST body exactly as the handler of `path` (`/register`,
/// `/query`, ...; `forced` as under `/conductor`) does before it first reads or
/// changes the registry, and stop there: nothing is registered, looked up or
/// answered. Returns the token ids of a `/query` and `None` for the other routes.
/// `/reopen_logs` reads no body. A path kvix does not serve, or a GET route, is
/// a 404, as a POST to it is.
pub fn check_body(
    path: &str,
    forced: Option<Shape>,
    body: &[u8],
) -> Result<Option<Vec<u32>>, ApiError> {
    let spec = find(path).ok_or_else(|| ApiError::NoRoute(path.to_string()))?;
    match spec.route {
        Route::Health
        | Route::Ready
        | Route::Workers
        | Route::Dump
        | Route::Peers
        | Route::Metrics => Err(ApiError::NoRoute(path.to_string())),
        Route::ReopenLogs => Ok(None),
        Route::Register => super::control::check_register(body, forced).map(|_| None),
        Route::Unregister => super::control::check_unregister(body, forced).map(|_| None),
        Route::Query => super::query::check(body, forced).map(Some),
        Route::QueryByHash => super::query::check_by_hash(body, forced).map(|_| None),
        // Always Dynamo's shape, whatever `forced` says: its router is the client.
        Route::QueryTieredByHash => super::tiered::check(body).map(|_| None),
        // Without the service's own address: every URL a peer could have passes.
        Route::Speculate => super::speculate::parse(body).map(|_| None),
        Route::RegisterPeer => super::peers::parse_new_peer(body, None).map(|_| None),
        Route::DeregisterPeer => parse::<super::peers::PeerReq>(body).map(|_| None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(route: &str, forced: Option<Shape>, body: &str) -> u16 {
        check_body(route, forced, body.as_bytes())
            .unwrap_err()
            .status()
            .as_u16()
    }

    #[test]
    fn check_body_runs_a_routes_parsing_and_stops_before_the_registry() {
        let ok = |route, body: &str| check_body(route, None, body.as_bytes()).unwrap();
        // No index "m" exists anywhere here: nothing past the parsing ran.
        let q = r#"{"token_ids": [1, 2, 3], "model_name": "m"}"#;
        assert_eq!(ok("/query", q), Some(vec![1, 2, 3]));
        // Not the fast path's plain array: serde_json reads it.
        let q = r#"{"token_ids": [1, 2.0], "model": "m"}"#;
        assert_eq!(status("/query", None, q), 422);
        let reg =
            r#"{"instance_id": 1, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 16}"#;
        assert_eq!(ok("/register", reg), None);
        let creg = r#"{"endpoint": "tcp://h:1", "type": "vLLM", "modelname": "m",
                       "instance_id": "vllm-1", "block_size": 2, "dp_rank": 0}"#;
        assert_eq!(ok("/register", creg), None);
        assert_eq!(
            ok("/unregister", r#"{"modelname": "m", "instance_id": "x"}"#),
            None
        );
        assert_eq!(
            ok("/query_by_hash", r#"{"model": "m", "seq_hashes": ["0x1"]}"#),
            None
        );
        assert_eq!(ok("/register_peer", r#"{"url": "http://peer:8091"}"#), None);
        assert_eq!(ok("/deregister_peer", r#"{"url": "gone"}"#), None);
        let tiered = r#"{"block_hashes": [-1, 2], "model_name": "m"}"#;
        assert_eq!(ok("/query_tiered_by_hash", tiered), None);
        assert_eq!(
            status("/query_tiered_by_hash", None, r#"{"model_name": "m"}"#),
            422
        );

        assert_eq!(status("/query", None, r#"{"token_ids": [1]}"#), 422);
        assert_eq!(status("/query", None, "{"), 400);
        assert_eq!(status("/register_peer", None, r#"{"url": "ftp://x"}"#), 422);
        // Forced to the conductor's shape, a Dynamo body lacks `modelname`.
        assert_eq!(status("/register", Some(Shape::Conductor), reg), 422);
        assert_eq!(status("/nowhere", None, "{}"), 404);
        assert_eq!(status("/health", None, "{}"), 404);
        assert_eq!(ok("/reopen_logs", ""), None);
    }

    #[test]
    fn every_route_has_one_row_and_only_liveness_is_open() {
        for (i, s) in ROUTES.iter().enumerate() {
            assert!(
                ROUTES[..i]
                    .iter()
                    .all(|o| o.route != s.route && o.path != s.path),
                "{s:?} is listed twice"
            );
            assert_eq!(find(s.path).map(|f| f.route), Some(s.route));
            assert!(s.method == Method::GET || s.method == Method::POST, "{s:?}");
            // Whatever the index holds or changes needs a token once tokens are set.
            let open = matches!(s.route, Route::Health | Route::Ready);
            assert_eq!(s.need == Need::Open, open, "{s:?}");
            assert!(!s.gated || !open, "{s:?}");
            // Changes to who is listened to take the admin token.
            let admin = matches!(
                s.route,
                Route::Register
                    | Route::Unregister
                    | Route::RegisterPeer
                    | Route::DeregisterPeer
                    | Route::ReopenLogs
            );
            assert_eq!(s.need == Need::Admin, admin, "{s:?}");
        }
        assert!(find("/nowhere").is_none());
        assert!(find("/conductor/query").is_none());
    }
}
