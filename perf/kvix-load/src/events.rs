//! The event phase: ZMQ XPUB sockets for the simulated workers, registration
//! with the indexer, the timed publish, and the sentinel wait that tells when
//! the indexer has applied everything.
//!
//! Owns the sockets' lifetime (kept open until the run unregisters) and the
//! applied-events measurement.

use crate::http::{Conn, Target, post};
use crate::sim::{Frames, enc_batch, enc_stored};
use crate::trace::{VOCAB, splitmix};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One simulated worker's publishing side.
pub struct Publisher {
    pub instance: u64,
    pub endpoint: String,
    socket: zmq::Socket,
    /// Next batch sequence number.
    seq: u64,
}

/// Sockets per ZMQ context: libzmq's default cap is 1,023 a context.
const SOCKETS_PER_CONTEXT: usize = 1000;

/// `count` publishers on free loopback ports, a new context every
/// [`SOCKETS_PER_CONTEXT`] (`ctx` is the first; a socket keeps its context alive).
/// Each is an XPUB socket (the engines' PUB wire) so that [`wait_subscribed`] sees
/// the indexer's subscription arrive: a frame published before it is dropped.
/// The open-file limit is raised to the hard one first: each worker holds three
/// descriptors (its mailbox, its listening socket, the indexer's connection).
pub fn bind(
    ctx: &zmq::Context,
    count: usize,
    first_instance: u64,
) -> Result<Vec<Publisher>, String> {
    kvix::descriptors::raise_open_file_limit();
    let mut ctx = ctx.clone();
    (0..count)
        .map(|i| {
            if i > 0 && i % SOCKETS_PER_CONTEXT == 0 {
                ctx = zmq::Context::new();
            }
            let s = ctx
                .socket(zmq::XPUB)
                .map_err(|e| format!("worker {i}: {e}"))?;
            // Unlimited queue: a slow indexer must see every frame, not a dropped one.
            s.set_sndhwm(0).map_err(|e| e.to_string())?;
            s.set_linger(0).map_err(|e| e.to_string())?;
            s.bind("tcp://127.0.0.1:*")
                .map_err(|e| format!("bind worker {i}: {e}"))?;
            let endpoint = s
                .get_last_endpoint()
                .map_err(|e| e.to_string())?
                .map_err(|_| "endpoint is not UTF-8".to_string())?;
            Ok(Publisher {
                instance: first_instance + i as u64,
                endpoint,
                socket: s,
                seq: 0,
            })
        })
        .collect()
}

