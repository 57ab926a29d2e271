//! Ingestion: ZMQ SUB sockets on dedicated threads, decode, hand off to rings.
//!
//! Owns the ingest threads and their listeners. Each thread polls its SUB
//! sockets, decodes frames ([`crate::wire`]), turns events into shard ops
//! ([`feed::WorkerFeed`]) and pushes them onto its rings. All listeners of one
//! instance live on one thread, so a clear and the stores after it stay in
//! order. Never runs on an executor, never blocks one: the [`Ingest`] handle's calls
//! wait for the thread's reply, so executors make them through
//! `ShardMesh::offload`.
//!
//! `handle.rs` starts the threads and sends them [`Command`]s; `thread.rs` is one
//! thread's loop; `sequence.rs` judges each frame's number; `feed.rs` turns events
//! into ops; `replay.rs` asks engines for what was missed; `bind.rs` serves pods.

pub mod bind;
pub mod feed;
mod handle;
pub mod replay;
pub mod sequence;
mod thread;
pub mod wake;

pub use handle::{
    Command, Ingest, ListenerStats, REPLAY_COOLDOWN, REPLAY_TIMEOUT, ReplayStats, SeedOutcome,
    SeqKey, SeqRecord,
};
use thread::{BURST, IngestThread, recv_parts};

/// How the ingest threads' SUB sockets are set up.
#[derive(Clone, Copy, Debug)]
pub struct SocketOptions {
    /// Frames a SUB socket buffers before libzmq drops new ones. Bounded so that an
    /// overload costs bounded memory: dropped batches show up as sequence gaps, which
    /// are counted and replayed where the engine has a replay endpoint.
    pub rcvhwm: i32,
    /// Largest message part an engine may send (`ZMQ_MAXMSGSIZE`), on every SUB and
    /// replay socket.
    pub max_msg_bytes: i64,
}

/// A SUB socket to every topic, set up as `opts` says, not yet connected.
fn subscriber(ctx: &zmq::Context, opts: SocketOptions) -> zmq::Result<zmq::Socket> {
    let s = ctx.socket(zmq::SUB)?;
    s.set_rcvhwm(opts.rcvhwm)?;
    // Nor without a size limit: libzmq drops a connection that announces a larger
    // part before buffering it; the frames lost meanwhile show up as a sequence gap
    // (replayed when the engine can).
    s.set_maxmsgsize(opts.max_msg_bytes)?;
    // An engine that is down is retried at growing intervals, up to a second, so
    // that many stopped engines do not keep an ingest thread busy connecting
    // (libzmq's default retries each one every 100 ms forever).
    s.set_reconnect_ivl_max(RECONNECT_MAX_MS)?;
    s.set_subscribe(b"")?;
    Ok(s)
}

/// Default `--zmq-max-msg-bytes`: far above the largest real batch (a few MiB of
/// token ids), far below what would hurt to buffer.
pub const DEFAULT_MAX_MSG_BYTES: u64 = 64 * 1024 * 1024;

/// Longest wait, in milliseconds, between two attempts to reach an engine that is
/// down (libzmq doubles the wait from 100 ms up to this).
const RECONNECT_MAX_MS: i32 = 1000;

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            rcvhwm: 10_000,
            max_msg_bytes: DEFAULT_MAX_MSG_BYTES as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers_bound_their_queue_and_back_off_from_a_stopped_engine() {
        let ctx = zmq::Context::new();
        let opts = SocketOptions {
            rcvhwm: 123,
            max_msg_bytes: 4567,
        };
        let s = subscriber(&ctx, opts).unwrap();
        assert_eq!(s.get_rcvhwm().unwrap(), 123);
        assert_eq!(s.get_maxmsgsize().unwrap(), 4567);
        assert_eq!(s.get_reconnect_ivl_max().unwrap(), RECONNECT_MAX_MS);
        assert!(s.get_reconnect_ivl().unwrap() < RECONNECT_MAX_MS);
    }
}
