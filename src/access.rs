//! Who may call kvix, and what kvix may be pointed at.
//!
//! Owns the rules on addresses and credentials that come from outside: peer URLs
//! (`/register_peer`). Everything here is decided from the request and from
//! configuration loaded at start; nothing here blocks an executor (no DNS, no
//! locks, no channels) nor logs a secret.

use std::net::{IpAddr, SocketAddr};

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
