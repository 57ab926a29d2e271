//! The reader a dump's body passes through: a byte limit, and JSON strings no
//! longer than [`MAX_STRING`], followed as the bytes pass.
//!
//! Owns what no single token may cost. Must never parse: serde_json reads what
//! it lets through.

use super::MAX_STRING;
use std::io::Read;
use thiserror::Error;

/// What the guarded reader refused (carried inside an `io::Error` through serde_json).
#[derive(Debug, Error)]
pub(super) enum Refused {
    #[error("over the byte limit")]
    Bytes,
    #[error("a JSON string longer than {MAX_STRING} bytes")]
    LongString,
}

/// A reader that fails once more than `left` bytes come, or a JSON string runs past
/// [`MAX_STRING`]: it follows string boundaries (quotes and escapes) as the bytes
/// pass, so serde_json never buffers more than that for one token. Outside strings
/// it collapses each run of whitespace into one space, which changes no document's
/// meaning and spares the parser a body padded with whitespace.
pub(super) struct Guarded<R> {
    inner: R,
    left: u64,
    in_string: bool,
    escaped: bool,
    /// Bytes of the current string so far.
    run: usize,
    /// The last byte passed on outside a string was whitespace.
    spaced: bool,
}

pub(super) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl<R: Read> Guarded<R> {
    pub(super) fn new(inner: R, max_bytes: u64) -> Self {
        Guarded {
            inner,
            left: max_bytes,
            in_string: false,
            escaped: false,
            run: 0,
            spaced: false,
        }
    }

    /// Pass `buf` on in place, whitespace runs collapsed: the length passed on, or an
    /// error once a string is too long.
    fn filter(&mut self, buf: &mut [u8]) -> Result<usize, Refused> {
        let n = buf.len();
        let (mut r, mut w) = (0, 0);
        while r < n {
            if self.in_string {
                let end = if self.escaped {
                    self.escaped = false;
                    r + 1
                } else {
                    match memchr::memchr2(b'"', b'\\', &buf[r..]) {
                        None => n,
                        Some(j) => {
                            let b = buf[r + j];
                            self.escaped = b == b'\\';
                            self.in_string = b == b'\\';
                            r + j + 1
                        }
                    }
                };
                self.run += end - r;
                if self.run > MAX_STRING {
                    return Err(Refused::LongString);
                }
                buf.copy_within(r..end, w);
                w += end - r;
                r = end;
                continue;
            }
            let b = buf[r];
            if is_space(b) {
                r += 1;
                // Whole words of spaces first: a padded body is mostly that.
                while r + 8 <= n && buf[r..r + 8] == [b' '; 8] {
                    r += 8;
                }
                while r < n && is_space(buf[r]) {
                    r += 1;
                }
                if !self.spaced {
                    buf[w] = b' ';
                    w += 1;
                    self.spaced = true;
                }
                continue;
            }
            self.spaced = false;
            if b == b'"' {
                self.in_string = true;
                self.run = 0;
            }
            buf[w] = b;
            w += 1;
            r += 1;
        }
        Ok(w)
    }
}

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // One byte past the limit tells a body over it from one that ends on it.
        let want = buf
            .len()
            .min(self.left.saturating_add(1).min(usize::MAX as u64) as usize);
        loop {
            let n = self.inner.read(&mut buf[..want])?;
            if n as u64 > self.left {
                return Err(std::io::Error::other(Refused::Bytes));
            }
            self.left -= n as u64;
            let kept = self.filter(&mut buf[..n]).map_err(std::io::Error::other)?;
            // Nothing kept is no end of the body: read on.
            if kept > 0 || n == 0 {
                return Ok(kept);
            }
        }
    }
}
