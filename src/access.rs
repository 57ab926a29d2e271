//! Who may call kvix, and what kvix may be pointed at.
//!
//! Owns the access rules on what comes from outside: bearer tokens per route class
//! ([`Access::authorize`]: admin routes change who is listened to, read routes see
//! the index), the allow list of ZMQ endpoints `/register` may name
//! ([`AllowList`]), and peer URLs (`/register_peer`). Tokens and lists are loaded
//! once at start and only read afterwards. Must never block an executor (the one
//! name lookup, [`AllowList::check`], runs off it), never compare a token in time
//! that depends on its bytes, and never log or echo a token.

use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use subtle::ConstantTimeEq;

/// What a route asks of its caller (each route's is in the HTTP route table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Liveness and readiness: always open (load balancers, Kubernetes probes).
    Open,
    /// Reads of the index and its configuration.
    Read,
    /// Changes to who is listened to.
    Admin,
}

/// A bearer token, as loaded from its file.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl Token {
    /// A token from a file's content: trimmed, non-empty, visible ASCII only (what an
    /// `Authorization` header can carry).
    pub fn parse(content: &str) -> Result<Token, String> {
        let t = content.trim();
        if t.is_empty() {
            return Err("is empty".into());
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "holds characters a header cannot carry (spaces, control or non-ASCII)".into(),
            );
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// Read a token file (at start only).
    pub fn load(path: &std::path::Path) -> Result<Token, String> {
        let content = std::fs::read_to_string(path)
            .map_err(|e| format!("token file {}: {e}", path.display()))?;
        Token::parse(&content).map_err(|e| format!("token file {}: {e}", path.display()))
    }

    /// The `Authorization` header value that presents this token (to a peer).
    pub fn header_value(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }

    /// Equal in time independent of where the bytes differ (the length is not hidden).
    fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_slice().ct_eq(presented).into()
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("this route needs `Authorization: Bearer <token>`")]
    Missing,
    #[error("the bearer token is not valid for this route")]
    Wrong,
}

/// Access rules of the HTTP routes and of `/register`; open by default (Dynamo's
/// indexer has none, and a drop-in must keep working unconfigured).
#[derive(Clone, Default)]
pub struct Access {
    pub admin: Option<Token>,
    pub query: Option<Token>,
    pub allow: Option<AllowList>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens themselves.
        f.debug_struct("Access")
            .field("admin_token", &self.admin.is_some())
            .field("query_token", &self.query.is_some())
            .field("allow", &self.allow)
            .finish()
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(header: &[u8]) -> Option<&[u8]> {
    let s = header.trim_ascii();
    let (scheme, rest) = s.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    Some(rest.trim_ascii_start())
}

impl Access {
    /// May a request with this `Authorization` header value use a route of class
    /// `need`? Admin routes take the admin token; read routes the query token or the
    /// admin token. A class whose own token is not configured is open.
    pub fn authorize(&self, need: Need, authorization: Option<&[u8]>) -> Result<(), Denied> {
        let accepted: &[&Token] = match (need, &self.admin, &self.query) {
            (Need::Open, _, _) | (Need::Admin, None, _) | (Need::Read, _, None) => {
                return Ok(());
            }
            (Need::Admin, Some(a), _) => &[a],
            (Need::Read, Some(a), Some(q)) => &[q, a],
            (Need::Read, None, Some(q)) => &[q],
        };
        let presented = authorization.and_then(bearer).ok_or(Denied::Missing)?;
        // Every candidate is compared, so the time does not tell which one matched.
        let ok = accepted
            .iter()
            .fold(false, |ok, t| t.matches(presented) | ok);
        if ok { Ok(()) } else { Err(Denied::Wrong) }
    }
}

/// One entry of `--allow-endpoints`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Allowed {
    /// An address range (a bare address is a /32 or /128).
    Net(IpNet),
    /// A host name pattern, lowercase; `*` stands for any run of characters within
    /// one label (`engine-*.svc` matches `engine-3.svc`, not `engine-3.x.svc`).
    Name(String),
    /// A whole endpoint, compared as written (how `ipc://` and `inproc://` are allowed).
    Endpoint(String),
}

/// The ZMQ endpoints `/register` may name (`--allow-endpoints`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowList(Vec<Allowed>);

