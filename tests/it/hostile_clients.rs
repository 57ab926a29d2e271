//! What a hostile or careless client, or a signal, can do to the real binary over
//! real sockets: exhaust descriptors, hold connections open, half-close, start a
//! second server on the port, send SIGHUP, ask for port 0, ask for absurd threads.

use crate::support::{self, Server, stored, workers};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// CPU seconds (user + system) the process has used, from /proc.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf reads a constant.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Read until the peer closes (or the read timeout); returns the bytes and whether it
/// was a close.
fn read_until_close(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

#[test]
fn descriptor_exhaustion_pauses_accepting_and_recovers() {
    // More connections allowed than descriptors: accept itself runs out (EMFILE).
    let mut s = Server::launch(
        &["--threads", "2", "--max-connections", "1000"],
        Some(128),
        None,
    );
    // Idle executors spin briefly before parking: that is the baseline.
    let (cpu0, t0) = (cpu_secs(s.pid()), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let idle = (cpu_secs(s.pid()) - cpu0) / t0.elapsed().as_secs_f64();
    let mut held = Vec::new();
    for _ in 0..200 {
        if let Ok(c) = TcpStream::connect_timeout(
            &format!("127.0.0.1:{}", s.port).parse().unwrap(),
            Duration::from_millis(200),
        ) {
            held.push(c);
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (cpu0, t0) = (cpu_secs(s.pid()), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let busy = (cpu_secs(s.pid()) - cpu0) / t0.elapsed().as_secs_f64();
    let log_bytes = s.log().len();
    eprintln!("{busy:.2} cores busy while out of descriptors ({idle:.2} idle)");
    // A CPU figure: asserted on a quiet machine (`--features perf-checks`).
    if cfg!(feature = "perf-checks") {
        assert!(
            busy < idle + 0.3,
            "{busy:.2} cores busy while out of descriptors ({idle:.2} idle)"
        );
    }
    assert!(log_bytes < 200_000, "log grew to {log_bytes} bytes");
    assert!(s.log().contains("pausing accepts"), "{}", s.log());
    drop(held);
    // Descriptors are back: the service answers again.
    s.eventually(
        "/health answers after the connections closed",
        || match TcpStream::connect(("127.0.0.1", s.port)) {
            Ok(mut c) => {
                c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let (r, _) = read_until_close(&mut c);
                if r.starts_with(b"HTTP/1.1 200") {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&r).into_owned())
                }
            }
            Err(e) => Err(e.to_string()),
        },
    );
    s.signal("TERM");
    let st = s.wait_exit(Duration::from_secs(20));
    assert_eq!(
        st.and_then(|s| s.code()),
        Some(0),
        "SIGTERM did not stop it"
    );
}

#[test]
fn slow_headers_and_idle_connections_are_closed() {
    let s = Server::start(&[
        "--threads",
        "2",
        "--header-timeout-ms",
        "500",
        "--body-timeout-ms",
        "500",
    ]);
    // Headers never finished.
    let mut c = connect(s.port);
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    let t = Instant::now();
    let (_, closed) = read_until_close(&mut c);
    assert!(
        closed && t.elapsed() < Duration::from_secs(5),
        "partial headers held {:?}",
        t.elapsed()
    );
    // An idle keep-alive connection after one answer.
    let mut c = connect(s.port);
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    let (r, closed) = read_until_close(&mut c);
    assert!(
        r.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&r)
    );
    assert!(
        closed && t.elapsed() < Duration::from_secs(5),
        "idle connection held {:?}",
        t.elapsed()
    );
    // A body that never arrives: 408 with a JSON error.
    let mut c = connect(s.port);
    c.write_all(
        b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"token",
    )
    .unwrap();
    let (r, _) = read_until_close(&mut c);
    let text = String::from_utf8_lossy(&r);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"error\""), "{text}");
}

#[test]
fn half_closed_clients_still_get_their_answer() {
    let s = Server::start(&["--threads", "2"]);
    let ctx = zmq::Context::new();
    let [mut p] = workers(&s, &ctx, "m");
    let tokens: Vec<u32> = (1..=64).collect();
    p.send(&stored(&(1..=16).collect::<Vec<u64>>(), None, &tokens, 4));
    let body = json!({"token_ids": tokens, "model_name": "m"});
    s.wait_scores(&body, &json!({"1": {"0": 64}}));
    let q = body.to_string();
    let query = format!(
        "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{q}",
        q.len()
    );
    for (what, req) in [
        ("query", query.clone()),
        ("dump", "GET /dump HTTP/1.1\r\nHost: x\r\n\r\n".to_string()),
        ("HTTP/1.0 query", query.replacen("HTTP/1.1", "HTTP/1.0", 1)),
        (
            "pipelined, then Connection: close",
            format!(
                "{query}{}",
                query.replacen("Host: x\r\n", "Host: x\r\nConnection: close\r\n", 1)
            ),
        ),
    ] {
        let mut c = connect(s.port);
        c.write_all(req.as_bytes()).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let (r, _) = read_until_close(&mut c);
        let text = String::from_utf8_lossy(&r);
        let answers = text.matches("HTTP/1.").count();
        let want = if what.starts_with("pipelined") { 2 } else { 1 };
        assert_eq!(answers, want, "{what}: {text}");
        assert!(text.contains(" 200 OK"), "{what}: {text}");
        if what == "dump" {
            assert!(text.contains("\"m:default\""), "{what}: {text}");
        } else {
            assert!(
                text.contains("\"scores\":{\"1\":{\"0\":64}}"),
                "{what}: {text}"
            );
        }
    }
}

