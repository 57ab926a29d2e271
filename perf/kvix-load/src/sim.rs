//! Simulated engine workers: request routing, per-worker LRU KV caches, and
//! pre-encoded vLLM KV-event frames.
//!
//! Owns the event stream the indexer will see. Everything is computed before
//! the timed phase so publishing is only socket writes.

use crate::requests::Requests;
use crate::trace::Request;
use crate::trace::splitmix;
use std::collections::{HashMap, VecDeque};

/// How requests are assigned to workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Uniformly random (seeded) worker per request.
    Random,
    /// KV-router-like: the worker minimising new blocks to prefill plus recent load.
    PrefixAffinity,
}

/// Settings of the simulation.
pub struct SimConfig {
    pub workers: usize,
    pub block_size: usize,
    pub policy: Policy,
    pub capacity: usize,
    /// CPU (offload) tier capacity per worker; 0 disables the tier.
    pub cpu_capacity: usize,
    pub batch_events: usize,
    /// Batches carry a third, nil, dp-rank element.
    pub batch_dp_rank: bool,
    /// Every worker gives a block the same engine hash (else each its own).
    pub shared_engine_hashes: bool,
    /// A hybrid model's second KV-cache group: a sliding window of this many tokens
    /// (group 1) storing and removing the same blocks beside full attention
    /// (group 0), as vLLM's hybrid models announce them; 0: full attention only.
    pub window_tokens: u32,
    pub seed: u64,
}

/// Totals of what the frames carry.
#[derive(Default, Clone, Debug, serde::Serialize)]
pub struct SimStats {
    pub frames: u64,
    pub events: u64,
    pub payload_bytes: u64,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub cpu_blocks_stored: u64,
    pub cpu_blocks_removed: u64,
    /// The sliding-window group's blocks (counted in `blocks_stored` and
    /// `blocks_removed` too).
    pub window_blocks_stored: u64,
    pub window_blocks_removed: u64,
    /// GPU blocks a routed request found already cached on its worker.
    pub blocks_hit: u64,
    /// Live (block, worker) pairs at the end, over all tiers.
    pub live_pairs: u64,
    /// Distinct live blocks (sequence hashes) over all workers.
    pub live_unique_blocks: u64,
    /// Distinct blocks in the trace prefix used.
    pub trace_unique_blocks: u64,
    pub capacity_blocks: u64,
}

/// Pre-encoded frames, ready to publish.
pub struct Frames {
    /// Per worker, its payloads in sequence order.
    pub per_worker: Vec<Vec<Vec<u8>>>,
    /// Global publish order: (worker, index into its frames), in request order.
    pub order: Vec<(u32, u32)>,
    pub stats: SimStats,
}

/// A block's parent and where its tokens are in [`Offload::tokens`].
#[derive(Clone, Copy)]
struct BlockInfo {
    parent: Option<u64>,
    at: u32,
}

/// The tokens and parent of every distinct block, kept only when blocks are
/// offloaded: a block stored to the CPU tier is one evicted by an earlier request.
struct Offload {
    blocks: HashMap<u64, BlockInfo>,
    tokens: Vec<u32>,
}

impl Offload {
    fn new(reqs: &Requests, bs: usize) -> Self {
        let mut o = Offload {
            blocks: HashMap::new(),
            tokens: Vec::new(),
        };
        reqs.for_each(|_, req| {
            for (i, &s) in req.seqs.iter().enumerate() {
                o.blocks.entry(s).or_insert_with(|| {
                    let at = (o.tokens.len() / bs) as u32;
                    o.tokens
                        .extend_from_slice(&req.tokens[i * bs..(i + 1) * bs]);
                    BlockInfo {
                        parent: i.checked_sub(1).map(|p| req.seqs[p]),
                        at,
                    }
                });
            }
        });
        o
    }

    fn block(&self, s: u64, bs: usize) -> (Option<u64>, &[u32]) {
        let b = self.blocks[&s];
        let start = b.at as usize * bs;
        (b.parent, &self.tokens[start..start + bs])
    }
}

/// What a first pass over the requests finds, needed before simulating them.
pub struct Survey {
    /// Distinct blocks over all requests.
    pub unique_blocks: usize,
    /// Blocks of the longest request.
    pub max_blocks: usize,
}

pub fn survey(reqs: &Requests) -> Survey {
    let mut unique = hashbrown::HashSet::new();
    let mut max_blocks = 0;
    reqs.for_each(|_, r| {
        max_blocks = max_blocks.max(r.seqs.len());
        unique.extend(r.seqs.iter().copied());
    });
    Survey {
        unique_blocks: unique.len(),
        max_blocks,
    }
}