impl AllowList {
    /// Parse a comma-separated list of CIDRs, addresses, host name patterns and whole
    /// endpoints (`scheme://...`).
    pub fn parse(list: &str) -> Result<AllowList, String> {
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let entry = if item.contains("://") {
                Allowed::Endpoint(item.to_string())
            } else if let Ok(net) = item.parse::<IpNet>() {
                Allowed::Net(net.trunc())
            } else if let Ok(ip) = item.parse::<IpAddr>() {
                Allowed::Net(IpNet::from(ip))
            } else {
                let name = item.trim_end_matches('.').to_ascii_lowercase();
                let valid = !name.is_empty()
                    && name.split('.').all(|l| !l.is_empty())
                    && name.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'*')
                    });
                if !valid {
                    return Err(format!(
                        "`{item}` is neither a CIDR, an address, a host name pattern nor an endpoint"
                    ));
                }
                Allowed::Name(name)
            };
            out.push(entry);
        }
        if out.is_empty() {
            return Err("the list is empty".into());
        }
        Ok(AllowList(out))
    }

    /// May `/register` connect to `endpoint`? An endpoint listed whole is allowed;
    /// otherwise only `tcp://host:port`: an address literal must lie in a listed range;
    /// a host name must match a listed name pattern, or resolve to addresses that all
    /// lie in listed ranges. May resolve a name (blocking): call it off the executor.
    pub fn check(&self, endpoint: &str) -> Result<(), String> {
        if self
            .0
            .iter()
            .any(|a| matches!(a, Allowed::Endpoint(e) if e == endpoint))
        {
            return Ok(());
        }
        let refuse = |why: String| Err(format!("endpoint `{endpoint}` is not allowed: {why}"));
        let Some(addr) = endpoint.strip_prefix("tcp://") else {
            return refuse(
                "only tcp:// endpoints are matched by address; list others whole".into(),
            );
        };
        // ZMQ's `source;destination` form would connect from an address of its choosing.
        let Some((host, port)) = addr.rsplit_once(':').filter(|_| !addr.contains(';')) else {
            return refuse("not of the form tcp://host:port".into());
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return if self.contains(ip) {
                Ok(())
            } else {
                refuse(format!("{ip} is in no allowed range"))
            };
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        if self
            .0
            .iter()
            .any(|a| matches!(a, Allowed::Name(p) if name_matches(p, &name)))
        {
            return Ok(());
        }
        if !self.0.iter().any(|a| matches!(a, Allowed::Net(_))) {
            return refuse(format!("host `{host}` matches no allowed name"));
        }
        let port: u16 = port.parse().unwrap_or(0);
        let addrs: Vec<IpAddr> = match (host, port).to_socket_addrs() {
            Ok(a) => a.map(|s| s.ip()).collect(),
            Err(e) => {
                return refuse(format!(
                    "host `{host}` matches no allowed name and does not resolve: {e}"
                ));
            }
        };
        match addrs.iter().find(|ip| !self.contains(**ip)) {
            None if !addrs.is_empty() => Ok(()),
            None => refuse(format!("host `{host}` resolves to no address")),
            Some(ip) => refuse(format!(
                "host `{host}` resolves to {ip}, in no allowed range"
            )),
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0
            .iter()
            .any(|a| matches!(a, Allowed::Net(n) if n.contains(&ip)))
    }
}

/// Does `name` (lowercase) match `pattern`? `*` matches any run within one label.
fn name_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), name.split('.').collect());
    p.len() == n.len()
        && p.iter()
            .zip(&n)
            .all(|(p, n)| label_matches(p.as_bytes(), n.as_bytes()))
}

