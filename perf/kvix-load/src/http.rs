//! A minimal blocking HTTP/1.1 keep-alive client over `std::net::TcpStream`.
//!
//! Owns URL parsing, request framing and response parsing (Content-Length or
//! chunked). Handwritten so the load generator spends its time waiting on the
//! server, not in a client stack.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Where the indexer lives: `host:port` plus an optional base path.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: String,
    pub base: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--url must start with http:// (got `{url}`)"))?;
        let (hostport, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let addr = if hostport.contains(':') && !hostport.ends_with(']') {
            hostport.to_string()
        } else {
            format!("{hostport}:80")
        };
        Ok(Target {
            addr,
            base: base.to_string(),
        })
    }

    /// A complete request, serialized once and sent many times.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::with_capacity(body.len() + 160);
        write!(
            r,
            "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.base,
            self.addr,
            body.len()
        )
        .unwrap();
        r.extend_from_slice(body);
        r
    }
}

/// One keep-alive connection; reconnects lazily after errors or `Connection: close`.
pub struct Conn {
    addr: String,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    /// Body of the last response: `buf[body_start..body_end]`.
    body_start: usize,
    body_end: usize,
}

impl Conn {
    pub fn new(target: &Target) -> Self {
        Conn {
            addr: target.addr.clone(),
            stream: None,
            buf: Vec::with_capacity(64 * 1024),
            body_start: 0,
            body_end: 0,
        }
    }

    pub fn connect(&mut self) -> io::Result<()> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.stream = Some(s);
        }
        Ok(())
    }

    pub fn body(&self) -> &[u8] {
        &self.buf[self.body_start..self.body_end]
    }

    /// Send a pre-serialized request and read the response; returns the status code.
    pub fn send(&mut self, raw: &[u8]) -> io::Result<u16> {
        let r = self.send_inner(raw);
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn send_inner(&mut self, raw: &[u8]) -> io::Result<u16> {
        self.connect()?;
        let s = self.stream.as_mut().unwrap();
        s.write_all(raw)?;
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            read_more(s, &mut self.buf)?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end])
            .map_err(|_| bad("response head is not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let (mut len, mut chunked, mut close) = (None, false, false);
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse::<usize>().ok();
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.eq_ignore_ascii_case("chunked");
            } else if k.eq_ignore_ascii_case("connection") {
                close = v.eq_ignore_ascii_case("close");
            }
        }
        if chunked {
            self.read_chunked(head_end)?;
        } else {
            let len = len.ok_or_else(|| bad("response has neither Content-Length nor chunked"))?;
            while self.buf.len() < head_end + len {
                read_more(self.stream.as_mut().unwrap(), &mut self.buf)?;
            }
            self.body_start = head_end;
            self.body_end = head_end + len;
        }
        if close {
            self.stream = None;
        }
        Ok(status)
    }

    /// Decode a chunked body in place after the head.
    fn read_chunked(&mut self, head_end: usize) -> io::Result<()> {
        let s = self.stream.as_mut().unwrap();
        let mut pos = head_end;
        let mut out = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf[pos..], b"\r\n") {
                    break pos + i;
                }
                read_more(s, &mut self.buf)?;
            };
            let size_txt = std::str::from_utf8(&self.buf[pos..line_end]).unwrap_or("");
            let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            pos = line_end + 2;
            while self.buf.len() < pos + size + 2 {
                read_more(s, &mut self.buf)?;
            }
            if size == 0 {
                break;
            }
            out.extend_from_slice(&self.buf[pos..pos + size]);
            pos += size + 2;
        }
        self.buf.truncate(head_end);
        self.buf.extend_from_slice(&out);
        self.body_start = head_end;
        self.body_end = self.buf.len();
        Ok(())
    }
}

fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    let old = buf.len();
    buf.resize(old + 16 * 1024, 0);
    let n = s.read(&mut buf[old..]);
    match n {
        Ok(0) => {
            buf.truncate(old);
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ))
        }
        Ok(n) => {
            buf.truncate(old + n);
            Ok(())
        }
        Err(e) => {
            buf.truncate(old);
            Err(e)
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// One-shot JSON POST for control calls; returns (status, body).
pub fn post(target: &Target, path: &str, body: &serde_json::Value) -> io::Result<(u16, String)> {
    let mut c = Conn::new(target);
    let raw = target.request("POST", path, body.to_string().as_bytes());
    let status = c.send(&raw)?;
    Ok((status, String::from_utf8_lossy(c.body()).into_owned()))
}