/// LRU set of sequence hashes with lazy deletion: stamps only grow, so the
/// queue stays sorted and eviction is a pop from the front.
#[derive(Default)]
struct Lru {
    map: HashMap<u64, u64>,
    queue: VecDeque<(u64, u64)>,
    clock: u64,
}

impl Lru {
    fn contains(&self, h: u64) -> bool {
        self.map.contains_key(&h)
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn touch(&mut self, h: u64) {
        self.clock += 1;
        self.map.insert(h, self.clock);
        self.queue.push_back((self.clock, h));
        // Bound the stale entries the lazy deletion leaves behind.
        if self.queue.len() > 4 * self.map.len() + 1024 {
            let map = &self.map;
            self.queue.retain(|(s, h)| map.get(h) == Some(s));
        }
    }
    fn pop_lru(&mut self) -> Option<u64> {
        while let Some((s, h)) = self.queue.pop_front() {
            if self.map.get(&h) == Some(&s) {
                self.map.remove(&h);
                return Some(h);
            }
        }
        None
    }
}

/// One simulated worker and the batch it is filling.
struct Worker {
    salt: u64,
    gpu: Lru,
    cpu: Lru,
    frames: Vec<Vec<u8>>,
    events: Vec<u8>,
    n_events: u32,
    ts: f64,
}

impl Worker {
    /// Engine hash of a block on this worker: unique per worker, stable per block.
    fn eh(&self, seq: u64) -> u64 {
        seq ^ self.salt
    }

    /// A `BlockRemoved` of `victims` from `medium` into this worker's batch
    /// (`hashes`: a buffer for their engine hashes).
    fn removed(&mut self, victims: &[u64], medium: &str, hashes: &mut Vec<u64>) {
        hashes.clear();
        hashes.extend(victims.iter().map(|&v| self.eh(v)));
        enc_removed(&mut self.events, hashes, medium, None);
        self.n_events += 1;
    }

    /// How many of `seqs`' leading blocks this worker's GPU tier holds.
    fn prefix_len(&self, seqs: &[u64]) -> usize {
        seqs.iter().take_while(|&&s| self.gpu.contains(s)).count()
    }
}

fn w<E: std::fmt::Debug, T>(r: Result<T, E>) -> T {
    r.expect("writing msgpack to a Vec cannot fail")
}

/// Append a positional vLLM `BlockStored` event.
pub fn enc_stored(
    out: &mut Vec<u8>,
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: usize,
    medium: &str,
) {
    w(rmp::encode::write_array_len(out, 7));
    w(rmp::encode::write_str(out, "BlockStored"));
    w(rmp::encode::write_array_len(out, hashes.len() as u32));
    for &h in hashes {
        w(rmp::encode::write_uint(out, h));
    }
    match parent {
        Some(p) => drop(w(rmp::encode::write_uint(out, p))),
        None => w(rmp::encode::write_nil(out)),
    }
    w(rmp::encode::write_array_len(out, tokens.len() as u32));
    for &t in tokens {
        w(rmp::encode::write_uint(out, t as u64));
    }
    w(rmp::encode::write_uint(out, block_size as u64));
    w(rmp::encode::write_nil(out)); // lora_id
    w(rmp::encode::write_str(out, medium));
}

/// The sliding-window group's `group_idx`.
const WINDOW_GROUP: u64 = 1;

/// Append a positional vLLM `BlockStored` of a sliding-window group (`stored`:
/// hashes, parent, tokens, block size), with every optional field up to the
/// group's: lora_id, medium, lora_name, extra_keys, group_idx, kind, window.
fn enc_window_stored(
    out: &mut Vec<u8>,
    (hashes, parent, tokens, block_size): (&[u64], Option<u64>, &[u32], usize),
    window: u32,
) {
    let mut head = Vec::new();
    enc_stored(&mut head, hashes, parent, tokens, block_size, "GPU");
    // The 7-element array's header, one byte (0x97), becomes a 12-element one.
    out.push(0x9c);
    out.extend_from_slice(&head[1..]);
    w(rmp::encode::write_nil(out)); // lora_name
    w(rmp::encode::write_nil(out)); // extra_keys
    w(rmp::encode::write_uint(out, WINDOW_GROUP));
    w(rmp::encode::write_str(out, "sliding_window"));
    w(rmp::encode::write_uint(out, window as u64));
}

/// Append a positional vLLM `BlockRemoved` event; with `group`, of that KV-cache
/// group (its fourth field), else full attention's (three fields, as vLLM sends).
fn enc_removed(out: &mut Vec<u8>, hashes: &[u64], medium: &str, group: Option<u64>) {
    w(rmp::encode::write_array_len(
        out,
        3 + u32::from(group.is_some()),
    ));
    w(rmp::encode::write_str(out, "BlockRemoved"));
    w(rmp::encode::write_array_len(out, hashes.len() as u32));
    for &h in hashes {
        w(rmp::encode::write_uint(out, h));
    }
    w(rmp::encode::write_str(out, medium));
    if let Some(g) = group {
        w(rmp::encode::write_uint(out, g));
    }
}

/// Wrap encoded events into a `[ts, [events...]]` batch (no dp rank, as vLLM without DP
/// omits it), or `[ts, [events...], nil]` with `dp_rank`, the form Dynamo's decoder requires.
pub fn enc_batch(ts: f64, n_events: u32, events: &[u8], dp_rank: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.len() + 16);
    w(rmp::encode::write_array_len(&mut out, 2 + dp_rank as u32));
    w(rmp::encode::write_f64(&mut out, ts));
    w(rmp::encode::write_array_len(&mut out, n_events));
    out.extend_from_slice(events);
    if dp_rank {
        w(rmp::encode::write_nil(&mut out));
    }
    out
}