/// Glob match of one label, in O(|p| · |n|) whatever the stars (the name comes from a
/// request: no backtracking blow-up).
fn label_matches(p: &[u8], n: &[u8]) -> bool {
    let (mut pi, mut ni) = (0, 0);
    // Where to resume after the last star: (pattern index past it, name index).
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi + 1, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            // Let the last star take one more character and try again.
            star = Some((sp, sn + 1));
            pi = sp;
            ni = sn + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Why a peer URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerUrlError {
    /// Not an absolute http(s) URL with a host.
    #[error("{0}")]
    Invalid(String),
    /// The URL names this very service: it would bootstrap from itself.
    #[error("`{0}` is this kvix itself; a peer must be another instance")]
    Itself(String),
}

/// Check a peer URL: `http://` or `https://`, a non-empty host, an optional port and
/// base path, nothing else; and not this service (`own`: the address it listens on).
/// A host name is not resolved (that would block); only `localhost` is known to be
/// this machine.
pub fn check_peer_url(url: &str, own: Option<SocketAddr>) -> Result<(), PeerUrlError> {
    let bad = |why: &str| Err(PeerUrlError::Invalid(format!("`{url}` {why}")));
    let uri: hyper::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return bad(&format!("is not a URL: {e}")),
    };
    let default_port = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
        Some("http") => 80,
        Some("https") => 443,
        Some(other) => return bad(&format!("has scheme `{other}`; expected http or https")),
        None => return bad("is not an absolute http(s) URL"),
    };
    let Some(auth) = uri.authority() else {
        return bad("has no host");
    };
    let host = auth.host();
    if host.is_empty() || host == "[]" {
        return bad("has no host");
    }
    if auth.as_str().contains('@') {
        return bad("carries credentials; kvix would send them to the peer in the clear");
    }
    if uri.query().is_some() {
        return bad("has a query; a peer URL is a base URL");
    }
    let Some(own) = own else {
        return Ok(());
    };
    if uri.port_u16().unwrap_or(default_port) != own.port() {
        return Ok(());
    }
    let itself = match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(ip) => is_own_ip(ip, own.ip()),
        Err(_) => {
            let h = host.trim_end_matches('.').to_ascii_lowercase();
            h == "localhost" || h.ends_with(".localhost")
        }
    };
    if itself {
        return Err(PeerUrlError::Itself(url.to_string()));
    }
    Ok(())
}

