//! The query phase's client: every connection of a phase driven from one thread
//! with non-blocking sockets and `poll(2)`, as wrk does, so that the client costs
//! one core however many connections it holds and never adds its own thread
//! scheduling to a connection's latency.
//!
//! Owns the per-connection state machines and latency histograms. Closed loop: a
//! connection sends its next request as soon as its answer is in. Open loop: the
//! k-th request is due at `start + k / rate` and goes out on the first idle
//! connection; latency is measured from the due time, so requests that waited for
//! a connection are charged for it (no coordinated omission).
//!
//! Interleaved ([`run`] with several targets): the same load against several servers in
//! turn, a short slice each, so that what the machine does meanwhile (a kernel
//! thread, a noisy neighbour) falls on all of them alike rather than on whichever
//! ran during it.

use hdrhistogram::Histogram;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What a phase measured, per connection and overall.
pub struct MuxOut {
    pub hist: Histogram<u64>,
    /// Each connection's own latencies.
    pub per_conn: Vec<Histogram<u64>>,
    pub completed: u64,
    pub errors: u64,
    pub hits: u64,
    pub unsent: u64,
    pub reply_bytes: u64,
    /// Time spent driving this server's load (the sum of its slices).
    pub active: Duration,
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

enum State {
    Idle,
    /// Request `body` written up to `sent`; latency counts from `from`.
    Busy {
        body: usize,
        sent: usize,
        from: Instant,
    },
}

struct Conn {
    stream: TcpStream,
    state: State,
    buf: Vec<u8>,
}

/// A complete response at the start of `buf`: (status, body range, bytes used).
fn parse(buf: &[u8]) -> io::Result<Option<(u16, std::ops::Range<usize>, usize)>> {
    let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head_end = head + 4;
    let text = std::str::from_utf8(&buf[..head]).map_err(|_| bad("response head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let mut len = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                return Err(bad(
                    "chunked responses are not supported by the poll client",
                ));
            }
        }
    }
    let len = len.ok_or_else(|| bad("response has no Content-Length"))?;
    if buf.len() < head_end + len {
        return Ok(None);
    }
    Ok(Some((status, head_end..head_end + len, head_end + len)))
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

impl Conn {
    /// A new idle, non-blocking connection to `addr`.
    fn open(addr: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Conn {
            stream,
            state: State::Idle,
            buf: Vec::with_capacity(64 * 1024),
        })
    }
}

/// Drive `connections` connections to each `(addr, bodies)` target for `dur`
/// (closed loop when `rate` is 0), cycling through its pre-serialized `bodies`;
/// one result per target, in order. `on_done` is called once per completed request
/// (the progress bar). `has_scores` classifies a reply.
///
/// Several targets take the load in turns, `slice` at a time each. A turn ends once
/// its last answer is in, so turns never overlap; which target goes first
/// alternates from one round to the next, so that none always follows the other's
/// turn. A lone target is driven in one stretch: turns only share the machine. A
/// target that stalled (or could not be reached) takes no more turns: the rest of
/// its requests count as never sent.
pub fn run(
    targets: &[(&str, &[Vec<u8>])],
    connections: usize,
    rate: f64,
    dur: Duration,
    slice: Duration,
    has_scores: impl Fn(&[u8]) -> bool,
    on_done: impl Fn(),
) -> Vec<MuxOut> {
    let mut muxes: Vec<Mux> = targets
        .iter()
        .map(|(addr, bodies)| Mux::open(addr, connections, rate, bodies))
        .collect();
    let n = muxes.len();
    let slice = if n == 1 {
        dur
    } else {
        slice.max(Duration::from_millis(1))
    };
    let mut left = dur;
    let mut round = 0;
    loop {
        let d = slice.min(left);
        for i in 0..n {
            muxes[(i + round) % n].drive(d, &has_scores, &on_done);
        }
        left -= d;
        round += 1;
        if left.is_zero() {
            break;
        }
    }
    muxes.into_iter().map(|m| m.out).collect()
}