/// Batch timestamps: the trace's milliseconds past this Unix time (seconds).
const BASE_TS: f64 = 1.7e9;

/// Route every request, simulate the caches, and encode all frames.
pub fn simulate(
    reqs: &Requests,
    survey: &Survey,
    cfg: &SimConfig,
    mut progress: impl FnMut(usize),
) -> Frames {
    // A request must fit in a worker, or the prefix it reuses could be evicted mid-request.
    let capacity = cfg.capacity.max(survey.max_blocks + 1);
    let mut workers: Vec<Worker> = (0..cfg.workers)
        .map(|i| Worker {
            salt: splitmix(cfg.seed ^ (0xC0FFEE + (!cfg.shared_engine_hashes as u64 * i as u64)))
                | 1,
            gpu: Lru::default(),
            cpu: Lru::default(),
            frames: Vec::new(),
            events: Vec::new(),
            n_events: 0,
            ts: BASE_TS,
        })
        .collect();
    let mut order = Vec::new();
    let mut sim = Sim {
        cfg,
        capacity,
        offload: (cfg.cpu_capacity > 0).then(|| Offload::new(reqs, cfg.block_size)),
        gpu_victims: Vec::new(),
        cpu_victims: Vec::new(),
        hashes: Vec::new(),
        st: SimStats {
            trace_unique_blocks: survey.unique_blocks as u64,
            capacity_blocks: capacity as u64,
            ..Default::default()
        },
    };
    let mut router = Router::new(cfg);
    reqs.for_each(|r, req| {
        if r % 64 == 0 {
            progress(r);
        }
        let wi = router.route(r, &req.seqs, &workers);
        let wk = &mut workers[wi];
        sim.serve(wk, req);
        if wk.n_events as usize >= cfg.batch_events {
            flush(wk, wi, cfg.batch_dp_rank, &mut order, &mut sim.st);
        }
    });
    let mut st = sim.st;
    for (wi, wk) in workers.iter_mut().enumerate() {
        flush(wk, wi, cfg.batch_dp_rank, &mut order, &mut st);
    }
    st.blocks_stored += st.cpu_blocks_stored + st.window_blocks_stored;
    st.blocks_removed += st.cpu_blocks_removed + st.window_blocks_removed;
    let mut unique = hashbrown::HashSet::new();
    for wk in &workers {
        let both = wk.cpu.map.keys().filter(|k| wk.gpu.contains(**k)).count();
        st.live_pairs += (wk.gpu.len() + wk.cpu.len() - both) as u64;
        unique.extend(wk.gpu.map.keys().chain(wk.cpu.map.keys()).copied());
    }
    st.live_unique_blocks = unique.len() as u64;
    progress(reqs.len());
    Frames {
        per_worker: workers.into_iter().map(|w| w.frames).collect(),
        order,
        stats: st,
    }
}

/// Assigns requests to workers by the policy, keeping each worker's recent load
/// (blocks routed over a sliding window) for prefix affinity.
struct Router {
    policy: Policy,
    seed: u64,
    window: usize,
    recent: VecDeque<(usize, usize)>,
    load: Vec<usize>,
}

