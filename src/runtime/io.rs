//! hyper 1.x I/O over glommio's `TcpStream`.
//!
//! Owns the adapter between glommio's futures-io streams and `hyper::rt`'s
//! `Read`/`Write`. Nothing else of hyper or glommio leaks through here.

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use hyper::rt::ReadBufCursor;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Largest slice handed to one read.
const READ_WINDOW: usize = 16 * 1024;

pub struct HyperStream(pub TcpStream);

impl hyper::rt::Read for HyperStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: we only write initialized bytes: the uninit region is zeroed before it is
        // viewed as `&mut [u8]`, and `advance(n)` covers exactly the `n` bytes the read filled.
        unsafe {
            let uninit = buf.as_mut();
            // Zeroing costs per byte; a bounded window keeps large adaptive buffers cheap.
            let len = uninit.len().min(READ_WINDOW);
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
