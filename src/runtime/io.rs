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

/// A connection's own read buffer. A request that fits is read by one `recv`; a
/// larger body comes in several, each of which fills it.
const READ_BUF: usize = 16 * 1024;

/// A connection's socket as hyper's transport.
///
/// Reads go through glommio's stream, whose rule makes executors fair: after a
/// read that did not fill the buffer, the next read waits until the reactor
/// reports the socket readable, even if bytes arrived meanwhile. A connection task
/// is often polled again without its socket becoming readable (hyper wakes it after
/// a response); if that poll read the socket directly, a connection whose client
/// answered quickly would be served on every such wake, the executor's run queue
/// would never drain, and glommio polls its rings (submitting the other
/// connections' readiness polls) only when the queue drains or its preempt timer
/// fires: those connections would wait for the timer. Through the reactor, every
/// connection that became readable is woken in the same reap and served in turn.
///
/// glommio reads into an initialized slice and hyper offers uninitialized room, so
/// bytes land in the connection's buffer first and are copied to hyper: a copy
/// costs less than the syscalls a direct read would add.
pub struct HyperStream {
    stream: TcpStream,
    buf: Box<[u8]>,
    /// `buf[start..end]`: read from the socket, not yet handed to hyper.
    start: usize,
    end: usize,
}

impl HyperStream {
    pub fn new(stream: TcpStream) -> Self {
        HyperStream {
            stream,
            buf: vec![0; READ_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
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
        if this.start == this.end {
            match Pin::new(&mut this.stream).poll_read(cx, &mut this.buf) {
                Poll::Ready(Ok(n)) => (this.start, this.end) = (0, n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        // Nothing read (end of stream) hands hyper nothing, which it takes as EOF.
        let n = (this.end - this.start).min(buf.remaining());
        buf.put_slice(&this.buf[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(()))
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

    /// Poll `stream` once for a read into `room` bytes of hyper's spare room: the
    /// bytes it read, or `None` if it waits.
    fn poll_once(stream: &mut HyperStream, room: usize) -> Option<Vec<u8>> {
        let mut storage = vec![0u8; room];
        let mut buf = ReadBuf::new(&mut storage);
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut *stream).poll_read(&mut cx, buf.unfilled()) {
            Poll::Ready(Ok(())) => Some(buf.filled().to_vec()),
            Poll::Ready(Err(e)) => panic!("read failed: {e}"),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_connection_is_read_again_only_once_the_reactor_reports_it_readable() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap())
                    .expect("connect to the test listener");
                let mut stream = HyperStream::new(listener.accept().await.unwrap());
                let settle = || glommio::timer::sleep(Duration::from_millis(20));

                client.write_all(b"first").unwrap();
                settle().await;
                assert_eq!(poll_once(&mut stream, 64).as_deref(), Some(&b"first"[..]));
                assert_eq!(
                    poll_once(&mut stream, 64),
                    None,
                    "nothing waiting: it waits"
                );

                for turn in [&b"second"[..], b"third"] {
                    client.write_all(turn).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                    // Polled again before the reactor ran, as a wake from elsewhere
                    // would poll it: the bytes are there, but it waits its turn.
                    assert_eq!(poll_once(&mut stream, 64), None, "read out of turn");
                    settle().await;
                    assert_eq!(poll_once(&mut stream, 64).as_deref(), Some(turn));
                }

                // Bytes read but not yet taken are handed over without the socket.
                client.write_all(b"0123456789").unwrap();
                settle().await;
                assert_eq!(poll_once(&mut stream, 4).as_deref(), Some(&b"0123"[..]));
                assert_eq!(poll_once(&mut stream, 4).as_deref(), Some(&b"4567"[..]));
                assert_eq!(poll_once(&mut stream, 4).as_deref(), Some(&b"89"[..]));
                assert_eq!(poll_once(&mut stream, 4), None, "all taken: it waits");

                drop(client);
                settle().await;
                assert_eq!(
                    poll_once(&mut stream, 4).as_deref(),
                    Some(&b""[..]),
                    "end of stream"
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
