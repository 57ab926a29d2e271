//! The listening side: one port for the whole process, one accept loop per core.
//!
//! Owns claiming the port (so that a second process cannot join this one's
//! `SO_REUSEPORT` group and `--port 0` resolves to one port for every core), the
//! accept loop (connection limit, back-off on descriptor exhaustion) and the hyper
//! connection settings (timeouts, half-close). Never spins: every failure path waits.

use super::io::{HyperStream, LocalTimer};
use super::{Core, ServeOptions};
use crate::http;
use glommio::net::TcpListener;
use std::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Held for the life of the process: while it lives, no other kvix can claim the
/// same port.
#[derive(Debug)]
pub struct PortGuard {
    _lock: UnixListener,
}

/// Resolve `addr` (a port of 0 becomes one free port) and make sure nothing else
/// listens on it: another kvix holds the abstract socket `kvix-http-<addr>`, any
/// other process fails the plain (non-`SO_REUSEPORT`) probe bind.
pub fn claim_port(addr: SocketAddr) -> Result<(SocketAddr, PortGuard), String> {
    let lock = |addr: SocketAddr| -> Result<UnixListener, String> {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("kvix-http-{addr}");
        let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| format!("cannot name the port lock for {addr}: {e}"))?;
        UnixListener::bind_addr(&sa).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                format!("another kvix already serves {addr}; stop it or choose another --port")
            }
            _ => format!("cannot take the port lock for {addr}: {e}"),
        })
    };
    let early = (addr.port() != 0).then(|| lock(addr)).transpose()?;
    // The probe carries no SO_REUSEPORT, so it fails if anyone listens there.
    let probe = std::net::TcpListener::bind(addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "port {} is already in use on {} by another process",
            addr.port(),
            addr.ip()
        ),
        _ => format!("cannot bind {addr}: {e}"),
    })?;
    let resolved = probe.local_addr().map_err(|e| e.to_string())?;
    // Closed before the executors bind with SO_REUSEPORT (a socket without it would
    // keep them out).
    drop(probe);
    let lock = match early {
        Some(l) => l,
        None => lock(resolved)?,
    };
    Ok((resolved, PortGuard { _lock: lock }))
}

/// Logs a recurring condition at most once per interval, with how often it happened.
struct RateLog {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLog {
    fn new(every: Duration) -> Self {
        RateLog {
            every,
            last: None,
            suppressed: 0,
        }
    }

    fn hit(&mut self, log: impl FnOnce(u64)) {
        if self.last.is_none_or(|t| t.elapsed() >= self.every) {
            log(self.suppressed);
            self.last = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
    }
}

/// Which service a listener serves.
#[derive(Clone, Copy, Debug)]
pub(super) enum Serve {
    /// The indexer's API on `--port` (`ServeOptions::addr`).
    Main,
    /// The slot tracker's API ([`http::slot_tracker`]) on this address.
    Slots(SocketAddr),
}

/// Accept connections on this core forever. At most `max_connections` are served at
/// once; further ones wait in the backlog. Out of descriptors (EMFILE, ENFILE) or
/// kernel memory, the loop stops accepting for a growing pause (10 ms up to 1 s),
/// logs once per 10 s, and keeps serving the connections it has.
pub(super) async fn accept_loop(
    core: Rc<Core>,
    opts: &ServeOptions,
    serve: Serve,
) -> std::io::Result<()> {
    let listener = match serve {
        Serve::Main => {
            let l = TcpListener::bind(opts.addr)?;
            core.app.lifecycle().core_listening(l.local_addr()?);
            l
        }
        Serve::Slots(addr) => TcpListener::bind(addr)?,
    };
    let slots = Rc::new(glommio::sync::Semaphore::new(
        opts.max_connections.max(1) as u64
    ));
    let http_opts = Rc::new(opts.http.clone());
    let mut exhausted = RateLog::new(Duration::from_secs(10));
    let mut other = RateLog::new(Duration::from_secs(10));
    let mut pause = Duration::ZERO;
    loop {
        let permit = slots
            .acquire_static_permit(1)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let stream = match listener.accept().await {
            Ok(s) => {
                pause = Duration::ZERO;
                s
            }
            Err(e) => {
                let e = std::io::Error::from(e);
                match e.raw_os_error() {
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                        pause =
                            (pause * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                        exhausted.hit(|n| {
                            tracing::warn!(
                                core = core.id.0,
                                repeats = n,
                                pause_ms = pause.as_millis() as u64,
                                "cannot accept: {e}; pausing accepts, open connections keep being served"
                            )
                        });
                    }
                    // The peer gave up before we accepted: nothing to do.
                    Some(libc::ECONNABORTED | libc::EINTR | libc::EAGAIN | libc::EPROTO) => {
                        pause = Duration::ZERO;
                    }
                    _ => {
                        pause = Duration::from_millis(10);
                        other.hit(|n| tracing::warn!(repeats = n, "accept failed: {e}"));
                    }
                }
                drop(permit);
                if pause.is_zero() {
                    glommio::yield_if_needed().await;
                } else {
                    glommio::timer::sleep(pause).await;
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let client = {
            use std::os::fd::AsRawFd;
            http::client::Client::new(stream.as_raw_fd())
        };
        let (core, http_opts, header_timeout) =
            (core.clone(), http_opts.clone(), opts.header_timeout);
        glommio::spawn_local(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
                core.awake.note();
                req.extensions_mut().insert(client);
                let (core, http_opts) = (core.clone(), http_opts.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(match serve {
                        Serve::Main => http::handle(&*core, &core.app, &http_opts, req).await,
                        Serve::Slots(_) => {
                            http::slot_tracker::handle(&*core, &http_opts, req).await
                        }
                    })
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                // A client that shuts down its sending side still gets its answer.
                .half_close(true)
                .timer(LocalTimer)
                .header_read_timeout(header_timeout)
                .serve_connection(HyperStream::new(stream), service)
                .await
            {
                tracing::debug!("connection closed: {e}");
            }
        })
        .detach();
    }
}
