//! The ingest threads' ZMQ context, sized to the engines the descriptor budget
//! allows.
//!
//! libzmq caps a context at 1,023 sockets unless `ZMQ_MAX_SOCKETS` says otherwise,
//! and the zmq crate cannot set it, so the context is made with zmq-sys and its
//! sockets are handed to the zmq crate as owned sockets. One per process, never
//! terminated: no socket can outlive it, so closing a socket never waits on it.

use std::ffi::c_void;
use std::sync::OnceLock;

/// A process-wide libzmq context.
#[derive(Clone, Copy, Debug)]
pub struct Context(*mut c_void);

// SAFETY: a libzmq context is thread safe (zmq_ctx_new(3): "the context is thread
// safe and may be shared among as many application threads as necessary"), and this
// one is never terminated, so the pointer stays valid on every thread.
unsafe impl Send for Context {}
// SAFETY: as for `Send`; every call made through it (`zmq_socket`) is thread safe.
unsafe impl Sync for Context {}

static SHARED: OnceLock<Result<Context, String>> = OnceLock::new();

/// Sockets no engine takes: bound sockets for pods, one replay socket per ingest
/// thread at a time, and slack.
const SPARE_SOCKETS: usize = 256;

impl Context {
    /// The process's ingest context, made by the first call with room for
    /// `engines` SUB sockets (later calls get the same one).
    pub fn shared(engines: usize) -> Result<Context, String> {
        SHARED.get_or_init(|| Context::new(engines)).clone()
    }

    fn new(engines: usize) -> Result<Context, String> {
        let max = i32::try_from(engines.saturating_add(SPARE_SOCKETS)).unwrap_or(i32::MAX);
        // SAFETY: zmq_ctx_new takes no arguments and returns a fresh context or null.
        let raw = unsafe { zmq_sys::zmq_ctx_new() };
        if raw.is_null() {
            return Err(format!(
                "cannot create a ZMQ context: {}",
                zmq::Error::from_raw(errno())
            ));
        }
        // SAFETY: `raw` is the live context just created; ZMQ_MAX_SOCKETS takes an int.
        let rc = unsafe { zmq_sys::zmq_ctx_set(raw, zmq_sys::ZMQ_MAX_SOCKETS as i32, max) };
        if rc != 0 {
            return Err(format!(
                "cannot size the ZMQ context to {max} sockets: {}",
                zmq::Error::from_raw(errno())
            ));
        }
        Ok(Context(raw))
    }

    /// A new socket of `kind` (`zmq::SUB`, `zmq::DEALER`), owned by the returned value.
    pub fn socket(&self, kind: zmq::SocketType) -> zmq::Result<zmq::Socket> {
        let raw = match kind {
            zmq::SUB => zmq_sys::ZMQ_SUB,
            zmq::DEALER => zmq_sys::ZMQ_DEALER,
            zmq::PUB => zmq_sys::ZMQ_PUB,
            _ => return Err(zmq::Error::EINVAL),
        };
        // SAFETY: the context is live for the whole process (never terminated).
        let sock = unsafe { zmq_sys::zmq_socket(self.0, raw as i32) };
        if sock.is_null() {
            return Err(zmq::Error::from_raw(errno()));
        }
        // SAFETY: `sock` is a socket just created and owned by nobody else; the zmq
        // crate closes it when the returned value drops, and its context outlives it.
        Ok(unsafe { zmq::Socket::from_raw(sock) })
    }

    /// The most sockets this context opens at once.
    pub fn max_sockets(&self) -> usize {
        // SAFETY: the context is live; zmq_ctx_get only reads an option.
        let n = unsafe { zmq_sys::zmq_ctx_get(self.0, zmq_sys::ZMQ_MAX_SOCKETS as i32) };
        usize::try_from(n).unwrap_or(0)
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_opens_more_than_libzmqs_default_of_sockets() {
        // Each socket holds a descriptor (its mailbox): let this process open them.
        let nofile = crate::descriptors::raise_open_file_limit();
        assert!(
            nofile >= 2_000,
            "this test needs an open-file limit of 2,000"
        );
        let ctx = Context::new(2_000).unwrap();
        assert_eq!(ctx.max_sockets(), 2_000 + SPARE_SOCKETS);
        let socks: Vec<zmq::Socket> = (0..1_500).map(|_| ctx.socket(zmq::SUB).unwrap()).collect();
        assert_eq!(socks.len(), 1_500);
        assert!(ctx.socket(zmq::PAIR).is_err());
    }
}
