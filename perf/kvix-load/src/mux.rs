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
    pub started: Instant,
    pub finished: Instant,
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

/// Drive `connections` connections to `addr` for `dur` (closed loop when `rate`
/// is 0), cycling through the pre-serialized `bodies`. `on_done` is called once
/// per completed request (the progress bar). `has_scores` classifies a reply.
pub fn run(
    addr: &str,
    connections: usize,
    rate: f64,
    dur: Duration,
    bodies: &[Vec<u8>],
    has_scores: impl Fn(&[u8]) -> bool,
    on_done: impl Fn(),
) -> MuxOut {
    let mut m = Mux::open(addr, connections, rate, dur, bodies);
    loop {
        let now = Instant::now();
        let open_done = m.hand_out(now);
        let busy = m
            .conns
            .iter()
            .flatten()
            .filter(|c| matches!(c.state, State::Busy { .. }))
            .count();
        let finished = if rate > 0.0 {
            open_done || (m.k >= m.total)
        } else {
            now >= m.end
        };
        if busy == 0 && finished {
            break;
        }
        if now >= m.end + dur.max(Duration::from_secs(10)) {
            // Answers still missing well past the end: a stalled server. What is
            // outstanding counts as errors rather than hold the phase forever.
            m.out.errors += busy as u64;
            break;
        }
        if m.write_and_poll() <= 0 {
            continue;
        }
        m.read_replies(&has_scores, &on_done);
    }
    m.out.finished = Instant::now();
    m.out
}

/// One phase's connections and what they measured so far.
struct Mux<'a> {
    addr: &'a str,
    bodies: &'a [Vec<u8>],
    rate: f64,
    dur: Duration,
    start: Instant,
    end: Instant,
    /// The next request's index (its body, and in open loop its due time).
    k: u64,
    /// The requests an open-loop phase sends.
    total: u64,
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
    /// Dial every connection; the phase's clock starts once they are open.
    fn open(
        addr: &'a str,
        connections: usize,
        rate: f64,
        dur: Duration,
        bodies: &'a [Vec<u8>],
    ) -> Self {
        let mut out = MuxOut {
            hist: histogram(),
            per_conn: (0..connections).map(|_| histogram()).collect(),
            completed: 0,
            errors: 0,
            hits: 0,
            unsent: 0,
            reply_bytes: 0,
            started: Instant::now(),
            finished: Instant::now(),
        };
        let conns: Vec<Option<Conn>> = (0..connections).map(|_| Conn::open(addr).ok()).collect();
        let start = Instant::now();
        out.started = start;
        Mux {
            addr,
            bodies,
            rate,
            dur,
            start,
            end: start + dur,
            k: 0,
            total: (dur.as_secs_f64() * rate).ceil() as u64,
            conns,
            fds: Vec::with_capacity(connections),
            chunk: vec![0u8; 64 * 1024],
            out,
        }
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
                    self.out.unsent = self.total - self.k;
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
                body: (self.k as usize) % self.bodies.len(),
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

    #[test]
    fn a_response_is_complete_only_with_its_whole_body() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(parse(&r[..r.len() - 1]).unwrap(), None);
        let (status, body, used) = parse(r).unwrap().unwrap();
        assert_eq!((status, &r[body], used), (200, &b"hello"[..], r.len()));
        assert!(parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
    }
}
