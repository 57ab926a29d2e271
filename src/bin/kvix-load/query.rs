//! The query phase: open-loop (fixed arrival rate) or closed-loop load on
//! `/query` or `/query_by_hash`, one thread and one keep-alive connection each.
//!
//! Owns the schedule and the latency histograms. Open-loop latency is measured
//! from each request's intended send time, so a stalled server is charged for
//! the requests it delayed (no coordinated omission).

use crate::http::{Conn, Target};
use crate::requests::Requests;
use crate::trace;
use hdrhistogram::Histogram;
use kvix::hash;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    pub completed: u64,
    pub errors: u64,
    /// Replies whose `scores` were not empty.
    pub hits: u64,
    /// Open loop only: scheduled requests never sent because the server fell more
    /// than one `--duration` behind (the phase stops at twice its duration).
    pub unsent: u64,
    pub elapsed_secs: f64,
    pub achieved_rps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
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
            write!(b, "],\"model_name\":{}}}", serde_json::Value::from(model)).unwrap();
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

struct ThreadOut {
    hist: Histogram<u64>,
    completed: u64,
    errors: u64,
    hits: u64,
    unsent: u64,
    reply_bytes: u64,
    finished: Instant,
}

/// Run one phase. `done` counts completed requests for the progress bar.
pub fn run(
    target: &Target,
    phase: &Phase,
    bodies: Arc<Vec<Vec<u8>>>,
    done: Arc<AtomicU64>,
) -> PhaseResult {
    let c = phase.connections.max(1);
    // Connect everyone first, then start all schedules at one shared instant.
    let barrier = Arc::new(std::sync::Barrier::new(c + 1));
    let start_cell = Arc::new(std::sync::OnceLock::<Instant>::new());
    let handles: Vec<_> = (0..c)
        .map(|ci| {
            let (target, bodies, done) = (target.clone(), bodies.clone(), done.clone());
            let (barrier, start_cell) = (barrier.clone(), start_cell.clone());
            let (rate, dur) = (phase.rate, Duration::from_secs_f64(phase.duration_secs));
            std::thread::spawn(move || {
                let mut conn = Conn::new(&target);
                let _ = conn.connect();
                barrier.wait();
                let start = *start_cell.get().unwrap();
                let end = start + dur;
                let mut out = ThreadOut {
                    hist: Histogram::new_with_bounds(1, 600_000_000, 3).unwrap(),
                    completed: 0,
                    errors: 0,
                    hits: 0,
                    unsent: 0,
                    reply_bytes: 0,
                    finished: start,
                };
                let mut k = ci as u64;
                loop {
                    let measure_from = if rate > 0.0 {
                        let intended = start + Duration::from_secs_f64(k as f64 / rate);
                        if intended >= end {
                            break;
                        }
                        let now = Instant::now();
                        if intended > now {
                            std::thread::sleep(intended - now);
                        } else if now >= end + dur {
                            // Overloaded past a grace of one more duration: stop, and
                            // count what was never sent rather than run on unboundedly.
                            let total = (dur.as_secs_f64() * rate).ceil() as u64;
                            out.unsent = total.saturating_sub(k).div_ceil(c as u64);
                            break;
                        }
                        intended
                    } else {
                        let now = Instant::now();
                        if now >= end {
                            break;
                        }
                        now
                    };
                    let raw = &bodies[(k as usize) % bodies.len()];
                    match conn.send(raw) {
                        Ok(s) if (200..300).contains(&s) => {
                            let lat = measure_from.elapsed().as_micros() as u64;
                            out.hist.saturating_record(lat.max(1));
                            out.completed += 1;
                            out.hits += has_scores(conn.body()) as u64;
                            out.reply_bytes += conn.body().len() as u64;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => out.errors += 1,
                    }
                    k += c as u64;
                }
                out.finished = Instant::now();
                out
            })
        })
        .collect();
    start_cell
        .set(Instant::now() + Duration::from_millis(20))
        .unwrap();
    barrier.wait();
    let start = *start_cell.get().unwrap();
    let mut hist: Histogram<u64> = Histogram::new_with_bounds(1, 600_000_000, 3).unwrap();
    let (mut completed, mut errors, mut hits, mut unsent, mut finished) = (0, 0, 0, 0, start);
    let mut reply_bytes = 0;
    for h in handles {
        let o = h.join().expect("query thread panicked");
        hist.add(&o.hist).unwrap();
        completed += o.completed;
        errors += o.errors;
        hits += o.hits;
        unsent += o.unsent;
        reply_bytes += o.reply_bytes;
        finished = finished.max(o.finished);
    }
    let elapsed = finished.duration_since(start).as_secs_f64().max(1e-9);
    let q = |p: f64| {
        if hist.is_empty() {
            0.0
        } else {
            hist.value_at_quantile(p) as f64
        }
    };
    PhaseResult {
        phase: phase.clone(),
        completed,
        errors,
        hits,
        unsent,
        elapsed_secs: elapsed,
        achieved_rps: completed as f64 / elapsed,
        p50_us: q(0.50),
        p90_us: q(0.90),
        p99_us: q(0.99),
        p999_us: q(0.999),
        max_us: hist.max() as f64,
        mean_us: hist.mean(),
        reply_bytes_mean: reply_bytes as f64 / completed.max(1) as f64,
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
