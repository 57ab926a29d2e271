//! hyper 1.x I/O over glommio's `TcpStream`.
//!
//! Owns the adapter between glommio's futures-io streams and `hyper::rt`'s
//! `Read`/`Write`. Nothing else of hyper or glommio leaks through here.

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use hyper::rt::ReadBufCursor;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Largest slice handed to glommio's read, which runs only when no bytes were
/// waiting: it is zeroed first, so it is kept small. Bytes that arrive later are
/// read by `recv` into hyper's whole spare room.
const WAIT_WINDOW: usize = 1024;

pub struct HyperStream(pub TcpStream);

impl hyper::rt::Read for HyperStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // Most reads find bytes waiting: `recv` writes them straight into hyper's
        // uninitialized spare room. Only a read that would wait goes through
        // glommio (which wants an initialized slice) to register for readiness.
        // SAFETY: `recv` is given the spare room's own pointer and length, so the
        // kernel writes inside it, and `advance(n)` covers exactly the `n` bytes
        // it wrote. No `&[u8]` over uninitialized bytes is made on this path.
        let n = unsafe {
            let spare = buf.as_mut();
            libc::recv(
                self.0.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            // SAFETY: as above, the kernel wrote `n` bytes from the start.
            unsafe { buf.advance(n as usize) };
            return Poll::Ready(Ok(()));
        }
        let e = io::Error::last_os_error();
        if !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ) {
            return Poll::Ready(Err(e));
        }
        // SAFETY: we only write initialized bytes: the uninit region is zeroed before it is
        // viewed as `&mut [u8]`, and `advance(n)` covers exactly the `n` bytes the read filled.
        unsafe {
            let uninit = buf.as_mut();
            let len = uninit.len().min(WAIT_WINDOW);
            let uninit = &mut uninit[..len];
            for b in uninit.iter_mut() {
                b.write(0);
            }
            let slice =
                std::slice::from_raw_parts_mut(uninit.as_mut_ptr().cast::<u8>(), uninit.len());
            match Pin::new(&mut self.0).poll_read(cx, slice) {
                Poll::Ready(Ok(n)) => {
                    buf.advance(n);
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        }
    }
}

impl hyper::rt::Write for HyperStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}

/// hyper's timer (header-read timeouts) on glommio's timers.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalTimer;

impl hyper::rt::Timer for LocalTimer {
    fn sleep(&self, duration: std::time::Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LocalSleep(glommio::timer::Timer::new(duration)))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep(deadline.saturating_duration_since(std::time::Instant::now()))
    }
}

/// A glommio timer as hyper's `Sleep`.
struct LocalSleep(glommio::timer::Timer);

// SAFETY: hyper asks `Send + Sync` of its sleeps for multi-threaded runtimes. Here every
// sleep is created by `LocalTimer` inside a connection future that was spawned with
// `glommio::spawn_local` on one executor; glommio never moves a local task to another
// thread, and hyper's HTTP/1 server neither spawns nor shares the sleep, so the
// thread-bound glommio timer (an `Rc`) is only ever polled and dropped on the thread
// that created it.
unsafe impl Send for LocalSleep {}
// SAFETY: as above: no `&LocalSleep` ever reaches another thread.
unsafe impl Sync for LocalSleep {}

impl std::future::Future for LocalSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl hyper::rt::Sleep for LocalSleep {}