/// Waits until the indexer has subscribed to every publisher (each XPUB socket
/// hands up the subscription), or fails after `timeout` naming how many have not:
/// with thousands of workers registered at once a fixed wait is too short.
pub fn wait_subscribed(pubs: &[Publisher], timeout: Duration) -> Result<(), String> {
    let start = Instant::now();
    let mut pending: Vec<&Publisher> = pubs.iter().collect();
    while !pending.is_empty() {
        pending.retain(|p| {
            let mut subscribed = false;
            while let Ok(m) = p.socket.recv_bytes(zmq::DONTWAIT) {
                subscribed |= m.first() == Some(&1);
            }
            !subscribed
        });
        if pending.is_empty() {
            break;
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "the indexer did not subscribe to {} of {} workers within {:.0} s (first: instance {})",
                pending.len(),
                pubs.len(),
                timeout.as_secs_f64(),
                pending[0].instance
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

pub fn register(
    target: &Target,
    pubs: &[Publisher],
    model: &str,
    block_size: usize,
) -> Result<(), String> {
    for p in pubs {
        let body = json!({
            "instance_id": p.instance,
            "endpoint": p.endpoint,
            "model_name": model,
            "block_size": block_size,
        });
        match post(target, "/register", &body) {
            Ok((s, _)) if (200..300).contains(&s) => {}
            Ok((s, b)) => return Err(format!("register instance {}: HTTP {s}: {b}", p.instance)),
            Err(e) => return Err(format!("register instance {}: {e}", p.instance)),
        }
    }
    Ok(())
}

/// Unregister every worker; failures are reported, not fatal.
pub fn unregister(target: &Target, instances: &[u64], model: &str) -> usize {
    let mut failed = 0;
    for &i in instances {
        let body = json!({"instance_id": i, "model_name": model});
        match post(target, "/unregister", &body) {
            Ok((s, _)) if (200..300).contains(&s) => {}
            _ => failed += 1,
        }
    }
    failed
}

/// Unique token block for a worker's sentinel: ids above the trace vocabulary,
/// mixed with a per-run nonce so reruns against a kept index never collide.
pub fn sentinel_tokens(nonce: u64, worker: usize, block_size: usize) -> Vec<u32> {
    (0..block_size)
        .map(|j| {
            let x = splitmix(nonce ^ ((worker as u64) << 24) ^ j as u64);
            (VOCAB + x % (u32::MAX as u64 - VOCAB)) as u32
        })
        .collect()
}

/// What the timed publish measured.
#[derive(Default, Debug, serde::Serialize)]
pub struct PublishResult {
    pub publish_secs: f64,
    /// First publish to the last sentinel seen at the indexer.
    pub applied_secs: f64,
    pub all_sentinels_seen: bool,
    pub sentinel_polls: u64,
    /// Sum of the indexer's `tree_sizes` (blocks held per worker, sentinels included),
    /// when its replies carry them: a check that it applied exactly what was sent.
    pub indexer_tree_sizes_sum: Option<u64>,
}

fn send(p: &mut Publisher, payload: zmq::Message) -> Result<(), String> {
    let seq = p.seq.to_be_bytes();
    p.seq += 1;
    (|| {
        p.socket.send(&b""[..], zmq::SNDMORE)?;
        p.socket.send(&seq[..], zmq::SNDMORE)?;
        p.socket.send(payload, 0)
    })()
    .map_err(|e| format!("zmq send: {e}"))
}

/// The block each worker publishes last: once the indexer scores a worker for its
/// sentinel's tokens, it has applied everything that worker sent.
struct Sentinels {
    nonce: u64,
    block_size: usize,
    batch_dp_rank: bool,
}

impl Sentinels {
    /// Worker `w`'s sentinel frame: one stored block of its own tokens.
    fn frame(&self, w: usize) -> Vec<u8> {
        let mut ev = Vec::new();
        let eh = splitmix(self.nonce ^ 0x05E4_71E1_u64 ^ w as u64);
        enc_stored(
            &mut ev,
            &[eh],
            None,
            &sentinel_tokens(self.nonce, w, self.block_size),
            self.block_size,
            "GPU",
        );
        enc_batch(1.7e9, 1, &ev, self.batch_dp_rank)
    }

    /// The `/query` request for worker `w`'s sentinel.
    fn query(&self, target: &Target, model: &str, w: usize) -> Vec<u8> {
        let tokens = sentinel_tokens(self.nonce, w, self.block_size);
        let body = json!({"token_ids": tokens, "model_name": model});
        target.request("POST", "/query", body.to_string().as_bytes())
    }
}

/// One publisher thread's work: its workers (with their global index), its share
/// of the global order (worker-local indices), and its workers' frames and sentinels.
struct Share {
    group: Vec<(usize, Publisher)>,
    order: Vec<(u32, u32)>,
    own: Vec<(Vec<Option<zmq::Message>>, zmq::Message)>,
}

/// Publish all frames (then the sentinels) on `threads` threads, and poll the
/// indexer until every sentinel is visible or `timeout` passes. With
/// `expected_tree_sum`, the apply is timed by the tree sizes reaching it
/// ([`await_tree_sum`]) and the sentinels are checked after, untimed.
#[allow(clippy::too_many_arguments)]
pub fn publish(
    pubs: Vec<Publisher>,
    frames: Frames,
    threads: usize,
    target: &Target,
    model: &str,
    block_size: usize,
    batch_dp_rank: bool,
    nonce: u64,
    timeout: Duration,
    sent: Arc<AtomicU64>,
    expected_tree_sum: Option<u64>,
) -> Result<(Vec<Publisher>, PublishResult), String> {
    let sentinels = Sentinels {
        nonce,
        block_size,
        batch_dp_rank,
    };
    let shares = split(pubs, frames, threads, &sentinels);
    let start = Instant::now();
    let pubs = send_all(shares, sent)?;
    let publish_secs = start.elapsed().as_secs_f64();
    let deadline = timeout + Duration::from_secs_f64(publish_secs);
    let applied = expected_tree_sum
        .and_then(|sum| await_tree_sum(target, model, &sentinels, &pubs, sum, start, deadline));
    let seen = await_sentinels(target, model, &sentinels, &pubs, start, deadline);
    Ok((
        pubs,
        PublishResult {
            publish_secs,
            applied_secs: applied.unwrap_or(seen.applied_secs),
            ..seen
        },
    ))
}

/// Poll one `/query` until the indexer's tree sizes over `pubs`' workers add up to
/// `expected` (every block they hold, sentinels included); returns when, in seconds
/// since `start`, or `None` if they never do before `deadline` (an indexer that
/// lost stores) or if its answers carry no tree sizes. One query a poll, however many
/// workers: at fleet size a query per worker, each of kvix's answers listing every
/// worker, would time the load tool.
fn await_tree_sum(
    target: &Target,
    model: &str,
    sentinels: &Sentinels,
    pubs: &[Publisher],
    expected: u64,
    start: Instant,
    deadline: Duration,
) -> Option<f64> {
    let body = sentinels.query(target, model, 0);
    let instances: Vec<u64> = pubs.iter().map(|p| p.instance).collect();
    let mut conn = Conn::new(target);
    while start.elapsed() < deadline {
        if let Ok(200) = conn.send(&body) {
            // An indexer whose answers carry no tree sizes (Dynamo's lists matched
            // workers only) is timed by its sentinels.
            let sum = tree_sizes_sum(conn.body(), &instances)?;
            if sum >= expected {
                return Some(start.elapsed().as_secs_f64());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Spread the workers over `threads` threads, each with its workers' frames and
/// sentinels. Each frame is made a message here, before the clock starts: libzmq
/// takes its buffer as it is, where a send from a slice would copy it into a fresh
/// message, which costs this load tool CPU the indexer under test would otherwise get.
fn split(
    pubs: Vec<Publisher>,
    frames: Frames,
    threads: usize,
    sentinels: &Sentinels,
) -> Vec<Share> {
    let threads = threads.clamp(1, pubs.len().max(1));
    let mut shares: Vec<Share> = (0..threads)
        .map(|_| Share {
            group: Vec::new(),
            order: Vec::new(),
            own: Vec::new(),
        })
        .collect();
    for (i, p) in pubs.into_iter().enumerate() {
        shares[i % threads].group.push((i, p));
    }
    for &(w, f) in &frames.order {
        shares[w as usize % threads]
            .order
            .push((w / threads as u32, f));
    }
    let mut frames: Vec<Vec<Option<zmq::Message>>> = frames
        .per_worker
        .into_iter()
        .map(|w| w.into_iter().map(|f| Some(zmq::Message::from(f))).collect())
        .collect();
    for share in &mut shares {
        share.own = share
            .group
            .iter()
            .map(|(w, _)| {
                let f = std::mem::take(&mut frames[*w]);
                (f, zmq::Message::from(sentinels.frame(*w)))
            })
            .collect();
    }
    shares
}

/// Send every share's frames in its order, then its sentinels, one thread a share;
/// the publishers come back in worker order.
fn send_all(shares: Vec<Share>, sent: Arc<AtomicU64>) -> Result<Vec<Publisher>, String> {
    let n = shares.iter().map(|s| s.group.len()).sum();
    let handles: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let sent = sent.clone();
            let Share {
                mut group,
                order,
                mut own,
            } = share;
            std::thread::spawn(move || -> Result<Vec<(usize, Publisher)>, String> {
                for (local, f) in order {
                    let (_, p) = &mut group[local as usize];
                    let frame = own[local as usize].0[f as usize].take();
                    send(p, frame.ok_or("a frame published twice")?)?;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                for ((_, p), (_, sentinel)) in group.iter_mut().zip(own) {
                    send(p, sentinel)?;
                }
                Ok(group)
            })
        })
        .collect();
    let mut pubs: Vec<(usize, Publisher)> = Vec::with_capacity(n);
    for h in handles {
        pubs.extend(
            h.join()
                .map_err(|_| "publisher thread panicked".to_string())??,
        );
    }
    pubs.sort_by_key(|(w, _)| *w);
    Ok(pubs.into_iter().map(|(_, p)| p).collect())
}

/// Poll until each worker's sentinel shows a score for that worker (or `deadline`
/// past `start`), then read the indexer's tree sizes once they settle.
fn await_sentinels(
    target: &Target,
    model: &str,
    sentinels: &Sentinels,
    pubs: &[Publisher],
    start: Instant,
    deadline: Duration,
) -> PublishResult {
    let bodies: Vec<Vec<u8>> = (0..pubs.len())
        .map(|w| sentinels.query(target, model, w))
        .collect();
    let mut pending: Vec<usize> = (0..pubs.len()).collect();
    let mut conn = Conn::new(target);
    let mut polls = 0;
    while !pending.is_empty() && start.elapsed() < deadline {
        pending.retain(|&w| {
            polls += 1;
            match conn.send(&bodies[w]) {
                Ok(200) => !scored(conn.body(), pubs[w].instance),
                _ => true,
            }
        });
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let applied_secs = start.elapsed().as_secs_f64();
    let instances: Vec<u64> = pubs.iter().map(|p| p.instance).collect();
    // Shards apply independently: read until two reads 50 ms apart agree (at most ~2 s).
    let mut read = || match conn.send(&bodies[0]) {
        Ok(200) => tree_sizes_sum(conn.body(), &instances),
        _ => None,
    };
    let mut indexer_tree_sizes_sum = read();
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        let next = read();
        if next == indexer_tree_sizes_sum {
            break;
        }
        indexer_tree_sizes_sum = next;
    }
    PublishResult {
        publish_secs: 0.0,
        applied_secs,
        all_sentinels_seen: pending.is_empty(),
        sentinel_polls: polls,
        indexer_tree_sizes_sum,
    }
}

/// The `scores` of a `/query` reply; the rest (`tree_sizes` lists every worker, so
/// it grows with the fleet) is skipped without being built.
#[derive(serde::Deserialize)]
struct ScoresOnly<'a> {
    #[serde(borrow)]
    scores: std::collections::HashMap<&'a str, serde_json::Value>,
}

/// Does a Dynamo-style `{"scores": {"<instance>": {"<dp>": n}}}` reply give `instance` a score > 0?
pub fn scored(body: &[u8], instance: u64) -> bool {
    let Ok(v) = serde_json::from_slice::<ScoresOnly>(body) else {
        return false;
    };
    let Some(per_dp) = v.scores.get(instance.to_string().as_str()) else {
        return false;
    };
    match per_dp {
        serde_json::Value::Object(m) => m.values().any(|x| x.as_f64().unwrap_or(0.0) > 0.0),
        x => x.as_f64().unwrap_or(0.0) > 0.0,
    }
}

/// Sum of `tree_sizes` over `instances` in a `/query` reply (`{"<instance>": {"<dp>": n}}`).
fn tree_sizes_sum(body: &[u8], instances: &[u64]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let t = v.get("tree_sizes")?;
    let mut sum = 0;
    for i in instances {
        match t.get(i.to_string()) {
            Some(serde_json::Value::Object(m)) => {
                sum += m.values().filter_map(|x| x.as_u64()).sum::<u64>()
            }
            Some(x) => sum += x.as_u64().unwrap_or(0),
            None => {}
        }
    }
    Some(sum)
}

/// Samples RSS must hold within 1% for, 250 ms apart, to count as settled: a server
/// may give freed memory back up to a second after it goes quiet.
const SETTLED_SAMPLES: u32 = 5;

/// RSS once it stops falling: the lowest sample once RSS has not fallen by more than
/// 1% over [`SETTLED_SAMPLES`] samples in a row (at most 6 s), so buffers freed after
/// a burst are not counted.
pub fn settled_rss_bytes(pid: u32) -> Option<u64> {
    let mut low = rss_bytes(pid)?;
    let mut flat = 0;
    for _ in 0..24 {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let now = rss_bytes(pid)?;
        if now + low / 100 >= low {
            flat += 1;
        } else {
            flat = 0;
        }
        low = low.min(now);
        if flat >= SETTLED_SAMPLES {
            break;
        }
    }
    Some(low)
}

/// Resident set size of a process in bytes, from /proc/PID/status.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