#[test]
fn a_second_server_on_the_same_port_refuses_to_start() {
    let s = Server::start(&["--threads", "2"]);
    let out = std::process::Command::new(support::kvix_bin())
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &s.port.to_string(),
            "--threads",
            "1",
        ])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already"), "{err}");
    // The first one still answers alone.
    assert_eq!(s.call("GET", "/workers", None).0, 200);
}

#[test]
fn sighup_is_ignored_and_sigterm_still_snapshots() {
    let dir = std::env::temp_dir().join(format!("kvix-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let snap = dir.join("snap.bin");
    let _ = std::fs::remove_file(&snap);
    let mut s = Server::start(&[
        "--threads",
        "2",
        "--snapshot-path",
        snap.to_str().unwrap(),
        "--snapshot-interval",
        "0",
    ]);
    s.wait_log("recovery done");
    s.signal("HUP");
    s.wait_log("SIGHUP ignored");
    assert_eq!(s.call("GET", "/health", None).0, 200);
    assert!(
        s.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP killed it"
    );
    s.signal("TERM");
    let st = s.wait_exit(Duration::from_secs(20));
    assert_eq!(st.and_then(|s| s.code()), Some(0));
    assert!(snap.exists(), "no snapshot written on SIGTERM after SIGHUP");
}

#[test]
fn port_zero_resolves_to_one_port_for_every_core() {
    let s = Server::launch(&["--threads", "2"], None, None);
    assert_ne!(s.port, 0);
    let log = s.log();
    assert!(!log.contains(":0 "), "{log}");
    // Fresh connections spread over both cores' listeners; all on the one port.
    for _ in 0..32 {
        let mut c = connect(s.port);
        c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let (r, _) = read_until_close(&mut c);
        assert!(
            r.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&r)
        );
    }
}

#[test]
fn absurd_thread_counts_are_clamped() {
    let s = Server::start(&["--threads", "2", "--ingest-threads", "1000"]);
    let threads = std::fs::read_dir(format!("/proc/{}/task", s.pid()))
        .unwrap()
        .count();
    assert!(threads < 100, "{threads} threads");
    assert!(
        s.log().contains("--ingest-threads 1000 is outside"),
        "{}",
        s.log()
    );
}

/// One response off a keep-alive connection: its status, and whether it announced
/// the connection's close. Reads the head, then as many body bytes as it says.
fn response(s: &mut TcpStream) -> (u16, bool) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed mid-head: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, head.contains("connection: close"))
}

#[test]
fn a_refused_request_leaves_its_connection_usable() {
    let admin = support::dir_with("refused", &[("admin", "secret".to_string())]);
    let token = admin.join("admin");
    let s = Server::start(&[
        "--slot-tracker-port",
        "0",
        "--admin-token-file",
        token.to_str().unwrap(),
    ]);
    let post = |path: &str, ct: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    let json = "application/json";
    // Each refusal comes before any handler reads the body; the same connection
    // then answers /health.
    let main = s.port;
    let slots: u16 = s
        .slot_tracker_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    for (port, request, want) in [
        (main, post("/nope", json, "{\"a\":1}"), 404),
        (main, post("/health", json, "{\"a\":1}"), 404),
        (
            main,
            "GET /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}".to_string(),
            405,
        ),
        (slots, post("/nope", json, "{}"), 404),
        (slots, post("/health", json, "{}"), 405),
        (slots, post("/add", "text/plain", "{\"worker_id\":5}"), 415),
    ] {
        // The body comes a moment after the head, as a client writing them apart
        // sends it.
        let (head, body) = request.split_at(request.find("\r\n\r\n").unwrap() + 4);
        let mut c = connect(port);
        c.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        c.write_all(body.as_bytes()).unwrap();
        assert_eq!(response(&mut c), (want, false), "{request}");
        c.write_all(health.as_bytes()).unwrap();
        assert_eq!(response(&mut c).0, 200, "after {request}");
    }
    // An unauthorized request's body is not read, nor one announced too large:
    // the answer says the connection closes, so that no client sends another on it.
    let too_large = "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n";
    for (port, request, want) in [
        (main, post("/register", json, "{\"instance_id\":1}"), 401),
        (slots, post("/register", json, "{\"worker_id\":1}"), 401),
        (main, too_large.to_string(), 413),
    ] {
        let mut c = connect(port);
        c.write_all(request.as_bytes()).unwrap();
        assert_eq!(response(&mut c), (want, true), "{request}");
    }
}
