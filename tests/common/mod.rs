//! Black-box test harness: the real `kvix` binary, real HTTP, real ZMQ publishers.
//!
//! Owns starting/stopping the server on a free port, a small HTTP client and a
//! publisher that speaks the engines' wire framing. Everything binds 127.0.0.1.

#![allow(dead_code)]

pub mod tokenizer;

use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The number in environment variable `name`, or `default` if it is unset or not a
/// number (long forms and figure runs take their sizes this way).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A free TCP port on loopback (bound, then released for the child to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh directory with `files` written into it (a tokenizer and its config).
pub fn dir_with(tag: &str, files: &[(&str, String)]) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvix-prompts-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for (name, text) in files {
        std::fs::write(d.join(name), text).unwrap();
    }
    d
}

/// A refused POST's `(status, field, message)`, from its JSON error.
pub fn error(s: &Server, path: &str, body: &Value) -> (u16, String, String) {
    let (st, v) = s.post_json(path, body);
    (
        st,
        v["field"].as_str().unwrap_or_default().to_string(),
        v["error"].as_str().unwrap_or_default().to_string(),
    )
}

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

/// The binary under test: this build's, or `KVIX_TEST_BIN` (to run the same tests
/// against another build, e.g. an earlier commit's). Another workspace member's
/// tests (kvix-load's) get the `kvix` this build put beside them: cargo builds it
/// before any test runs when the whole workspace is tested.
pub fn kvix_bin() -> String {
    if let Ok(bin) = std::env::var("KVIX_TEST_BIN") {
        return bin;
    }
    if let Some(bin) = option_env!("CARGO_BIN_EXE_kvix") {
        return bin.to_string();
    }
    // target/<profile>/deps/<test> -> target/<profile>/kvix
    let exe = std::env::current_exe().expect("test executable path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("kvix");
    assert!(
        bin.exists(),
        "no kvix at {}: test the workspace (`cargo test --workspace`) or set KVIX_TEST_BIN",
        bin.display()
    );
    bin.display().to_string()
}

/// `(status, body text)` of a response.
pub fn reply(mut resp: ureq::http::Response<ureq::Body>) -> (u16, String) {
    let mut text = String::new();
    resp.body_mut()
        .as_reader()
        .read_to_string(&mut text)
        .unwrap();
    (resp.status().as_u16(), text)
}

static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An HTTP client that hands back every status as a reply (a 4xx or 5xx is what
/// a test checks, not an error), within `timeout` a request if given.
pub fn agent(timeout: Option<Duration>) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(timeout)
        .build()
        .into()
}

/// One running `kvix` process; killed on drop. Its stderr (the log) goes to a file.
pub struct Server {
    child: Child,
    pub port: u16,
    pub base: String,
    log: PathBuf,
    agent: ureq::Agent,
}

impl Server {
    /// Start `kvix` on a port of its own choosing (`--port 0`, read from its log): no
    /// port is picked here and handed over, so parallel tests never race for one.
    pub fn start(extra: &[&str]) -> Server {
        Self::launch(extra, None, None)
    }

    /// Start `kvix` with an open-file limit (`ulimit -n`) and a port; `None` lets it
    /// choose (`--port 0`) and reads the port it logs.
    pub fn launch(extra: &[&str], nofile: Option<u32>, port: Option<u16>) -> Server {
        Self::launch_until(extra, nofile, port, true)
    }

    /// Like [`Server::start`], but returns once every core serves, while startup
    /// recovery may still run (data routes answer 503 until it ends).
    pub fn start_recovering(extra: &[&str]) -> Server {
        Self::launch_until(extra, None, None, false)
    }

    /// Start `kvix`; return once `/ready` answers 200 (`ready`), or once it is past
    /// "starting" (every core serves; recovery may still run).
    fn launch_until(extra: &[&str], nofile: Option<u32>, port: Option<u16>, ready: bool) -> Server {
        let n = LAUNCHES.fetch_add(1, Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("kvix-test-{}-{n}.log", std::process::id()));
        let port_arg = port.unwrap_or(0).to_string();
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.args([
                    "-c",
                    &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                    &kvix_bin(),
                ]);
                c
            }
            None => Command::new(kvix_bin()),
        };
        let child = cmd
            .args(["--host", "127.0.0.1", "--port", &port_arg])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start kvix");
        let agent = agent(Some(Duration::from_secs(20)));
        let mut s = Server {
            child,
            port: port.unwrap_or(0),
            base: String::new(),
            log,
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        if port.is_none() {
            while s.port == 0 {
                let text = s.log();
                if let Some(p) = text
                    .split("kvix listening on http://127.0.0.1:")
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|p| p.parse().ok())
                {
                    s.port = p;
                }
                assert!(Instant::now() < deadline, "no port logged:\n{text}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s.base = format!("http://127.0.0.1:{}", s.port);
        while Instant::now() < deadline {
            // One core answering `/health` is not every core serving: data routes
            // answer 503 while the service is still starting.
            if let Ok(mut r) = s.agent.get(format!("{}/ready", s.base)).call()
                && let Ok(text) = r.body_mut().read_to_string()
                && (if ready {
                    r.status() == 200
                } else {
                    !text.contains("starting")
                })
            {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("kvix did not start serving; log:\n{}", s.log());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`TERM`, `HUP`, ...).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status();
    }

    /// The exit status once the process ends (within `within`), else `None`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The slot tracker's URL, for a server started with `--slot-tracker-port 0`
    /// (read from its log).
    pub fn slot_tracker_url(&self) -> String {
        self.log()
            .split("slot tracker on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .expect("the slot tracker's address logged")
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `(status, body)` of a request; the body parsed as JSON when it is JSON.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let url = format!("{}{path}", self.base);
        let resp = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("POST", Some(b)) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(b),
            ("POST", None) => self.agent.post(&url).send_empty(),
            ("PUT", _) => self.agent.put(&url).send_empty(),
            _ => unreachable!(),
        };
        reply(resp.unwrap_or_else(|e| panic!("{method} {path}: {e}")))
    }

    pub fn get_json(&self, path: &str) -> Value {
        let (st, body) = self.call("GET", path, None);
        assert_eq!(st, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let (st, text) = self.call("POST", path, Some(&body.to_string()));
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (st, v)
    }

    /// POST and require a 2xx answer.
    pub fn post_ok(&self, path: &str, body: &Value) -> Value {
        let (st, v) = self.post_json(path, body);
        assert!((200..300).contains(&st), "POST {path} {body}: {st} {v}");
        v
    }

    /// Poll `probe` until it returns true (or fail with the last observation).
    pub fn eventually(&self, what: &str, mut probe: impl FnMut() -> Result<(), String>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last;
        loop {
            match probe() {
                Ok(()) => return,
                Err(e) => last = e,
            }
            if Instant::now() > deadline {
                panic!(
                    "{what} never happened; last: {last}\nserver log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Poll `/query` with `body` until its `scores` are `want`.
    pub fn wait_scores(&self, body: &Value, want: &Value) {
        self.eventually(&format!("scores {want} for {body}"), || {
            let v = self.post_json("/query", body).1;
            (v["scores"] == *want).then_some(()).ok_or(v.to_string())
        });
    }

    /// Wait until the server has logged a line containing `needle`.
    pub fn wait_log(&self, needle: &str) {
        self.eventually(&format!("log line `{needle}`"), || {
            if self.log().contains(needle) {
                Ok(())
            } else {
                Err("not logged yet".into())
            }
        });
    }

    /// Poll a JSON POST until its answer equals `want`.
    pub fn wait_post_eq(&self, path: &str, body: &Value, want: &Value) {
        self.eventually(&format!("POST {path} {body} == {want}"), || {
            let (st, v) = self.post_json(path, body);
            if st == 200 && &v == want {
                Ok(())
            } else {
                Err(format!("{st} {v}"))
            }
        });
    }

    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test keeps its server's log to read; a passing one leaves nothing.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
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

/// Engine payloads generated with msgspec by `scripts/gen_vllm_fixtures.py`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/wire_fixtures.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let hex = all[name]
        .as_str()
        .unwrap_or_else(|| panic!("no fixture {name}"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

// ---- Recovery harness: engines with a replay ROUTER, workloads, dumps. ----

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

impl Server {
    /// Send SIGTERM (graceful stop: final snapshot) and wait for the exit code.
    pub fn terminate(mut self) -> (Option<i32>, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        let code = loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                break st.code();
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (code, self.log())
    }

    /// One scalar of `/metrics` (sum over every sample of `name` whose labels include `labels`).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (st, text) = self.call("GET", "/metrics", None);
        assert_eq!(st, 200);
        metric_in(&text, name, labels)
    }
}

/// Sum of the samples of `name` (with `labels` among theirs) in Prometheus text.
pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("metrics parse");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            _ => 0.0,
        })
        .sum()
}

/// The start of a vLLM positional `KVEventBatch` (timestamp, then an array of one
/// event): the event's encoding goes next.
fn batch_of_one() -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_array_len(&mut b, 2).unwrap();
    rmp::encode::write_f64(&mut b, 1.5).unwrap();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    b
}

/// Fixture `name` with the first `from` in it replaced by `to` (as long): a
/// frame that is well-formed msgpack but not a valid event.
pub fn fixture_with(name: &str, from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut b = fixture(name);
    let at = b
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{name} has no {from:?}"));
    b[at..at + to.len()].copy_from_slice(to);
    b
}

/// vLLM positional `KVEventBatch` with one `BlockStored` (device tier).
pub fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], block_size: u32) -> Vec<u8> {
    stored_on(hashes, parent, tokens, block_size, None)
}

/// [`stored`] on `medium` (`None`: the device).
pub fn stored_on(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
    medium: Option<&str>,
) -> Vec<u8> {
    let mut b = batch_of_one();
    event_of_hashes(&mut b, "BlockStored", 7, hashes);
    match parent {
        Some(h) => {
            rmp::encode::write_uint(&mut b, h).unwrap();
        }
        None => rmp::encode::write_nil(&mut b).unwrap(),
    }
    let tokens: Vec<u64> = tokens.iter().map(|&t| t as u64).collect();
    write_uints(&mut b, &tokens);
    rmp::encode::write_uint(&mut b, block_size as u64).unwrap();
    rmp::encode::write_nil(&mut b).unwrap();
    match medium {
        Some(m) => rmp::encode::write_str(&mut b, m).unwrap(),
        None => rmp::encode::write_nil(&mut b).unwrap(),
    }
    b
}

/// vLLM positional `KVEventBatch` with one `AllBlocksCleared`.
pub fn all_cleared() -> Vec<u8> {
    let mut b = batch_of_one();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    rmp::encode::write_str(&mut b, "AllBlocksCleared").unwrap();
    b
}

/// A `KVEventBatch` with one `AllBlocksCleared` of `medium` only, as current vLLM
/// encodes events (a tagged map).
pub fn cleared_on(medium: &str) -> Vec<u8> {
    let mut b = batch_of_one();
    rmp::encode::write_map_len(&mut b, 2).unwrap();
    rmp::encode::write_str(&mut b, "type").unwrap();
    rmp::encode::write_str(&mut b, "AllBlocksCleared").unwrap();
    rmp::encode::write_str(&mut b, "medium").unwrap();
    rmp::encode::write_str(&mut b, medium).unwrap();
    b
}

/// vLLM positional `KVEventBatch` with one `BlockRemoved`.
pub fn removed(hashes: &[u64]) -> Vec<u8> {
    let mut b = batch_of_one();
    event_of_hashes(&mut b, "BlockRemoved", 3, hashes);
    rmp::encode::write_nil(&mut b).unwrap();
    b
}

/// The head of a positional event of `fields` fields: its tag, then `hashes`.
fn event_of_hashes(b: &mut Vec<u8>, tag: &str, fields: u32, hashes: &[u64]) {
    rmp::encode::write_array_len(b, fields).unwrap();
    rmp::encode::write_str(b, tag).unwrap();
    write_uints(b, hashes);
}

/// A msgpack array of unsigned integers.
pub fn write_uints(b: &mut Vec<u8>, values: &[u64]) {
    rmp::encode::write_array_len(b, values.len() as u32).unwrap();
    for v in values {
        rmp::encode::write_uint(b, *v).unwrap();
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

/// An engine's replay ring buffer: (seq, payload) in publish order.
type ReplayBuffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

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

/// One dump event reduced to what identifies it:
/// (worker_id, dp_rank, block_hash, parent_hash, tokens_hash, storage_tier).
pub type Row = (u64, u64, u64, Option<u64>, u64, String);

/// `/dump` of `model:default`: its block size and its events as rows, in dump order.
pub fn dump_rows(s: &Server, model: &str) -> (Option<u64>, Vec<Row>) {
    let d = s.get_json("/dump");
    let ix = &d[format!("{model}:default")];
    let rows = ix["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let st = &e["event"]["data"]["stored"];
            let b = &st["blocks"][0];
            (
                e["worker_id"].as_u64().unwrap(),
                e["event"]["dp_rank"].as_u64().unwrap(),
                b["block_hash"].as_u64().unwrap(),
                st["parent_hash"].as_u64(),
                b["tokens_hash"].as_u64().unwrap(),
                e["storage_tier"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (ix["block_size"].as_u64(), rows)
}

/// `/dump` of `model:default` as a set of rows (and the count, to catch duplicates).
pub fn dump_set(s: &Server, model: &str) -> (BTreeSet<Row>, usize) {
    let rows = dump_rows(s, model).1;
    let n = rows.len();
    (rows.into_iter().collect(), n)
}

/// Wait until `a`'s and `b`'s dumps are equal as sets (and without duplicates).
pub fn wait_same_dump(a: &Server, b: &Server, model: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (sa, na) = dump_set(a, model);
        let (sb, nb) = dump_set(b, model);
        if sa == sb && na == sa.len() && nb == sb.len() && !sa.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let only_a: Vec<_> = sa.difference(&sb).take(5).collect();
            let only_b: Vec<_> = sb.difference(&sa).take(5).collect();
            panic!(
                "dumps differ: {} vs {} rows ({na}/{nb} events); only in a: {only_a:?}; only in b: {only_b:?}\nlog a:\n{}\nlog b:\n{}",
                sa.len(),
                sb.len(),
                a.log(),
                b.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Assert both servers answer `/query` identically for every prompt.
pub fn same_answers(a: &Server, b: &Server, model: &str, prompts: &[Vec<u32>]) {
    for p in prompts {
        let q = serde_json::json!({"token_ids": p, "model_name": model});
        let (ra, rb) = (a.post_json("/query", &q), b.post_json("/query", &q));
        assert_eq!(ra, rb, "query {p:?}");
    }
}

/// Resident set size of a process, in MiB (0 once it is gone).
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Queries `base` from `conns` connections of their own (spread over the
/// executors) until [`QueryLoop::finish`], noting the longest any waited.
pub struct QueryLoop {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(Duration, u64)>>,
}

impl QueryLoop {
    pub fn start(base: &str, conns: usize, body: Value) -> QueryLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..conns)
            .map(|_| {
                let (stop, url, body) = (stop.clone(), format!("{base}/query"), body.to_string());
                std::thread::spawn(move || {
                    let agent = agent(Some(Duration::from_secs(60)));
                    let (mut worst, mut n) = (Duration::ZERO, 0);
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let mut r = agent
                            .post(&url)
                            .header("Content-Type", "application/json")
                            .send(&body)
                            .expect("query");
                        let text = r.body_mut().read_to_string().expect("query body");
                        assert_eq!(r.status(), 200, "{text}");
                        worst = worst.max(t.elapsed());
                        n += 1;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    (worst, n)
                })
            })
            .collect();
        QueryLoop { stop, threads }
    }

    /// The longest wait of any query, and how many were answered.
    pub fn finish(self) -> (Duration, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("query thread"))
            .fold((Duration::ZERO, 0), |(w, n), (tw, tn)| (w.max(tw), n + tn))
    }
}
