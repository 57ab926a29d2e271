//! The ZMQ endpoints an engine or a peer may be given, checked before any socket
//! sees them: libzmq's own errors name neither the flag nor the field.
//!
//! Owns the syntax only (scheme, host, port); never resolves a host or opens a
//! socket.

/// Check a ZMQ endpoint the way Dynamo does: `scheme://address`, tcp needs `host:port`.
pub fn validate(ep: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid ZMQ endpoint `{ep}`: {why}"));
    let Some((scheme, addr)) = ep.split_once("://") else {
        return bad("missing scheme");
    };
    if addr.is_empty() {
        return bad("missing address");
    }
    match scheme {
        "tcp" => {
            let Some((host, port)) = addr.rsplit_once(':') else {
                return bad("missing TCP port");
            };
            if host.is_empty() {
                return bad("missing TCP host");
            }
            if host.starts_with('[') != host.ends_with(']') {
                return bad("missing closing `]`");
            }
            if !host.starts_with('[') && host.contains(':') {
                return bad("missing closing `]`");
            }
            if let Err(e) = port.parse::<u16>() {
                return bad(&format!("invalid TCP port: {e}"));
            }
            Ok(())
        }
        "ipc" | "inproc" => Ok(()),
        other => bad(&format!("unsupported scheme `{other}`")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints_are_checked_like_dynamos() {
        assert!(super::validate("tcp://*:5557").is_ok());
        assert!(super::validate("tcp://[::1]:5557").is_ok());
        assert!(super::validate("ipc:///tmp/x").is_ok());
        assert!(super::validate("tcp://:1").is_err());
        assert!(super::validate("tcp://h:99999").is_err());
        assert!(super::validate("host:1").is_err());
    }
}