impl Router {
    fn new(cfg: &SimConfig) -> Self {
        Router {
            policy: cfg.policy,
            seed: cfg.seed,
            window: 2 * cfg.workers,
            recent: VecDeque::new(),
            load: vec![0; cfg.workers],
        }
    }

    /// The worker for request `r` (of blocks `seqs`).
    fn route(&mut self, r: usize, seqs: &[u64], workers: &[Worker]) -> usize {
        let n = seqs.len();
        let wi = match self.policy {
            Policy::Random => (splitmix(self.seed ^ r as u64) % workers.len() as u64) as usize,
            Policy::PrefixAffinity => (0..workers.len())
                .min_by_key(|&i| (n - workers[i].prefix_len(seqs) + self.load[i], i))
                .unwrap_or(0),
        };
        self.recent.push_back((wi, n));
        self.load[wi] += n;
        if self.recent.len() > self.window {
            let (ow, on) = self.recent.pop_front().unwrap();
            self.load[ow] -= on;
        }
        wi
    }
}

/// The caches' settings, buffers reused from request to request, and the totals.
struct Sim<'a> {
    cfg: &'a SimConfig,
    /// GPU blocks per worker.
    capacity: usize,
    offload: Option<Offload>,
    gpu_victims: Vec<u64>,
    cpu_victims: Vec<u64>,
    hashes: Vec<u64>,
    st: SimStats,
}

impl Sim<'_> {
    /// Request `req` on worker `wk`: reuse its cached prefix, evict room for the
    /// rest, store the rest; the events go into the worker's batch.
    fn serve(&mut self, wk: &mut Worker, req: &Request) {
        let (bs, n) = (self.cfg.block_size, req.seqs.len());
        wk.ts = BASE_TS + req.timestamp_ms as f64 / 1000.0;
        let p = wk.prefix_len(&req.seqs);
        self.st.blocks_hit += p as u64;
        // Protect the reused prefix from this request's own evictions.
        for &s in req.seqs[..p].iter().rev() {
            wk.gpu.touch(s);
        }
        self.gpu_victims.clear();
        self.cpu_victims.clear();
        while wk.gpu.len() + (n - p) > self.capacity {
            match wk.gpu.pop_lru() {
                Some(v) => self.gpu_victims.push(v),
                None => break,
            }
        }
        // Stamp in reverse so a parent is always more recent than its children:
        // eviction then only ever removes leaves, as vLLM's free queue does.
        for &s in req.seqs.iter().rev() {
            wk.gpu.touch(s);
        }
        // Offload: victims go to the CPU tier first (their parents are still known),
        // then CPU evictions, then the GPU removal, then the new GPU blocks.
        self.offload_victims(wk);
        if !self.gpu_victims.is_empty() {
            wk.removed(&self.gpu_victims, "GPU", &mut self.hashes);
            self.st.blocks_removed += self.gpu_victims.len() as u64;
            if self.cfg.window_tokens > 0 {
                enc_removed(&mut wk.events, &self.hashes, "GPU", Some(WINDOW_GROUP));
                wk.n_events += 1;
                self.st.window_blocks_removed += self.gpu_victims.len() as u64;
            }
        }
        if p < n {
            self.hashes.clear();
            self.hashes.extend(req.seqs[p..].iter().map(|&s| wk.eh(s)));
            let parent = p.checked_sub(1).map(|i| wk.eh(req.seqs[i]));
            enc_stored(
                &mut wk.events,
                &self.hashes,
                parent,
                &req.tokens[p * bs..n * bs],
                bs,
                "GPU",
            );
            wk.n_events += 1;
            self.st.blocks_stored += (n - p) as u64;
            if self.cfg.window_tokens > 0 {
                let tokens = &req.tokens[p * bs..n * bs];
                let stored = (&self.hashes[..], parent, tokens, bs);
                enc_window_stored(&mut wk.events, stored, self.cfg.window_tokens);
                wk.n_events += 1;
                self.st.window_blocks_stored += (n - p) as u64;
            }
        }
    }

    /// With a CPU tier: store this request's GPU victims there, evicting its own
    /// least recent blocks for room.
    fn offload_victims(&mut self, wk: &mut Worker) {
        let Some(offload) = &self.offload else {
            return;
        };
        let bs = self.cfg.block_size;
        for &v in &self.gpu_victims {
            if wk.cpu.contains(v) {
                wk.cpu.touch(v);
                continue;
            }
            while wk.cpu.len() + 1 > self.cfg.cpu_capacity {
                match wk.cpu.pop_lru() {
                    Some(c) => self.cpu_victims.push(c),
                    None => break,
                }
            }
            wk.cpu.touch(v);
            let (parent, tokens) = offload.block(v, bs);
            let mut ev = std::mem::take(&mut wk.events);
            enc_stored(
                &mut ev,
                &[wk.eh(v)],
                parent.map(|p| wk.eh(p)),
                tokens,
                bs,
                "CPU",
            );
            wk.events = ev;
            wk.n_events += 1;
            self.st.cpu_blocks_stored += 1;
        }
        if !self.cpu_victims.is_empty() {
            wk.removed(&self.cpu_victims, "CPU", &mut self.hashes);
            self.st.cpu_blocks_removed += self.cpu_victims.len() as u64;
        }
    }
}

