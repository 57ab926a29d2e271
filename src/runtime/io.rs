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

/// A connection's socket as hyper's transport.
///
/// Fairness rests on one rule: once a read found the socket empty, the connection
/// is served again only after the reactor reports it readable. A connection task
/// is often polled again without its socket becoming readable (hyper wakes it
/// after a response); if that poll read the socket directly, a connection whose
/// client answered quickly would be served on every such wake, the executor's
/// run queue would never drain, and glommio polls its rings (submitting the other
/// connections' readiness polls) only when the queue drains or its preempt timer
/// fires: those connections would wait for the timer. Through the reactor, every
/// connection that became readable is woken in the same reap and served in turn.
pub struct HyperStream {
    stream: TcpStream,
    /// A read found the socket empty and glommio has not yet reported it readable.
    waiting: bool,
}

impl HyperStream {
    pub fn new(stream: TcpStream) -> Self {
        HyperStream {
            stream,
            waiting: false,
        }
    }

    /// Read through glommio, which registers for readiness when nothing is
    /// waiting, into at most [`WAIT_WINDOW`] bytes of hyper's spare room.
    fn poll_read_glommio(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: `buf.as_mut()` is hyper's spare room, possibly uninitialized;
        // the window is zeroed through `MaybeUninit::write` before it is viewed as
        // `&mut [u8]`, so no uninitialized byte is ever read.
        let window = unsafe {
            let spare = buf.as_mut();
            let len = spare.len().min(WAIT_WINDOW);
            for b in &mut spare[..len] {
                b.write(0);
            }
            std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), len)
        };
        match Pin::new(&mut self.stream).poll_read(cx, window) {
            Poll::Ready(Ok(n)) => {
                self.waiting = false;
                // SAFETY: glommio filled the first `n` bytes of the window, which
                // starts at the spare room's start.
                unsafe { buf.advance(n) };
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                self.waiting = false;
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                self.waiting = true;
                Poll::Pending
            }
        }
    }
}

impl hyper::rt::Read for HyperStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.waiting {
            return this.poll_read_glommio(cx, &mut buf);
        }
        // Most reads find bytes waiting: `recv` writes them straight into hyper's
        // uninitialized spare room. Only a read that would wait goes through
        // glommio (which wants an initialized slice) to register for readiness.
        // SAFETY: `recv` is given the spare room's own pointer and length, so the
        // kernel writes inside it; no `&[u8]` over uninitialized bytes is made.
        let n = unsafe {
            let spare = buf.as_mut();
            libc::recv(
                this.stream.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            // SAFETY: the kernel wrote `n` bytes from the spare room's start.
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
        this.poll_read_glommio(cx, &mut buf)
    }
}

impl hyper::rt::Write for HyperStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_close(cx)
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::{Read, ReadBuf};
    use std::io::Write as _;
    use std::task::Waker;
    use std::time::Duration;

    /// Poll `stream` once for a read: the bytes it read, or `None` if it waits.
    fn poll_once(stream: &mut HyperStream) -> Option<Vec<u8>> {
        let mut storage = [0u8; 64];
        let mut buf = ReadBuf::new(&mut storage);
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut *stream).poll_read(&mut cx, buf.unfilled()) {
            Poll::Ready(Ok(())) => Some(buf.filled().to_vec()),
            Poll::Ready(Err(e)) => panic!("read failed: {e}"),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_connection_that_waited_is_read_only_once_the_reactor_reports_it_readable() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap())
                    .expect("connect to the test listener");
                let mut stream = HyperStream::new(listener.accept().await.unwrap());
                let settle = || glommio::timer::sleep(Duration::from_millis(20));

                client.write_all(b"first").unwrap();
                settle().await;
                assert_eq!(poll_once(&mut stream).as_deref(), Some(&b"first"[..]));
                assert_eq!(poll_once(&mut stream), None, "nothing waiting: it waits");

                client.write_all(b"second").unwrap();
                std::thread::sleep(Duration::from_millis(20));
                // Polled again before the reactor ran, as a wake from elsewhere
                // would poll it: the bytes are there, but it waits its turn.
                assert_eq!(poll_once(&mut stream), None, "read out of turn");
                settle().await;
                assert_eq!(poll_once(&mut stream).as_deref(), Some(&b"second"[..]));

                // Back on the direct path: bytes already waiting are read at once.
                client.write_all(b"third").unwrap();
                std::thread::sleep(Duration::from_millis(20));
                assert_eq!(poll_once(&mut stream).as_deref(), Some(&b"third"[..]));
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
