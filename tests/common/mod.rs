//! Black-box test harness: the real `kvix` binary, real HTTP, real ZMQ publishers.
//!
//! Owns starting/stopping the server on a free port, a small HTTP client and a
//! publisher that speaks the engines' wire framing. Everything binds 127.0.0.1.

#![allow(dead_code)]

use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on loopback (bound, then released for the child to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    pub fn start(extra: &[&str]) -> Server {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("kvix-test-{}-{port}.log", std::process::id()));
        let child = Command::new(env!("CARGO_BIN_EXE_kvix"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start kvix");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let s = Server {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
            log,
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(r) = s.agent.get(format!("{}/health", s.base)).call()
                && r.status() == 200
            {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("kvix did not become healthy; log:\n{}", s.log());
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
        let mut resp = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let mut text = String::new();
        resp.body_mut()
            .as_reader()
            .read_to_string(&mut text)
            .unwrap();
        (status, text)
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
        let deadline = Instant::now() + Duration::from_secs(10);
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
        let sock = ctx.socket(zmq::XPUB).unwrap();
        sock.set_sndhwm(0).unwrap();
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
        let msg = self
            .sock
            .recv_bytes(0)
            .expect("no subscriber connected within 10 s");
        assert_eq!(msg.first(), Some(&1u8), "expected a subscribe message");
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
