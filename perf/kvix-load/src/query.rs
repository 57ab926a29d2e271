//! The query phase: open-loop (fixed arrival rate) or closed-loop load on
//! `/query` or `/query_by_hash` over keep-alive connections, all driven from one
//! thread ([`crate::mux`]).
//!
//! Owns the schedule and the latency histograms. Open-loop latency is measured
//! from each request's intended send time, so a stalled server is charged for
//! the requests it delayed (no coordinated omission).

use crate::http::Target;
use crate::mux;
use crate::requests::Requests;
use crate::trace;
use hdrhistogram::Histogram;
use kvix::hash;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// POST /query with token ids.
    Query,
    /// POST /query_by_hash with local block hashes.
    QueryByHash,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Query => "/query",
            Endpoint::QueryByHash => "/query_by_hash",
        }
    }
}

/// One query phase's parameters.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Phase {
    pub endpoint: Endpoint,
    pub prompt_tokens: usize,
    pub connections: usize,
    /// Requests per second over all connections; 0 = closed loop.
    pub rate: f64,
    pub duration_secs: f64,
}

/// What one phase measured; latencies in microseconds.
#[derive(Debug, serde::Serialize)]
pub struct PhaseResult {
    #[serde(flatten)]
    pub phase: Phase,
    /// The server this phase loaded (`--url`, or the server interleaved with it).
    pub target: String,
    pub completed: u64,
    pub errors: u64,
    /// Replies whose `scores` were not empty.
    pub hits: u64,
    /// Open loop only: scheduled requests never sent because the server fell more
    /// than one `--duration` behind (the phase stops at twice its duration; with
    /// `--interleave-with`, a turn at twice `--slice-ms`), stalled, or could not be
    /// reached.
    pub unsent: u64,
    pub elapsed_secs: f64,
    pub achieved_rps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// The p99 of the median connection and of the slowest one: how evenly the
    /// server shares itself between connections.
    pub conn_p99_median_us: f64,
    pub conn_p99_max_us: f64,
    /// Mean body size of the successful replies, in bytes.
    pub reply_bytes_mean: f64,
}

/// Pre-serialized request bodies for a phase, cycled through by every connection.
#[allow(clippy::too_many_arguments)]
pub fn bodies(
    target: &Target,
    reqs: &Requests,
    endpoint: Endpoint,
    prompt_tokens: usize,
    block_size: usize,
    model: &str,
    pool: usize,
    signed_hashes: bool,
    loads: bool,
    matched_only: bool,
) -> Vec<Vec<u8>> {
    let pool = pool.clamp(1, reqs.len());
    let seed = hash::block_seed(None, None);
    // Spread the pool over the whole list of requests.
    let at: Vec<usize> = (0..pool).map(|k| k * reqs.len() / pool).collect();
    let prompts = reqs.map_at(&at, |i, r| trace::prompt(r, i, prompt_tokens));
    prompts
        .into_iter()
        .map(|toks| {
            let mut b = Vec::with_capacity(prompt_tokens * 8 + 64);
            match endpoint {
                Endpoint::Query => {
                    b.extend_from_slice(b"{\"token_ids\":[");
                    for (j, t) in toks.iter().enumerate() {
                        if j > 0 {
                            b.push(b',');
                        }
                        b.extend_from_slice(itoa::Buffer::new().format(*t).as_bytes());
                    }
                }
                Endpoint::QueryByHash => {
                    b.extend_from_slice(b"{\"block_hashes\":[");
                    for (j, c) in toks.chunks_exact(block_size).enumerate() {
                        if j > 0 {
                            b.push(b',');
                        }
                        let h = hash::local_hash(c, seed).0;
                        let mut f = itoa::Buffer::new();
                        let s = if signed_hashes {
                            f.format(h as i64)
                        } else {
                            f.format(h)
                        };
                        b.extend_from_slice(s.as_bytes());
                    }
                }
            }
            write!(b, "],\"model_name\":{}", serde_json::Value::from(model)).unwrap();
            // kvix: the slot tracker's potential loads beside the overlap.
            if loads {
                b.extend_from_slice(b",\"loads\":true");
            }
            // kvix: list only the workers holding some of the prefix.
            if matched_only {
                b.extend_from_slice(b",\"matched_only\":true");
            }
            b.push(b'}');
            target.request("POST", endpoint.path(), &b)
        })
        .collect()
}

/// Is the `scores` object of a reply non-empty? A cheap scan, not a JSON parse.
fn has_scores(body: &[u8]) -> bool {
    let key = b"\"scores\"";
    let Some(i) = body.windows(key.len()).position(|w| w == key) else {
        return false;
    };
    let rest = body[i + key.len()..]
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace());
    let mut it = rest.skip_while(|&c| c == b':');
    it.next() == Some(b'{') && it.next() != Some(b'}')
}

/// Run one phase against every target, in turns of `slice` when there are several
/// ([`mux::run`]); one result per target, in order. `done` counts completed
/// requests for the progress bar.
pub fn run(
    targets: &[(&Target, Arc<Vec<Vec<u8>>>)],
    phase: &Phase,
    slice: Duration,
    done: Arc<AtomicU64>,
) -> Vec<PhaseResult> {
    let muxed: Vec<(&str, &[Vec<u8>])> = targets
        .iter()
        .map(|(t, b)| (t.addr.as_str(), b.as_slice()))
        .collect();
    let outs = mux::run(
        &muxed,
        phase.connections.max(1),
        phase.rate,
        Duration::from_secs_f64(phase.duration_secs),
        slice,
        has_scores,
        || {
            done.fetch_add(1, Ordering::Relaxed);
        },
    );
    targets
        .iter()
        .zip(&outs)
        .map(|((t, _), o)| result(t, phase, o))
        .collect()
}

fn result(target: &Target, phase: &Phase, o: &mux::MuxOut) -> PhaseResult {
    let hist = &o.hist;
    let elapsed = o.active.as_secs_f64().max(1e-9);
    let q = |h: &Histogram<u64>, p: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(p) as f64
        }
    };
    // Each connection's p99, sorted: the median connection's and the slowest's.
    let mut conn_p99: Vec<f64> = o
        .per_conn
        .iter()
        .filter(|h| !h.is_empty())
        .map(|h| q(h, 0.99))
        .collect();
    conn_p99.sort_by(f64::total_cmp);
    PhaseResult {
        phase: phase.clone(),
        target: format!("http://{}{}", target.addr, target.base),
        completed: o.completed,
        errors: o.errors,
        hits: o.hits,
        unsent: o.unsent,
        elapsed_secs: elapsed,
        achieved_rps: o.completed as f64 / elapsed,
        p50_us: q(hist, 0.50),
        p90_us: q(hist, 0.90),
        p99_us: q(hist, 0.99),
        p999_us: q(hist, 0.999),
        max_us: hist.max() as f64,
        mean_us: hist.mean(),
        conn_p99_median_us: conn_p99.get(conn_p99.len() / 2).copied().unwrap_or(0.0),
        conn_p99_max_us: conn_p99.last().copied().unwrap_or(0.0),
        reply_bytes_mean: o.reply_bytes as f64 / o.completed.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_scan() {
        assert!(!has_scores(br#"{"scores":{},"frequencies":[]}"#));
        assert!(has_scores(br#"{"scores": {"1": {"0": 16}}}"#));
        assert!(!has_scores(br#"{"scores" : { } }"#));
    }
}
