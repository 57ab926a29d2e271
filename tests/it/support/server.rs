//! The server under test: starting the real `kvix` binary on a port of its own
//! choosing, calling it over HTTP, stopping it, and comparing two servers' dumps.

use super::*;

/// The number in environment variable `name`, or `default` if it is unset or not a
/// number (long forms and figure runs take their sizes this way).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A port on 127.0.0.1 held by a socket that is bound but never listens: connecting
/// to it is refused at once, and the system hands it to no other socket while this
/// one lives (a port picked, released and handed over could be taken in between).
///
/// It serves as an address where nothing answers, and as a port to name before the
/// server that takes it starts (replicas that name each other): this socket sets
/// `SO_REUSEADDR` and does not listen, so a server that binds with `SO_REUSEADDR`
/// too (libzmq's sockets, tokio's listeners) takes the port beside it.
pub struct ReservedPort {
    _socket: socket2::Socket,
    pub port: u16,
}

impl ReservedPort {
    pub fn new() -> ReservedPort {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_reuse_address(true).unwrap();
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).unwrap();
        let port = socket.local_addr().unwrap().as_socket().unwrap().port();
        ReservedPort {
            _socket: socket,
            port,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `tcp://127.0.0.1:<port>`, a ZMQ endpoint.
    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }
}

/// A fresh directory with `files` written into it (a tokenizer and its config).
/// Numbered per call: tests of every module run in one process, and two may pick
/// the same tag.
pub fn dir_with(tag: &str, files: &[(&str, String)]) -> PathBuf {
    static DIRS: AtomicU64 = AtomicU64::new(0);
    let n = DIRS.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("kvix-test-{tag}-{}-{n}", std::process::id()));
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

    /// The endpoint its `--zmq-bind` socket is bound to, for one bound to port 0 (read
    /// from its log).
    pub fn zmq_bind_endpoint(&self) -> String {
        let said = "bound for pods' publishers on ";
        self.wait_log(said);
        self.log()
            .split(said)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .expect("the bound endpoint logged")
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

/// One of Dynamo's servers (`scripts/dynamo_peer`'s binaries), started from `bin`
/// with `extra` flags on a port reserved for it; killed on drop.
pub struct Dynamo {
    child: Child,
    pub base: String,
}

impl Dynamo {
    pub fn start(bin: &str, extra: &[&str]) -> Dynamo {
        let port = ReservedPort::new();
        let child = Command::new(bin)
            .args(["--port", &port.port.to_string(), "--runtime-threads", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let d = Dynamo {
            child,
            base: port.url(),
        };
        let a = agent(Some(Duration::from_secs(1)));
        let deadline = Instant::now() + Duration::from_secs(30);
        while a.get(format!("{}/health", d.base)).call().is_err() {
            assert!(Instant::now() < deadline, "{bin} did not start serving");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
}
