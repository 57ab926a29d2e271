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
