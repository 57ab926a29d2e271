//! An ingest thread's command queue, paired with a wake-up it polls.
//!
//! Owns the eventfd an ingest thread polls beside its SUB sockets: a command
//! (a `/register`, a dump's engine hashes) rings it, so the thread takes the
//! command at once however long it sleeps between frames, and an idle thread
//! need not wake every few milliseconds to look. Never blocks: a send is a
//! queue push and an eventfd write.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::Arc;
use std::sync::mpsc;

/// A Linux eventfd: a counter that polls readable while nonzero.
pub struct Wake(File);

impl Wake {
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created above and is owned by nothing else.
        Ok(Wake(unsafe { File::from_raw_fd(fd) }))
    }

    /// Make the descriptor readable (a no-op past the counter's limit, which a
    /// nonblocking write reports as an error: it is readable then anyway).
    pub fn ring(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Reset the counter, so the descriptor polls unreadable until the next ring.
    pub fn clear(&self) {
        let _ = (&self.0).read(&mut [0u8; 8]);
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The sending end of a command queue whose receiver polls `wake`.
pub struct CommandTx<C> {
    tx: mpsc::Sender<C>,
    wake: Arc<Wake>,
}

impl<C> CommandTx<C> {
    pub fn new(tx: mpsc::Sender<C>, wake: Arc<Wake>) -> Self {
        CommandTx { tx, wake }
    }

    /// Queue `cmd` and wake the receiver; fails only once the receiver is gone.
    pub fn send(&self, cmd: C) -> Result<(), mpsc::SendError<C>> {
        self.tx.send(cmd)?;
        self.wake.ring();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_makes_the_wake_fd_readable_until_cleared() {
        let wake = Arc::new(Wake::new().unwrap());
        let (tx, rx) = mpsc::channel();
        let tx = CommandTx::new(tx, wake.clone());
        let readable = |w: &Wake| {
            let mut items = [zmq::PollItem::from_fd(w.fd(), zmq::POLLIN)];
            zmq::poll(&mut items, 0).unwrap();
            items[0].is_readable()
        };
        assert!(!readable(&wake));
        tx.send(7).unwrap();
        tx.send(8).unwrap();
        assert!(readable(&wake));
        wake.clear();
        assert!(!readable(&wake));
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![7, 8]);
        drop(rx);
        assert!(tx.send(9).is_err());
    }
}
