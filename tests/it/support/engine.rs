//! Engines: publishers that speak the engines' ZMQ framing (`Publisher`), their
//! registration, and engines with a replay ROUTER driven by a workload (`Engine`).

use super::*;

/// Registers worker `instance` of `model` (block size 4) at `p`'s endpoint and
/// waits until `p` has a subscriber. Returns the answer.
pub fn register(s: &Server, model: &str, instance: u64, p: &Publisher) -> Value {
    register_with(s, model, instance, p, serde_json::json!({}))
}

/// `N` publishers, registered as workers 1 to `N` of `model` (block size 4).
pub fn workers<const N: usize>(s: &Server, ctx: &zmq::Context, model: &str) -> [Publisher; N] {
    let pubs = publishers(ctx);
    for (i, p) in pubs.iter().enumerate() {
        register(s, model, i as u64 + 1, p);
    }
    pubs
}

/// `N` publishers, each on a free loopback port.
pub fn publishers<const N: usize>(ctx: &zmq::Context) -> [Publisher; N] {
    std::array::from_fn(|_| Publisher::bind(ctx))
}

/// [`register`] with `extra`'s fields (`dp_rank`, `replay_endpoint`, ...) added to
/// the body.
pub fn register_with(s: &Server, model: &str, instance: u64, p: &Publisher, extra: Value) -> Value {
    let mut body = serde_json::json!({
        "instance_id": instance,
        "endpoint": p.endpoint,
        "model_name": model,
        "block_size": 4,
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    let answer = s.post_ok("/register", &body);
    p.wait_subscriber();
    answer
}

/// Flags that start kvix on two threads with `workers` (`--workers` syntax) as
/// the workers of `model` at block size 4, then `extra`.
pub fn worker_flags<'a>(model: &'a str, workers: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec![
        "--threads",
        "2",
        "--block-size",
        "4",
        "--model-name",
        model,
        "--workers",
        workers,
    ];
    flags.extend_from_slice(extra);
    flags
}

/// An engine's KV-event publisher. It is an XPUB socket (the same wire as the
/// engines' PUB) so the test can see when the indexer's SUB has subscribed
/// instead of sleeping through ZMQ's slow-joiner window.
pub struct Publisher {
    pub sock: zmq::Socket,
    pub endpoint: String,
    next_seq: u64,
}

impl Publisher {
    pub fn bind(ctx: &zmq::Context) -> Publisher {
        Self::bind_at(ctx, "tcp://127.0.0.1:*")
    }

    pub fn bind_at(ctx: &zmq::Context, addr: &str) -> Publisher {
        Self::bind_hwm(ctx, addr, 0)
    }

    /// Bind with a send high-water mark (0: unbounded). libzmq copies socket options
    /// into a listener when it binds, so the mark must be set before binding.
    pub fn bind_hwm(ctx: &zmq::Context, addr: &str, hwm: i32) -> Publisher {
        let sock = ctx.socket(zmq::XPUB).unwrap();
        // Pass every subscribe up, also a repeat of a topic (a re-registered listener).
        sock.set_xpub_verbose(true).unwrap();
        sock.set_sndhwm(hwm).unwrap();
        sock.set_linger(0).unwrap();
        // A just-closed socket releases its port asynchronously (ZMQ's I/O thread).
        let mut tries = 0;
        while let Err(e) = sock.bind(addr) {
            tries += 1;
            assert!(tries < 200, "bind {addr}: {e}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let endpoint = sock.get_last_endpoint().unwrap().unwrap();
        Publisher {
            sock,
            endpoint,
            next_seq: 0,
        }
    }

    /// Block until a subscriber has subscribed (the indexer connected).
    pub fn wait_subscriber(&self) {
        self.sock.set_rcvtimeo(10_000).unwrap();
        // Unsubscribes (0) of a listener that just went away are skipped.
        loop {
            let msg = self
                .sock
                .recv_bytes(0)
                .expect("no subscriber connected within 10 s");
            if msg.first() == Some(&1u8) {
                break;
            }
            assert_eq!(msg.first(), Some(&0u8), "expected a (un)subscribe message");
        }
    }

    /// Send `[topic, seq (8 bytes BE), payload]` with the next sequence number.
    pub fn send(&mut self, payload: &[u8]) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.send_seq(seq, payload);
    }

    pub fn send_seq(&self, seq: u64, payload: &[u8]) {
        self.sock
            .send_multipart([&b"kv-events"[..], &seq.to_be_bytes()[..], payload], 0)
            .unwrap();
    }

    pub fn send_frames(&self, frames: &[&[u8]]) {
        self.sock.send_multipart(frames, 0).unwrap();
    }
}

/// A deterministic engine workload (block size 4): stores that extend earlier blocks or
/// start new chains, and removes of leaf-ish blocks. Remembers every live block's token
/// prefix so tests can query it.
pub struct Workload {
    rng: u64,
    base: u64,
    next_hash: u64,
    /// engine hash → full token prefix up to and including that block.
    pub live: BTreeMap<u64, Vec<u32>>,
}

impl Workload {
    pub fn new(seed: u64, base: u64) -> Workload {
        Workload {
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            base,
            next_hash: 1,
            live: BTreeMap::new(),
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    /// The next batch payload.
    pub fn next(&mut self) -> Vec<u8> {
        if self.live.len() > 8 && self.rand(5) == 0 {
            let keys: Vec<u64> = self.live.keys().copied().collect();
            let h = keys[self.rand(keys.len() as u64) as usize];
            self.live.remove(&h);
            return removed(&[h]);
        }
        let parent = if self.live.is_empty() || self.rand(3) == 0 {
            None
        } else {
            let keys: Vec<u64> = self.live.keys().copied().collect();
            Some(keys[self.rand(keys.len() as u64) as usize])
        };
        let mut prefix = parent.map(|p| self.live[&p].clone()).unwrap_or_default();
        let n = 1 + self.rand(3) as usize;
        let mut hashes = Vec::new();
        let mut tokens = Vec::new();
        for _ in 0..n {
            let h = self.base + self.next_hash;
            self.next_hash += 1;
            let t: Vec<u32> = (0..4).map(|_| self.rand(50) as u32).collect();
            tokens.extend_from_slice(&t);
            prefix.extend_from_slice(&t);
            self.live.insert(h, prefix.clone());
            hashes.push(h);
        }
        stored(&hashes, parent, &tokens, 4)
    }

    /// A few prompts: the prefixes of some live blocks.
    pub fn prompts(&self, n: usize) -> Vec<Vec<u32>> {
        self.live
            .values()
            .step_by((self.live.len() / n).max(1))
            .cloned()
            .collect()
    }
}

/// An engine: an XPUB publisher plus vLLM's replay ROUTER serving its ring buffer.
/// Chosen sequence numbers can be dropped (buffered but never published).
pub struct Engine {
    pub publisher: Publisher,
    pub replay_endpoint: String,
    buffer: ReplayBuffer,
    next_seq: u64,
    pub drop: HashSet<u64>,
    /// Batches the replay buffer keeps at least (it holds up to twice as many).
    pub keep: usize,
    /// Milliseconds the ROUTER waits before answering (lets live frames pile up).
    pub replay_delay_ms: Arc<AtomicU64>,
    pub replay_requests: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    pub fn start(ctx: &zmq::Context) -> Engine {
        Self::start_hwm(ctx, 0)
    }

    /// An engine registered on `s` as `instance` of `model` (block size 4), once
    /// kvix has subscribed to it.
    pub fn registered(ctx: &zmq::Context, s: &Server, instance: u64, model: &str) -> Engine {
        let e = Self::start(ctx);
        s.post_ok(
            "/register",
            &serde_json::json!({"instance_id": instance, "endpoint": e.endpoint(), "model_name": model, "block_size": 4}),
        );
        e.publisher.wait_subscriber();
        e
    }

    /// An engine whose publisher drops frames beyond `hwm` queued ones per subscriber,
    /// as an engine under pressure does (0: unbounded).
    pub fn start_hwm(ctx: &zmq::Context, hwm: i32) -> Engine {
        let publisher = Publisher::bind_hwm(ctx, "tcp://127.0.0.1:*", hwm);
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let replay_endpoint = router.get_last_endpoint().unwrap().unwrap();
        let buffer: ReplayBuffer = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let delay = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let thread = {
            let (buffer, stop, delay, requests) = (
                buffer.clone(),
                stop.clone(),
                delay.clone(),
                requests.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if router.poll(zmq::POLLIN, 50).unwrap_or(0) == 0 {
                        continue;
                    }
                    let frames = router.recv_multipart(0).unwrap();
                    // vLLM: [client_id, b"", start_seq (8 bytes BE)].
                    assert_eq!(frames.len(), 3, "replay request frames");
                    assert!(frames[1].is_empty());
                    let start = u64::from_be_bytes(frames[2].as_slice().try_into().unwrap());
                    requests.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(delay.load(Ordering::Relaxed)));
                    let items: Vec<(u64, Vec<u8>)> = buffer
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(s, _)| *s >= start)
                        .cloned()
                        .collect();
                    let id = &frames[0];
                    for (seq, payload) in items {
                        router
                            .send_multipart([&id[..], b"", &seq.to_be_bytes(), &payload], 0)
                            .unwrap();
                    }
                    router
                        .send_multipart([&id[..], b"", &(-1i64).to_be_bytes(), b""], 0)
                        .unwrap();
                }
            })
        };
        Engine {
            publisher,
            replay_endpoint,
            buffer,
            next_seq: 0,
            drop: HashSet::new(),
            keep: usize::MAX / 2,
            replay_delay_ms: delay,
            replay_requests: requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn endpoint(&self) -> String {
        self.publisher.endpoint.clone()
    }

    /// Buffer `payload` under the next sequence number and publish it (unless dropped).
    pub fn publish(&mut self, payload: &[u8]) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        {
            // Like vLLM's replay buffer: only the most recent batches are kept.
            let mut b = self.buffer.lock().unwrap();
            if b.len() >= 2 * self.keep {
                b.drain(..self.keep);
            }
            b.push((seq, payload.to_vec()));
        }
        if !self.drop.contains(&seq) {
            self.publisher.send_seq(seq, payload);
        }
        seq
    }

    /// The engine restarts: its replay buffer starts empty and its numbers from 0.
    pub fn restart(&mut self) {
        self.buffer.lock().unwrap().clear();
        self.next_seq = 0;
    }

    /// Buffer without publishing (the frame is lost on the wire, or was published
    /// before anyone subscribed).
    pub fn lose(&mut self, payload: &[u8]) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.buffer.lock().unwrap().push((seq, payload.to_vec()));
        seq
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An engine's replay ring buffer: (seq, payload) in publish order.
type ReplayBuffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