/// Is `ip` an address this service answers on, listening on `bound`?
fn is_own_ip(ip: IpAddr, bound: IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() || ip == bound.to_canonical() {
        return true;
    }
    // Listening on every address: any address of this machine reaches it. Binding a
    // UDP socket succeeds only for a local address (a plain syscall, no traffic).
    bound.is_unspecified() && std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(s: &str) -> Option<Token> {
        Some(Token::parse(s).unwrap())
    }

    #[test]
    fn tokens_load_trimmed_and_visible() {
        assert!(Token::parse("  s3cret\n").unwrap().matches(b"s3cret"));
        for bad in ["", " \n", "two words", "caf\u{e9}", "a\tb"] {
            assert!(Token::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn routes_take_their_tokens() {
        let open = Access::default();
        for n in [Need::Open, Need::Read, Need::Admin] {
            assert_eq!(open.authorize(n, None), Ok(()));
        }
        let a = Access {
            admin: tok("adm"),
            query: tok("qry"),
            allow: None,
        };
        use Denied::{Missing, Wrong};
        for (need, header, want) in [
            (Need::Open, None, Ok(())),
            (Need::Admin, None, Err(Missing)),
            (Need::Admin, Some(&b"Basic adm"[..]), Err(Missing)),
            (Need::Admin, Some(b"Bearer"), Err(Missing)),
            (Need::Admin, Some(b"Bearer qry"), Err(Wrong)),
            (Need::Admin, Some(b"Bearer adm "), Ok(())),
            (Need::Admin, Some(b"bearer  adm"), Ok(())),
            (Need::Admin, Some(b"Bearer ad"), Err(Wrong)),
            (Need::Admin, Some(b"Bearer admm"), Err(Wrong)),
            (Need::Read, Some(b"Bearer qry"), Ok(())),
            (Need::Read, Some(b"Bearer adm"), Ok(())),
            (Need::Read, Some(b"Bearer x"), Err(Wrong)),
        ] {
            assert_eq!(a.authorize(need, header), want, "{need:?} {header:?}");
        }
        // Only an admin token: reads stay open unless a query token is set.
        let admin_only = Access {
            admin: tok("adm"),
            ..Access::default()
        };
        assert_eq!(admin_only.authorize(Need::Read, None), Ok(()));
        let query_only = Access {
            query: tok("qry"),
            ..Access::default()
        };
        assert_eq!(query_only.authorize(Need::Read, None), Err(Denied::Missing));
        assert_eq!(query_only.authorize(Need::Admin, None), Ok(()));
        assert!(!format!("{a:?}").contains("qry"));
    }

    #[test]
    fn allow_list_by_range_name_and_whole_endpoint() {
        let l = AllowList::parse(
            "10.0.0.0/8, engine-*.svc, 127.0.0.1/32, fd00::/8, ipc:///run/eng.sock, Worker.Example.",
        )
        .unwrap();
        for ok in [
            "tcp://10.1.2.3:5557",
            "tcp://127.0.0.1:1",
            "tcp://[fd00::7]:5557",
            "tcp://[::ffff:10.0.0.1]:1",
            "tcp://engine-3.svc:5557",
            "tcp://ENGINE-.svc:1",
            "tcp://worker.example:1",
            "ipc:///run/eng.sock",
        ] {
            assert_eq!(l.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "tcp://11.0.0.1:5557",
            "tcp://127.0.0.2:1",
            "tcp://engine-3.x.svc:1",
            "tcp://xengine-3.svc.evil:1",
            "tcp://10.0.0.1:1;11.0.0.1:2",
            "tcp://*:5557",
            "ipc:///tmp/other",
            "inproc://x",
            "tcp://10.0.0.1",
        ] {
            assert!(l.check(bad).is_err(), "{bad}");
        }
        // A name that matches no pattern is looked up: localhost is 127.0.0.1 (and ::1,
        // outside the ranges here, so it is refused as a whole).
        let local = AllowList::parse("127.0.0.0/8, ::1/128").unwrap();
        assert_eq!(local.check("tcp://localhost:1"), Ok(()));
        let v4only = AllowList::parse("127.0.0.0/8").unwrap();
        let all_v4 = ("localhost", 1)
            .to_socket_addrs()
            .unwrap()
            .all(|a| a.is_ipv4());
        assert_eq!(v4only.check("tcp://localhost:1").is_ok(), all_v4);
        assert!(label_matches(b"*a*b*", b"xxaxxbxx"));
        assert!(label_matches(b"a*", b"a"));
        assert!(!label_matches(b"a*b", b"ab-"));
        assert!(!label_matches(
            b"*a*a*a*a*a*b",
            "a".repeat(10_000).as_bytes()
        ));
        let names_only = AllowList::parse("engine-*").unwrap();
        assert!(names_only.check("tcp://localhost:1").is_err());
        for bad in ["", " , ", "10.0.0.0/33", "a..b", "bad name", "x/y"] {
            assert!(AllowList::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn peer_urls_are_http_with_a_host() {
        for ok in [
            "http://peer:8091",
            "https://peer.example",
            "HTTP://10.0.0.1:8090/",
            "http://[fd00::1]:8090/base",
        ] {
            assert_eq!(check_peer_url(ok, None), Ok(()), "{ok}");
        }
        for bad in [
            "not a url",
            "ftp://x",
            "http://",
            "http:///x",
            "http://:8090",
            "peer:8091",
            "/dump",
            "http://u:p@peer:1",
            "http://peer:1/?a=b",
            "",
        ] {
            assert!(
                matches!(check_peer_url(bad, None), Err(PeerUrlError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn own_url_is_refused_on_any_local_name_for_it() {
        let own: SocketAddr = "0.0.0.0:8090".parse().unwrap();
        for me in [
            "http://127.0.0.1:8090",
            "http://127.1.2.3:8090/",
            "http://localhost:8090",
            "http://LocalHost.:8090",
            "http://0.0.0.0:8090",
            "http://[::1]:8090",
            "http://[::ffff:127.0.0.1]:8090",
        ] {
            assert_eq!(
                check_peer_url(me, Some(own)),
                Err(PeerUrlError::Itself(me.into())),
                "{me}"
            );
        }
        // Another port, or a port-less URL (80) while we listen elsewhere.
        for other in ["http://127.0.0.1:8091", "http://localhost"] {
            assert_eq!(check_peer_url(other, Some(own)), Ok(()), "{other}");
        }
        let own80: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert!(check_peer_url("http://10.1.2.3", Some(own80)).is_err());
        assert!(check_peer_url("https://10.1.2.3", Some(own80)).is_ok());
    }
}
