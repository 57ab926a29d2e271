//! The client end of a request's connection, as a handler may ask about it.
//!
//! Owns one question: has the client gone (closed its side of the connection, or
//! reset it)? The accept loop attaches a [`Client`] to every request (a request
//! extension); a handler that waits on work done for the request elsewhere
//! (tokenizing) asks it every [`GONE_POLL`] and withdraws the work once the client
//! is gone. Peeks at the socket without reading from it, and never blocks.

use crate::mesh::ShardMesh;
use std::future::Future;
use std::os::fd::RawFd;
use std::time::Duration;

/// How often a waiting handler looks whether its client is still there.
pub const GONE_POLL: Duration = Duration::from_millis(20);

/// The socket a request came on. Valid while the request is being answered: the
/// connection (which owns the socket) outlives its requests' handlers.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    fd: RawFd,
}

impl Client {
    pub fn new(fd: RawFd) -> Client {
        Client { fd }
    }

    /// The client closed its side (end of stream with nothing left to read) or the
    /// connection failed. A client that only shut down its sending side looks the
    /// same: it is taken as gone too. Bytes still waiting (a pipelined request) are
    /// a client that is there.
    pub fn gone(&self) -> bool {
        let mut byte = [0u8; 1];
        // SAFETY: `recv` writes at most one byte into `byte`, which lives across the
        // call; MSG_PEEK leaves the stream as it is and MSG_DONTWAIT never blocks.
        let n = unsafe {
            libc::recv(
                self.fd,
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => !matches!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ),
        }
    }
}

/// `work`'s output, or `None` once `client` is gone first (`work` is dropped then).
/// Without a client (a request not from a socket), just `work`.
pub async fn unless_gone<M: ShardMesh, F: Future>(
    mesh: &M,
    client: Option<Client>,
    work: F,
) -> Option<F::Output> {
    let Some(client) = client else {
        return Some(work.await);
    };
    let watch = async {
        loop {
            mesh.sleep(GONE_POLL).await;
            if client.gone() {
                return None;
            }
        }
    };
    futures_lite::future::or(async { Some(work.await) }, watch).await
}
