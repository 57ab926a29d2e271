//! The one table of kvix's HTTP routes: each path with its method, the access it
//! needs ([`Need`]) and whether it waits for the service to be Ready. The access
//! gate, the readiness gate, dispatch and the 405 answer all read this table, so
//! a route cannot be served without an access rule, and dispatch matches on
//! [`Route`] exhaustively, so none is left without a handler. Holds no state and
//! does no I/O; the handlers live in [`super::api`].

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

#[cfg(test)]
mod tests {
    use super::*;

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
