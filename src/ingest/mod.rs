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
//! thread's loop; `sequence.rs` judges each frame's number; `feed/` turns events
//! into ops; `replay.rs` asks engines for what was missed; `bind.rs` serves pods.

pub mod bind;
pub mod context;
pub mod endpoint;
pub mod feed;
mod handle;
pub mod replay;
pub mod sequence;
mod thread;
pub mod wake;

pub use context::Context;
pub use handle::{
    Command, Ingest, ListenError, ListenerStats, REPLAY_COOLDOWN, REPLAY_TIMEOUT, Removal,
    ReplayStats, SeedOutcome, Seeding, SeqKey, SeqRecord,
};
use thread::{BURST, IngestThread, recv_parts};

/// How the ingest threads' SUB sockets are set up.
#[derive(Clone, Copy, Debug)]
pub struct SocketOptions {
    /// Frames a SUB socket buffers before libzmq drops new ones. Bounded so that an
    /// overload costs bounded memory: dropped batches show up as sequence gaps, which
    /// are counted and replayed where the engine has a replay endpoint.
    pub rcvhwm: i32,
    /// Largest message part an engine may send. A bound socket and a replay socket
    /// leave larger ones to libzmq (`ZMQ_MAXMSGSIZE`), which drops that connection
    /// (the pod reconnects; the replay times out). A registered engine's SUB socket
    /// takes them and kvix skips them: libzmq would close that connection for good,
    /// and watching for it would cost each engine two more descriptors.
    pub max_msg_bytes: i64,
    /// Engines (SUB sockets) the descriptor budget allows; `/register` past it is
    /// refused.
    pub max_engines: usize,
}

/// A SUB socket to every topic, set up as `opts` says, not yet connected. `limit`:
/// libzmq drops a connection that announces a part over `opts.max_msg_bytes`
/// before buffering it; without, the caller skips such parts itself.
fn subscriber(ctx: &Context, opts: SocketOptions, limit: bool) -> zmq::Result<zmq::Socket> {
    let s = ctx.socket(zmq::SUB)?;
    s.set_rcvhwm(opts.rcvhwm)?;
    s.set_maxmsgsize(if limit { opts.max_msg_bytes } else { -1 })?;
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
            max_engines: 4096,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers_bound_their_queue_and_back_off_from_a_stopped_engine() {
        let ctx = Context::shared(16).unwrap();
        let opts = SocketOptions {
            rcvhwm: 123,
            max_msg_bytes: 4567,
            max_engines: 16,
        };
        let s = subscriber(&ctx, opts, true).unwrap();
        assert_eq!(s.get_rcvhwm().unwrap(), 123);
        assert_eq!(s.get_maxmsgsize().unwrap(), 4567);
        assert_eq!(s.get_reconnect_ivl_max().unwrap(), RECONNECT_MAX_MS);
        assert!(s.get_reconnect_ivl().unwrap() < RECONNECT_MAX_MS);
        let unlimited = subscriber(&ctx, opts, false).unwrap();
        assert_eq!(unlimited.get_maxmsgsize().unwrap(), -1);
    }
}