fn flush(
    wk: &mut Worker,
    wi: usize,
    dp_rank: bool,
    order: &mut Vec<(u32, u32)>,
    st: &mut SimStats,
) {
    if wk.n_events == 0 {
        return;
    }
    let payload = enc_batch(wk.ts, wk.n_events, &wk.events, dp_rank);
    st.frames += 1;
    st.events += wk.n_events as u64;
    st.payload_bytes += payload.len() as u64;
    order.push((wi as u32, wk.frames.len() as u32));
    wk.frames.push(payload);
    wk.events.clear();
    wk.n_events = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_prefix::{Shape, generate};

    /// Requests generated for each pass simulate to the frames the same requests
    /// held in memory do, offloaded blocks (read back from the first pass) included.
    #[test]
    fn generated_and_held_requests_simulate_alike() {
        let held = Requests::Held(generate(&Shape::default(), 400, 16, 3));
        let generated = Requests::Generated {
            shape: Shape::default(),
            count: 400,
            block_size: 16,
            seed: 3,
        };
        let cfg = SimConfig {
            workers: 4,
            block_size: 16,
            policy: Policy::PrefixAffinity,
            capacity: 300,
            cpu_capacity: 200,
            batch_events: 4,
            batch_dp_rank: true,
            shared_engine_hashes: false,
            window_tokens: 0,
            seed: 1,
        };
        let run = |reqs: &Requests| {
            let f = simulate(reqs, &survey(reqs), &cfg, |_| {});
            (f.per_worker, f.order, f.stats.cpu_blocks_stored)
        };
        let (a, b) = (run(&held), run(&generated));
        assert!(a.2 > 0, "no block was offloaded");
        assert_eq!(a, b);
    }

    /// kvix reads the window group's events as vLLM's hybrid models send them.
    #[test]
    fn window_group_events_decode_as_a_sliding_window_group() {
        use kvix::wire::{Batch, EventOp, GroupKind, decode};
        let tokens: Vec<u32> = (0..32).collect();
        let mut ev = Vec::new();
        enc_window_stored(&mut ev, (&[5, 6], Some(4), &tokens, 16), 4096);
        enc_removed(&mut ev, &[6], "GPU", Some(WINDOW_GROUP));
        let frame = enc_batch(1.0, 2, &ev, false);
        let mut batch = Batch::default();
        decode(&frame, &mut batch).expect("kvix decodes the frame");
        let got: Vec<_> = batch
            .events(&frame)
            .map(|e| {
                (
                    e.op,
                    e.hashes.len(),
                    e.group_idx,
                    e.group_kind,
                    e.group_window,
                )
            })
            .collect();
        let window = GroupKind::SlidingWindow;
        assert_eq!(got[0], (EventOp::Stored, 2, Some(1), window, Some(4096)));
        assert_eq!(
            (got[1].0, got[1].1, got[1].2),
            (EventOp::Removed, 1, Some(1))
        );
    }

    #[test]
    fn batch_dp_rank_is_a_trailing_nil() {
        let mut ev = Vec::new();
        enc_removed(&mut ev, &[7], "GPU", None);
        let two = enc_batch(1.0, 1, &ev, false);
        let three = enc_batch(1.0, 1, &ev, true);
        assert_eq!(two[0], 0x92);
        assert_eq!(three[0], 0x93);
        assert_eq!(&three[1..three.len() - 1], &two[1..]);
        assert_eq!(three.last(), Some(&0xc0));
    }

    #[test]
    fn lru_evicts_oldest_and_skips_stale() {
        let mut l = Lru::default();
        l.touch(1);
        l.touch(2);
        l.touch(1);
        assert_eq!(l.pop_lru(), Some(2));
        assert_eq!(l.pop_lru(), Some(1));
        assert_eq!(l.pop_lru(), None);
    }
}