/// One phase's connections and what they measured so far.
struct Mux<'a> {
    addr: &'a str,
    bodies: &'a [Vec<u8>],
    rate: f64,
    /// The current stretch of load ([`Mux::drive`]): its length, start and end.
    dur: Duration,
    start: Instant,
    end: Instant,
    /// The next request's index within the stretch (in open loop its due time).
    k: u64,
    /// Requests of earlier stretches (sent or given up on): bodies go on where the
    /// last one stopped.
    sent_before: u64,
    /// The requests an open-loop stretch sends.
    total: u64,
    /// Time of the earlier stretches: each stretch sends what its end brings the
    /// schedule to, so that rounding never adds up to a higher rate.
    planned: Duration,
    /// The server stalled or could not be reached: later stretches send nothing.
    dead: bool,
    conns: Vec<Option<Conn>>,
    fds: Vec<libc::pollfd>,
    chunk: Vec<u8>,
    out: MuxOut,
}

/// When open-loop request `k` is due.
fn due(start: Instant, rate: f64, k: u64) -> Instant {
    start + Duration::from_secs_f64(k as f64 / rate)
}

impl<'a> Mux<'a> {
    /// Dial every connection.
    fn open(addr: &'a str, connections: usize, rate: f64, bodies: &'a [Vec<u8>]) -> Self {
        let out = MuxOut {
            hist: histogram(),
            per_conn: (0..connections).map(|_| histogram()).collect(),
            completed: 0,
            errors: 0,
            hits: 0,
            unsent: 0,
            reply_bytes: 0,
            active: Duration::ZERO,
        };
        let conns: Vec<Option<Conn>> = (0..connections).map(|_| Conn::open(addr).ok()).collect();
        let now = Instant::now();
        Mux {
            addr,
            bodies,
            rate,
            dur: Duration::ZERO,
            start: now,
            end: now,
            k: 0,
            sent_before: 0,
            total: 0,
            planned: Duration::ZERO,
            dead: false,
            conns,
            fds: Vec::with_capacity(connections),
            chunk: vec![0u8; 64 * 1024],
            out,
        }
    }

    /// Load the server for `dur` from now, and wait for every answer.
    fn drive(&mut self, dur: Duration, has_scores: &impl Fn(&[u8]) -> bool, on_done: &impl Fn()) {
        self.sent_before += self.k;
        self.k = 0;
        self.dur = dur;
        self.start = Instant::now();
        self.end = self.start + dur;
        let due_by = |t: Duration| (t.as_secs_f64() * self.rate).ceil() as u64;
        self.total = due_by(self.planned + dur) - due_by(self.planned);
        self.planned += dur;
        if self.dead {
            self.forgo_rest();
            return;
        }
        loop {
            let now = Instant::now();
            let open_done = self.hand_out(now);
            if self.conns.iter().all(Option::is_none) {
                // Not one connection could be dialled: the server is gone.
                self.give_up();
                break;
            }
            let busy = self
                .conns
                .iter()
                .flatten()
                .filter(|c| matches!(c.state, State::Busy { .. }))
                .count();
            let finished = if self.rate > 0.0 {
                open_done || (self.k >= self.total)
            } else {
                now >= self.end
            };
            if busy == 0 && finished {
                break;
            }
            if now >= self.end + dur.max(Duration::from_secs(10)) {
                // Answers still missing well past the end: a stalled server. What is
                // outstanding counts as errors, what was never sent as unsent, rather
                // than hold the phase forever.
                self.out.errors += busy as u64;
                self.give_up();
                break;
            }
            if self.write_and_poll() <= 0 {
                continue;
            }
            self.read_replies(has_scores, on_done);
        }
        self.out.active += self.start.elapsed();
    }

    /// Send nothing more this stretch: what it had left counts as never sent.
    fn forgo_rest(&mut self) {
        self.out.unsent += self.total.saturating_sub(self.k);
        self.k = self.k.max(self.total);
    }

    /// The server stalled or is gone: [`Self::forgo_rest`], in this stretch and
    /// every later one.
    fn give_up(&mut self) {
        self.forgo_rest();
        self.dead = true;
    }

