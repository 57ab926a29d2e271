//! Gap replay: ask an engine's ROUTER for the batches a SUB socket missed.
//!
//! Speaks vLLM's replay protocol (`vllm/distributed/kv_events.py`,
//! `ZmqEventPublisher._service_replay`): a DEALER sends `[b"", start_seq (8 bytes BE)]`;
//! the engine answers one `[b"", seq (8 bytes BE), payload]` per buffered batch with
//! `seq >= start_seq`, then `[b"", END_SEQ = -1 (8 bytes BE), b""]`. Some publishers put
//! the topic before the sequence (`[b"", topic, seq, payload]`); both are accepted.
//! Runs on the ingest thread that owns the listener, bounded by a timeout, and
//! applies what the engine returns through the listener's feed.

use super::feed::FeedStats;
use super::{IngestThread, REPLAY_TIMEOUT};
use crate::wire;
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
    ctx: &super::Context,
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

impl IngestThread {
    /// Fetch and apply, in order, every batch after this listener's last sequence
    /// starting at `from`. Blocks this thread for at most [`REPLAY_TIMEOUT`]; other
    /// listeners' frames wait in their sockets meanwhile, and this listener's own live
    /// frames wait in its SUB socket, to be applied after the replay (duplicates skipped).
    /// `counted` is the last sequence the caller already counted as missing (a gap
    /// detected up to a live frame). Batches the engine no longer holds are counted as
    /// unrecovered, and as missing where no gap counted them yet: nothing is skipped
    /// silently. Returns whether the engine answered.
    pub(super) fn replay(&mut self, i: usize, from: u64, counted: Option<u64>) -> bool {
        let Some(ep) = self.listeners[i].endpoint.replay_endpoint.clone() else {
            return false;
        };
        let rs = self.replay_stats.clone();
        FeedStats::bump(&rs.requests, 1);
        let pairs = match fetch(
            &self.ctx,
            &ep,
            from,
            REPLAY_TIMEOUT,
            self.sockets.max_msg_bytes,
        ) {
            Ok(p) => p,
            Err(e) => {
                FeedStats::bump(&rs.failures, 1);
                self.listeners[i].replay_failed_at = Some(std::time::Instant::now());
                let l = &self.listeners[i];
                crate::warn_throttled!(
                    instance = l.feed.instance,
                    dp = l.feed.dp,
                    replay_endpoint = ep,
                    from,
                    "gap not recovered: replay failed: {e}"
                );
                return false;
            }
        };
        let registry = self.registry.clone();
        let l = &mut self.listeners[i];
        let mut last = l.cursor.last();
        let before = last;
        let mut applied = 0u64;
        // `expected`: the next number the replay should hold; `None` once the replay
        // reached `u64::MAX`, after which nothing can be missing.
        let (mut expected, mut unrecovered, mut uncounted) = (Some(from), 0u64, 0u64);
        for (seq, payload) in &pairs {
            if last.is_some_and(|x| *seq <= x) {
                continue;
            }
            if let Some(want) = expected
                && *seq > want
            {
                // The engine's buffer no longer starts where the gap did.
                unrecovered = unrecovered.saturating_add(seq - want);
                let first_uncounted = counted.map_or(Some(want), |c| c.checked_add(1));
                if let Some(f) = first_uncounted {
                    uncounted = uncounted.saturating_add(seq.saturating_sub(want.max(f)));
                }
            }
            expected = seq.checked_add(1);
            match wire::decode(payload, &mut self.scratch.batch) {
                Ok(_) => {
                    l.feed
                        .apply(&self.scratch.batch, payload, &registry, &mut self.sink);
                    applied += 1;
                }
                Err(e) => {
                    FeedStats::bump(&l.feed.stats.malformed, 1);
                    crate::warn_throttled!(
                        instance = l.feed.instance,
                        seq,
                        "malformed replayed batch skipped: {e}"
                    );
                }
            }
            last = Some(*seq);
        }
        FeedStats::bump(&rs.batches, applied);
        if unrecovered > 0 {
            FeedStats::bump_saturating(&rs.unrecovered, unrecovered);
            FeedStats::bump_saturating(&l.feed.stats.gap_batches, uncounted);
            crate::warn_throttled!(
                instance = l.feed.instance,
                dp = l.feed.dp,
                from,
                unrecovered,
                "replay incomplete: the engine no longer holds these batches"
            );
        }
        if let Some(x) = last {
            l.feed.stats.received(&mut l.cursor, x);
            l.dedup = Some((before, x));
        }
        tracing::info!(
            instance = l.feed.instance,
            dp = l.feed.dp,
            from,
            replayed = applied,
            "replayed missed batches"
        );
        true
    }
}
