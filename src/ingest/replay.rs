//! Gap replay: ask an engine's ROUTER for the batches a SUB socket missed.
//!
//! Speaks vLLM's replay protocol (`vllm/distributed/kv_events.py`,
//! `ZmqEventPublisher._service_replay`): a DEALER sends `[b"", start_seq (8 bytes BE)]`;
//! the engine answers one `[b"", seq (8 bytes BE), payload]` per buffered batch with
//! `seq >= start_seq`, then `[b"", END_SEQ = -1 (8 bytes BE), b""]`. Some publishers put
//! the topic before the sequence (`[b"", topic, seq, payload]`); both are accepted.
//! Runs on the ingest thread that owns the listener, bounded by a timeout.

use std::time::{Duration, Instant};
use thiserror::Error;

/// vLLM's end-of-replay sequence: -1 as a signed 64-bit big-endian integer.
pub const END_SEQ: [u8; 8] = [0xff; 8];

#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("zmq: {0}")]
    Zmq(#[from] zmq::Error),
    #[error("no answer from the replay endpoint within {0:?}")]
    Timeout(Duration),
    #[error("malformed replay frame: {0}")]
    Malformed(String),
}

/// Request every buffered batch with `seq >= from` from `endpoint`; returns them in the
/// order the engine sent them (its ring buffer order, ascending).
pub fn fetch(
    ctx: &zmq::Context,
    endpoint: &str,
    from: u64,
    timeout: Duration,
    max_msg_bytes: i64,
) -> Result<Vec<(u64, Vec<u8>)>, ReplayError> {
    let s = ctx.socket(zmq::DEALER)?;
    s.set_linger(0)?;
    s.set_rcvhwm(0)?;
    // An oversized reply drops the connection: the replay times out and the gap stays
    // counted, as for an engine that does not answer.
    s.set_maxmsgsize(max_msg_bytes)?;
    s.connect(endpoint)?;
    s.send_multipart([&b""[..], &from.to_be_bytes()[..]], 0)?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // An engine that stalls mid-stream is as unanswered as one that never answers.
        if left.is_zero() || s.poll(zmq::POLLIN, left.as_millis().max(1) as i64)? == 0 {
            return Err(ReplayError::Timeout(timeout));
        }
        let frames = s.recv_multipart(0)?;
        let body: &[Vec<u8>] = match frames.split_first() {
            Some((first, rest)) if first.is_empty() => rest,
            _ => &frames,
        };
        let (seq, payload) = match body {
            [seq, payload] | [_, seq, payload] => (seq, payload),
            _ => {
                return Err(ReplayError::Malformed(format!("{} frames", frames.len())));
            }
        };
        if seq.as_slice() == END_SEQ || (payload.is_empty() && seq.len() == 8) {
            return Ok(out);
        }
        let seq: [u8; 8] = seq
            .as_slice()
            .try_into()
            .map_err(|_| ReplayError::Malformed(format!("{}-byte sequence", seq.len())))?;
        out.push((u64::from_be_bytes(seq), payload.clone()));
    }
}