    /// Hand out requests to idle connections (dialling again one that failed).
    /// True once an open loop will send no more.
    fn hand_out(&mut self, now: Instant) -> bool {
        for slot in self.conns.iter_mut() {
            if slot.is_none() {
                // A connection that failed is dialled again for its next request.
                match Conn::open(self.addr) {
                    Ok(c) => *slot = Some(c),
                    Err(_) => {
                        self.out.errors += 1;
                        continue;
                    }
                }
            }
            let c = slot.as_mut().expect("connected above");
            if !matches!(c.state, State::Idle) {
                continue;
            }
            let from = if self.rate > 0.0 {
                if self.k >= self.total {
                    return true;
                }
                let at = due(self.start, self.rate, self.k);
                if at > now {
                    break;
                }
                if now >= self.end + self.dur {
                    // Overloaded past a grace of one more duration: stop, and count
                    // what was never sent rather than run on unboundedly.
                    self.forgo_rest();
                    return true;
                }
                at
            } else {
                if now >= self.end {
                    break;
                }
                now
            };
            c.state = State::Busy {
                body: ((self.sent_before + self.k) % self.bodies.len() as u64) as usize,
                sent: 0,
                from,
            };
            self.k += 1;
        }
        false
    }

    /// Write what can be written, then wait for replies (or the next due time).
    /// `ppoll`'s answer: how many connections have something to read.
    fn write_and_poll(&mut self) -> i32 {
        self.fds.clear();
        for c in self.conns.iter_mut().flatten() {
            let mut events = 0;
            if let State::Busy { body, sent, .. } = &mut c.state {
                let b = &self.bodies[*body];
                while *sent < b.len() {
                    match c.stream.write(&b[*sent..]) {
                        Ok(n) => *sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => break,
                    }
                }
                events = libc::POLLIN | if *sent < b.len() { libc::POLLOUT } else { 0 };
            }
            self.fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events,
                revents: 0,
            });
        }
        // Wake for the next due request only if a connection is free to send it;
        // otherwise only a reply can change anything. Nanosecond timeouts (ppoll):
        // a millisecond one would send requests up to a millisecond late.
        let idle = self
            .conns
            .iter()
            .any(|c| c.as_ref().is_none_or(|c| matches!(c.state, State::Idle)));
        let wait = if self.rate > 0.0 && self.k < self.total && idle {
            due(self.start, self.rate, self.k).saturating_duration_since(Instant::now())
        } else {
            Duration::from_millis(100)
        };
        let timeout = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` is a live, initialized slice of `pollfd`s passed with its
        // length, and `timeout` a live timespec; ppoll only writes the `revents`.
        unsafe {
            libc::ppoll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                &timeout,
                std::ptr::null(),
            )
        }
    }

    /// Read every readable connection; record each complete answer, and drop a
    /// connection that failed (it is dialled again for its next request).
    fn read_replies(&mut self, has_scores: &impl Fn(&[u8]) -> bool, on_done: &impl Fn()) {
        let mut i = 0;
        for (ci, slot) in self.conns.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            let revents = self.fds[i].revents;
            i += 1;
            if revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) == 0 {
                continue;
            }
            let mut failed = false;
            loop {
                match c.stream.read(&mut self.chunk) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => c.buf.extend_from_slice(&self.chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            let out = &mut self.out;
            match parse(&c.buf) {
                Ok(Some((status, body, used))) => {
                    if let State::Busy { from, .. } = c.state {
                        if (200..300).contains(&status) {
                            let lat = (from.elapsed().as_micros() as u64).max(1);
                            out.hist.saturating_record(lat);
                            out.per_conn[ci].saturating_record(lat);
                            out.completed += 1;
                            out.hits += has_scores(&c.buf[body.clone()]) as u64;
                            out.reply_bytes += body.len() as u64;
                            on_done();
                        } else {
                            out.errors += 1;
                        }
                    }
                    c.buf.drain(..used);
                    c.state = State::Idle;
                }
                Ok(None) if !failed => {}
                _ => {
                    out.errors += 1;
                    *slot = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A keep-alive HTTP server on a free port answering every request with
    /// `body`, stamping the time each request arrived into `log`.
    fn stub(body: &'static str, log: Arc<Mutex<Vec<Instant>>>) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut c) = conn else { return };
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            log.lock().unwrap().push(Instant::now());
                            let r = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if c.write_all(r.as_bytes()).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// The one request body the tests send to `addr`.
    fn get(addr: &str) -> Vec<Vec<u8>> {
        let t = crate::http::Target::parse(&format!("http://{addr}")).unwrap();
        vec![t.request("GET", "/", b"")]
    }

    #[test]
    fn interleaved_servers_take_the_load_in_turns_and_are_measured_apart() {
        let (log_a, log_b) = (Arc::default(), Arc::default());
        let a = stub(r#"{"scores":{"1":{"0":3}}}"#, Arc::clone(&log_a));
        let b = stub(r#"{"scores":{}}"#, Arc::clone(&log_b));
        let (ba, bb) = (get(&a), get(&b));
        let slice = Duration::from_millis(100);
        let outs = run(
            &[(a.as_str(), ba.as_slice()), (b.as_str(), bb.as_slice())],
            4,
            1000.0,
            Duration::from_millis(400),
            slice,
            |body| body.starts_with(br#"{"scores":{"1""#),
            || {},
        );
        assert_eq!(outs.len(), 2);
        for (o, hits) in outs.iter().zip([400, 0]) {
            // 1000 req/s for 400 ms of turns each.
            assert_eq!((o.completed, o.errors, o.unsent, o.hits), (400, 0, 0, hits));
            // A turn ends with the answer to its last request, due 1 ms before it.
            let active = o.active.as_secs_f64();
            assert!((0.39..4.0).contains(&active), "{active}");
        }
        // Four turns each, A first in even rounds and B in odd ones: every request of
        // a turn lands before the next turn begins, so the arrivals come in runs.
        let mut all: Vec<(Instant, char)> =
            log_a.lock().unwrap().iter().map(|t| (*t, 'a')).collect();
        all.extend(log_b.lock().unwrap().iter().map(|t| (*t, 'b')));
        all.sort();
        let runs: Vec<char> = all
            .iter()
            .map(|x| x.1)
            .collect::<Vec<_>>()
            .chunk_by(|x, y| x == y)
            .map(|r| r[0])
            .collect();
        assert_eq!(runs, ['a', 'b', 'a', 'b', 'a']);
    }

    /// A TCP socket bound to a free loopback port and never listened on, and that
    /// port's address.
    fn bound_not_listening() -> (std::os::fd::OwnedFd, String) {
        use std::os::fd::FromRawFd;
        // SAFETY: `socket` returns a new descriptor (checked) that the OwnedFd then
        // owns alone; `addr` and `len` are live, initialized and of the sizes passed,
        // and bind/getsockname only read or write within them.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let sa = &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr;
            assert_eq!(libc::bind(fd, sa, len), 0);
            assert_eq!(libc::getsockname(fd, sa, &mut len), 0);
            (owned, format!("127.0.0.1:{}", u16::from_be(addr.sin_port)))
        }
    }

    #[test]
    fn a_server_that_cannot_be_reached_takes_no_more_turns() {
        let a = stub(r#"{"scores":{}}"#, Arc::default());
        // A port bound but never listened on: connects are refused, and no other
        // socket can take it while the test runs.
        let (_held, gone) = bound_not_listening();
        let (ba, bg) = (get(&a), get(&gone));
        let t = Instant::now();
        let outs = run(
            &[(gone.as_str(), bg.as_slice()), (a.as_str(), ba.as_slice())],
            2,
            1000.0,
            Duration::from_millis(300),
            Duration::from_millis(100),
            |_| false,
            || {},
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!((outs[0].completed, outs[0].unsent), (0, 300));
        assert!(outs[0].errors > 0);
        assert_eq!(
            (outs[1].completed, outs[1].errors, outs[1].unsent),
            (300, 0, 0)
        );
    }

    #[test]
    fn a_response_is_complete_only_with_its_whole_body() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(parse(&r[..r.len() - 1]).unwrap(), None);
        let (status, body, used) = parse(r).unwrap().unwrap();
        assert_eq!((status, &r[body], used), (200, &b"hello"[..], r.len()));
        assert!(parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
    }
}
