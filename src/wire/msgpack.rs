//! A small zero-copy msgpack cursor over one frame.
//!
//! Owns bounds-checked reads of msgpack values (via `rmp::Marker`) without
//! building a value tree. Every read either succeeds or returns a
//! [`WireError`]; nothing here panics, and nothing allocates but
//! [`Cursor::tokens_into`], which appends to the caller's vector.

use super::WireError;
use rmp::Marker;
use std::ops::Range;

/// Nesting allowed when skipping unknown values; deeper frames are rejected.
const MAX_DEPTH: u32 = 32;

pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A msgpack integer, kept wide so both signs survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int {
    U(u64),
    I(i64),
}

/// The coarse type of the next msgpack value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    /// Ext types and the reserved marker.
    Other,
}

impl Int {
    /// Two's-complement bits: how Python's signed 64-bit hashes map onto `u64`.
    pub fn bits(self) -> u64 {
        match self {
            Int::U(u) => u,
            Int::I(i) => i as u64,
        }
    }
}

/// The token id opening `w` (the frame's next eight bytes, little-endian) and its
/// length in bytes, if it is a positive fixint or a `uint 8/16/32` (all msgspec
/// writes for one); `None` for anything [`Cursor::token`] must read.
#[inline(always)]
fn word_id(w: u64) -> Option<(u32, u32)> {
    let marker = w as u8;
    let fixint = marker < 0x80;
    if !(fixint || (0xcc..=0xce).contains(&marker)) {
        return None;
    }
    // u8, u16, u32 (markers 0xcc..=0xce) take 1, 2, 4 bytes after the marker.
    let len = if fixint {
        1
    } else {
        1 + (1u32 << (marker.wrapping_sub(0xcc) & 3))
    };
    Some((id_of(w, len), len))
}

/// The id of length `l` (1, 2, 3 or 5 bytes, marker included) that opens `w` (the
/// frame's next eight bytes, little-endian): the first `l` bytes read big-endian,
/// less the marker unless it is the id (a fixint).
#[inline(always)]
fn id_of(w: u64, l: u32) -> u32 {
    /// The value bits of an id of each length.
    const VALUE: [u32; 8] = [0, 0xff, 0xff, 0xffff, 0, u32::MAX, 0, 0];
    // 1 <= l <= 5: the shift stays below 64.
    (w.swap_bytes() >> (64 - 8 * l)) as u32 & VALUE[(l & 7) as usize]
}

/// Input a window of [`pairs_avx2`] reads: ids start in its first [`PAIR_WINDOW`]
/// bytes, a pair's second id at most 5 bytes later, and an id's word is 8 bytes.
#[cfg(target_arch = "x86_64")]
const PAIR_INPUT: usize = 96;
/// Bytes of a window where pairs of ids may start.
#[cfg(target_arch = "x86_64")]
const PAIR_WINDOW: usize = 64;

/// Ids read two at a time, as [`word_id`] reads each, into `spare` from its start;
/// returns how many and the position after them. Per window of input, the length an
/// id would have if it started at each byte (1, 2, 3 or 5; 0 for a marker
/// [`word_id`] refuses) is computed for every byte at once, and from those the
/// length of the pair of ids starting at each byte. The walk from one pair to the
/// next is then one read of that table and an add, where reading ids one by one
/// waits on each id's width before the next id's marker. Stops at a pair with a
/// marker it does not read, when fewer than two slots are left, or where fewer than
/// [`PAIR_INPUT`] bytes are; the caller reads the rest.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pairs_avx2(
    buf: &[u8],
    mut pos: usize,
    spare: &mut [std::mem::MaybeUninit<u32>],
) -> (usize, usize) {
    use std::arch::x86_64::*;
    let mut done = 0;
    let mut len = [0u8; PAIR_WINDOW];
    let mut pair = [0u8; PAIR_WINDOW];
    let splat = |b: u8| _mm256_set1_epi8(b as i8);
    // The length of an id starting at each of the 32 bytes from `win[k]`.
    let lens = |win: &[u8], k: usize| {
        let b = win[k..k + 32].as_ptr();
        // SAFETY: the 32 bytes from `b` are `win[k..k + 32]`.
        let b = unsafe { _mm256_loadu_si256(b.cast()) };
        // A fixint is a byte below 0x80: above -1 as a signed byte.
        let fix = _mm256_and_si256(_mm256_cmpgt_epi8(b, splat(0xff)), splat(1));
        let u8_ = _mm256_and_si256(_mm256_cmpeq_epi8(b, splat(0xcc)), splat(2));
        let u16_ = _mm256_and_si256(_mm256_cmpeq_epi8(b, splat(0xcd)), splat(3));
        let u32_ = _mm256_and_si256(_mm256_cmpeq_epi8(b, splat(0xce)), splat(5));
        _mm256_or_si256(_mm256_or_si256(fix, u8_), _mm256_or_si256(u16_, u32_))
    };
    while done + 2 <= spare.len() {
        let Some(win) = buf.get(pos..pos + PAIR_INPUT) else {
            break;
        };
        let by_byte = [lens(win, 0), lens(win, 32), lens(win, 64)];
        for h in 0..PAIR_WINDOW / 32 {
            let (l, next) = (by_byte[h], by_byte[h + 1]);
            // `l` shifted down by D bytes, `next`'s first bytes shifted in: the
            // lengths of ids starting D bytes further on.
            let straddle = _mm256_permute2x128_si256::<0x21>(l, next);
            let pick =
                |w: u8, later: __m256i| _mm256_and_si256(_mm256_cmpeq_epi8(l, splat(w)), later);
            // The second id's length (0 where the first's marker is refused, since no
            // lane of `l` then matches).
            let second = _mm256_or_si256(
                _mm256_or_si256(
                    pick(1, _mm256_alignr_epi8::<1>(straddle, l)),
                    pick(2, _mm256_alignr_epi8::<2>(straddle, l)),
                ),
                _mm256_or_si256(
                    pick(3, _mm256_alignr_epi8::<3>(straddle, l)),
                    pick(5, _mm256_alignr_epi8::<5>(straddle, l)),
                ),
            );
            // A pair's length where both markers are read, else 0.
            let missing = _mm256_cmpeq_epi8(second, _mm256_setzero_si256());
            let both = _mm256_andnot_si256(missing, _mm256_add_epi8(l, second));
            // SAFETY: 32 * h + 32 <= PAIR_WINDOW, the length of `len` and `pair`.
            unsafe {
                _mm256_storeu_si256(len.as_mut_ptr().add(32 * h).cast(), l);
                _mm256_storeu_si256(pair.as_mut_ptr().add(32 * h).cast(), both);
            }
        }
        // Pairs this window may write: the slots left, rounded down to pairs.
        let room = (spare.len() - done) & !1;
        let out = spare[done..].as_mut_ptr().cast::<u32>();
        let (mut p, mut k) = (0, 0);
        while p < PAIR_WINDOW && k < room {
            let j = pair[p] as usize;
            if j == 0 {
                break;
            }
            let l = len[p] as usize;
            // SAFETY: ids start before PAIR_WINDOW + 5, so their words end inside
            // `win` (PAIR_INPUT bytes); k + 1 < room <= the slots from `out`.
            unsafe {
                out.add(k).write(id_at(win.as_ptr().add(p), l));
                out.add(k + 1).write(id_at(win.as_ptr().add(p + l), j - l));
            }
            k += 2;
            p += j;
        }
        done += k;
        pos += p;
        if p < PAIR_WINDOW {
            break;
        }
    }
    (done, pos)
}

/// The id of length `l` (1, 2, 3 or 5, marker included) whose marker is at `at`
/// ([`id_of`] of the eight bytes there).
///
/// # Safety
/// Eight bytes from `at` must be readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn id_at(at: *const u8, l: usize) -> u32 {
    // SAFETY: the caller guarantees eight readable bytes.
    let w = u64::from_le(unsafe { at.cast::<u64>().read_unaligned() });
    id_of(w, l as u32)
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn slice(&self, r: Range<usize>) -> &'a [u8] {
        &self.buf[r]
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, WireError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | *b as u64))
    }

    pub fn peek_marker(&self) -> Result<Marker, WireError> {
        self.buf
            .get(self.pos)
            .map(|b| Marker::from_u8(*b))
            .ok_or(WireError::Truncated)
    }

    fn marker(&mut self) -> Result<Marker, WireError> {
        let m = self.peek_marker()?;
        self.pos += 1;
        Ok(m)
    }

    /// Consume a nil if one is next.
    pub fn nil(&mut self) -> Result<bool, WireError> {
        if self.peek_marker()? == Marker::Null {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn int(&mut self, field: &'static str) -> Result<Int, WireError> {
        Ok(match self.marker()? {
            Marker::FixPos(v) => Int::U(v as u64),
            Marker::FixNeg(v) => Int::I(v as i64),
            Marker::U8 => Int::U(self.be(1)?),
            Marker::U16 => Int::U(self.be(2)?),
            Marker::U32 => Int::U(self.be(4)?),
            Marker::U64 => Int::U(self.be(8)?),
            Marker::I8 => Int::I(self.be(1)? as u8 as i8 as i64),
            Marker::I16 => Int::I(self.be(2)? as u16 as i16 as i64),
            Marker::I32 => Int::I(self.be(4)? as u32 as i32 as i64),
            Marker::I64 => Int::I(self.be(8)? as i64),
            _ => {
                return Err(WireError::Type {
                    field,
                    expected: "integer",
                });
            }
        })
    }

    /// A `uint 64` or `int 64` (an engine's block hash, as Python's msgpack writes
    /// one) read straight from the frame as its two's-complement bits; `None`, with
    /// nothing consumed, for any other value.
    #[inline]
    pub fn word64(&mut self) -> Option<u64> {
        match self.buf.get(self.pos..)?.first_chunk::<9>()? {
            [0xcf | 0xd3, bits @ ..] => {
                self.pos += 9;
                Some(u64::from_be_bytes(*bits))
            }
            _ => None,
        }
    }

    /// `u32` fast path for token ids: positive fixints and `uint 8/16/32`
    /// (all msgspec writes for them) are read straight from the buffer; anything
    /// else goes through [`Cursor::u32`].
    #[inline]
    pub fn token(&mut self, field: &'static str) -> Result<u32, WireError> {
        let rest = &self.buf[self.pos..];
        match rest {
            [b, ..] if *b < 0x80 => {
                self.pos += 1;
                Ok(*b as u32)
            }
            [0xcc, b, ..] => {
                self.pos += 2;
                Ok(*b as u32)
            }
            [0xcd, a, b, ..] => {
                self.pos += 3;
                Ok(u16::from_be_bytes([*a, *b]) as u32)
            }
            [0xce, a, b, c, d, ..] => {
                self.pos += 5;
                Ok(u32::from_be_bytes([*a, *b, *c, *d]))
            }
            _ => self.u32(field),
        }
    }

    /// `n` flat token ids appended to `out`, as [`Self::token`] reads each. Token
    /// ids of a real vocabulary come as u16 and u32 (and a few u8 and fixints) in no
    /// pattern a branch predictor can learn. Where the CPU has AVX2, runs of ids are
    /// read two at a time ([`pairs_avx2`]); then, while eight bytes are left to
    /// read, an id is decoded from one word, its width computed from its marker
    /// without a branch between the `uint` widths. Anything else (another marker,
    /// the frame's last bytes) goes through [`Self::token`].
    pub fn tokens_into(
        &mut self,
        n: usize,
        out: &mut Vec<u32>,
        field: &'static str,
    ) -> Result<(), WireError> {
        let mut left = n;
        loop {
            left -= self.words_into(left, out);
            if left == 0 {
                return Ok(());
            }
            let t = self.token(field)?;
            out.push(t);
            left -= 1;
        }
    }

    /// Up to `n` ids read a word at a time (see [`Self::tokens_into`]), appended to
    /// `out`; stops early at a marker or a position that needs [`Self::token`].
    /// Returns how many it read. The position and the output live in locals for the
    /// whole run: kept in `self` and `out`, each id stored and reloaded them, on the
    /// chain from one id's width to the next id's position.
    #[inline]
    fn words_into(&mut self, n: usize, out: &mut Vec<u32>) -> usize {
        // Every id takes at least a byte: a lying count runs out of input, not memory.
        let room = n.min(self.remaining());
        out.reserve(room);
        let (buf, mut pos) = (self.buf, self.pos);
        let spare = &mut out.spare_capacity_mut()[..room];
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if room >= 2 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            (done, pos) = unsafe { pairs_avx2(buf, pos, spare) };
        }
        // While sixteen bytes are left from the position, the next id's eight bytes
        // are the current word shifted, topped up from a load whose address is known
        // before this id's width: the chain from one id to the next is a width and a
        // shift, not a load and a width.
        if let Some(first) = buf.get(pos..).and_then(|r| r.first_chunk::<8>()) {
            let mut w = u64::from_le_bytes(*first);
            while done < room {
                let Some(next) = buf.get(pos + 8..).and_then(|r| r.first_chunk::<8>()) else {
                    break;
                };
                let Some((id, len)) = word_id(w) else { break };
                spare[done].write(id);
                // 1 <= len <= 5: both shifts stay below 64.
                w = (w >> (8 * len)) | (u64::from_le_bytes(*next) << (64 - 8 * len));
                pos += len as usize;
                done += 1;
            }
        }
        // The frame's last bytes, a word each.
        for slot in &mut spare[done..] {
            let Some(word) = buf.get(pos..).and_then(|r| r.first_chunk::<8>()) else {
                break;
            };
            let Some((id, len)) = word_id(u64::from_le_bytes(*word)) else {
                break;
            };
            slot.write(id);
            pos += len as usize;
            done += 1;
        }
        // SAFETY: the pairs and the loops above wrote the first `done` slots of the
        // spare capacity, in order.
        unsafe { out.set_len(out.len() + done) };
        self.pos = pos;
        done
    }

    /// A non-negative integer that fits `u32`.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        match self.int(field)? {
            Int::U(u) if u <= u32::MAX as u64 => Ok(u as u32),
            Int::I(i) if (0..=u32::MAX as i64).contains(&i) => Ok(i as u32),
            _ => Err(WireError::Range { field }),
        }
    }

    pub fn opt_u32(&mut self, field: &'static str) -> Result<Option<u32>, WireError> {
        if self.nil()? {
            Ok(None)
        } else {
            self.u32(field).map(Some)
        }
    }

    pub fn float(&mut self, field: &'static str) -> Result<f64, WireError> {
        Ok(match self.peek_marker()? {
            Marker::F32 => {
                self.pos += 1;
                f32::from_bits(self.be(4)? as u32) as f64
            }
            Marker::F64 => {
                self.pos += 1;
                f64::from_bits(self.be(8)?)
            }
            _ => match self.int(field)? {
                Int::U(u) => u as f64,
                Int::I(i) => i as f64,
            },
        })
    }

    /// A string's byte range (UTF-8 is checked by the caller when it needs text).
    pub fn str(&mut self, field: &'static str) -> Result<Range<usize>, WireError> {
        let len = match self.marker()? {
            Marker::FixStr(n) => n as usize,
            Marker::Str8 => self.be(1)? as usize,
            Marker::Str16 => self.be(2)? as usize,
            Marker::Str32 => self.be(4)? as usize,
            _ => {
                return Err(WireError::Type {
                    field,
                    expected: "string",
                });
            }
        };
        let start = self.pos;
        self.take(len)?;
        Ok(start..self.pos)
    }

    pub fn opt_str(&mut self, field: &'static str) -> Result<Option<Range<usize>>, WireError> {
        if self.nil()? {
            Ok(None)
        } else {
            self.str(field).map(Some)
        }
    }

    /// A string or a bin, as a byte range.
    pub fn bytes_or_str(&mut self, field: &'static str) -> Result<Range<usize>, WireError> {
        let len = match self.peek_marker()? {
            Marker::Bin8 => {
                self.pos += 1;
                self.be(1)? as usize
            }
            Marker::Bin16 => {
                self.pos += 1;
                self.be(2)? as usize
            }
            Marker::Bin32 => {
                self.pos += 1;
                self.be(4)? as usize
            }
            _ => return self.str(field),
        };
        let start = self.pos;
        self.take(len)?;
        Ok(start..self.pos)
    }

    pub fn is_bin(&self) -> Result<bool, WireError> {
        Ok(matches!(
            self.peek_marker()?,
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32
        ))
    }

    /// Array length, refusing lengths the remaining bytes cannot hold (each element is ≥ 1 byte).
    pub fn array(&mut self, field: &'static str) -> Result<usize, WireError> {
        let len = match self.marker()? {
            Marker::FixArray(n) => n as usize,
            Marker::Array16 => self.be(2)? as usize,
            Marker::Array32 => self.be(4)? as usize,
            _ => {
                return Err(WireError::Type {
                    field,
                    expected: "array",
                });
            }
        };
        if len > self.remaining() {
            return Err(WireError::Truncated);
        }
        Ok(len)
    }

    /// Map length, with the same plausibility check as [`Cursor::array`].
    pub fn map(&mut self, field: &'static str) -> Result<usize, WireError> {
        let len = match self.marker()? {
            Marker::FixMap(n) => n as usize,
            Marker::Map16 => self.be(2)? as usize,
            Marker::Map32 => self.be(4)? as usize,
            _ => {
                return Err(WireError::Type {
                    field,
                    expected: "map",
                });
            }
        };
        if len.saturating_mul(2) > self.remaining() {
            return Err(WireError::Truncated);
        }
        Ok(len)
    }

    pub fn is_map(&self) -> Result<bool, WireError> {
        Ok(matches!(
            self.peek_marker()?,
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32
        ))
    }

    /// What kind of value is next, without consuming it.
    pub fn peek_class(&self) -> Result<Class, WireError> {
        Ok(match self.peek_marker()? {
            Marker::Null => Class::Nil,
            Marker::True | Marker::False => Class::Bool,
            Marker::FixPos(_)
            | Marker::FixNeg(_)
            | Marker::U8
            | Marker::U16
            | Marker::U32
            | Marker::U64
            | Marker::I8
            | Marker::I16
            | Marker::I32
            | Marker::I64 => Class::Int,
            Marker::F32 | Marker::F64 => Class::Float,
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => Class::Str,
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => Class::Bin,
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => Class::Array,
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => Class::Map,
            _ => Class::Other,
        })
    }

    /// Skip one value of any type.
    pub fn skip(&mut self) -> Result<(), WireError> {
        self.skip_depth(0)
    }

    fn skip_depth(&mut self, depth: u32) -> Result<(), WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::TooDeep);
        }
        let n = match self.marker()? {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                0
            }
            Marker::U8 | Marker::I8 => 1,
            Marker::U16 | Marker::I16 => 2,
            Marker::U32 | Marker::I32 | Marker::F32 => 4,
            Marker::U64 | Marker::I64 | Marker::F64 => 8,
            Marker::FixStr(n) => n as usize,
            Marker::Str8 | Marker::Bin8 => self.be(1)? as usize,
            Marker::Str16 | Marker::Bin16 => self.be(2)? as usize,
            Marker::Str32 | Marker::Bin32 => self.be(4)? as usize,
            Marker::FixExt1 => 2,
            Marker::FixExt2 => 3,
            Marker::FixExt4 => 5,
            Marker::FixExt8 => 9,
            Marker::FixExt16 => 17,
            Marker::Ext8 => self.be(1)? as usize + 1,
            Marker::Ext16 => self.be(2)? as usize + 1,
            Marker::Ext32 => self.be(4)? as usize + 1,
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                self.pos -= 1;
                for _ in 0..self.array("value")? {
                    self.skip_depth(depth + 1)?;
                }
                return Ok(());
            }
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                self.pos -= 1;
                for _ in 0..self.map("value")? * 2 {
                    self.skip_depth(depth + 1)?;
                }
                return Ok(());
            }
            Marker::Reserved => {
                return Err(WireError::Type {
                    field: "value",
                    expected: "msgpack value",
                });
            }
        };
        self.take(n)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(ids: &[u64]) -> Vec<u8> {
        let mut buf = Vec::new();
        for &t in ids {
            rmp::encode::write_uint(&mut buf, t).unwrap();
        }
        buf
    }

    /// The word-at-a-time path reads exactly what `token` reads, one id at a time,
    /// at every width boundary and up to the frame's last byte.
    #[test]
    fn tokens_into_reads_as_token_does() {
        let edges = [
            0,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            128_000,
            u32::MAX as u64,
        ];
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15);
        let mut ids: Vec<u64> = edges.to_vec();
        for _ in 0..2_000 {
            let x = rng.next_u64();
            ids.push(edges[(x % 10) as usize].saturating_sub(x >> 60) % (u32::MAX as u64 + 1));
        }
        for take in [0, 1, 2, 3, 7, 9, ids.len()] {
            let buf = encode(&ids[..take]);
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            let mut c = Cursor::new(&buf);
            c.tokens_into(take, &mut fast, "token_ids").unwrap();
            assert_eq!(c.pos(), buf.len());
            let mut c = Cursor::new(&buf);
            for _ in 0..take {
                slow.push(c.token("token_ids").unwrap());
            }
            assert_eq!(fast, slow);
            assert_eq!(
                fast,
                ids[..take].iter().map(|&t| t as u32).collect::<Vec<_>>()
            );
        }
    }

    /// One id as an engine might write it: the value and how (0: canonical, 1:
    /// u64, 2: i64, 3: u32 marker however small, 4: i32).
    fn write_id(buf: &mut Vec<u8>, v: u32, how: u8) {
        match how {
            0 => rmp::encode::write_uint(buf, v as u64).map(|_| ()),
            1 => rmp::encode::write_u64(buf, v as u64),
            2 => rmp::encode::write_i64(buf, v as i64),
            3 => rmp::encode::write_u32(buf, v),
            _ => rmp::encode::write_i32(buf, v as i32),
        }
        .unwrap();
    }

    proptest::proptest! {
        /// Long runs of ids (which the AVX2 path reads in pairs) read as `token`
        /// reads them one by one, whatever their widths, wherever a marker the fast
        /// paths refuse falls (first or second of a pair, across a window's edge),
        /// and whatever the count asked for, odd or even.
        #[test]
        fn long_runs_read_as_token_does(
            ids in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        0u32..128,
                        128u32..256,
                        256u32..65_536,
                        65_536u32..=u32::MAX,
                        0u32..=(i32::MAX as u32),
                    ],
                    proptest::prop_oneof![8 => proptest::strategy::Just(0u8), 1 => 1u8..5],
                ),
                0..400,
            ),
            cut in 0usize..=400,
            lead in 0usize..8,
        ) {
            let mut buf = vec![0x90; lead];
            for &(v, how) in &ids {
                // i32 holds only the ids below 2^31.
                write_id(&mut buf, v, if how == 4 && v > i32::MAX as u32 { 0 } else { how });
            }
            let take = cut.min(ids.len());
            let mut fast = Vec::new();
            let mut c = Cursor::new(&buf);
            c.pos = lead;
            c.tokens_into(take, &mut fast, "token_ids").unwrap();
            let mut d = Cursor::new(&buf);
            d.pos = lead;
            let slow: Vec<u32> = (0..take).map(|_| d.token("token_ids").unwrap()).collect();
            proptest::prop_assert_eq!(&fast, &slow);
            proptest::prop_assert_eq!(c.pos, d.pos);
            let want: Vec<u32> = ids[..take].iter().map(|&(v, _)| v).collect();
            proptest::prop_assert_eq!(fast, want);
        }
    }

    /// Ids the one-word path leaves to `token` (u64 and signed markers holding a
    /// u32 value) are read in the middle of a stream as `token` reads them.
    #[test]
    fn tokens_into_reads_other_integer_markers_as_token_does() {
        let mut buf = encode(&[300; 8]);
        rmp::encode::write_u64(&mut buf, 70_000).unwrap();
        rmp::encode::write_i8(&mut buf, 5).unwrap();
        rmp::encode::write_i32(&mut buf, 100_000).unwrap();
        buf.extend(encode(&[7, 65_536, 1]));
        buf.extend(encode(&[128_000; 8]));
        let mut fast = Vec::new();
        Cursor::new(&buf)
            .tokens_into(22, &mut fast, "token_ids")
            .unwrap();
        let mut c = Cursor::new(&buf);
        let slow: Vec<u32> = (0..22).map(|_| c.token("token_ids").unwrap()).collect();
        assert_eq!(fast, slow);
        assert_eq!(&fast[8..14], &[70_000, 5, 100_000, 7, 65_536, 1]);
    }

    /// A 64-bit hash read whole gives the bits `int` gives; any other value (or too
    /// few bytes) is left for `int`.
    #[test]
    fn word64_reads_64_bit_ints_as_int_does_and_leaves_the_rest() {
        for v in [i64::MIN, -7_919_000_000_123, -1, 0, i64::MAX] {
            let mut buf = Vec::new();
            rmp::encode::write_i64(&mut buf, v).unwrap();
            rmp::encode::write_u64(&mut buf, v as u64).unwrap();
            let mut c = Cursor::new(&buf);
            let slow = Cursor::new(&buf).int("h").unwrap().bits();
            assert_eq!(c.word64(), Some(slow));
            assert_eq!(c.word64(), Some(v as u64));
            assert_eq!(c.pos(), buf.len());
            assert_eq!(c.word64(), None);
        }
        for short in [
            encode(&[5]),
            encode(&[u32::MAX as u64]),
            vec![0xcf, 1, 2, 3],
        ] {
            let mut c = Cursor::new(&short);
            assert_eq!(c.word64(), None);
            assert_eq!(c.pos(), 0);
        }
    }

    /// What is not a u32 fails with the error `token` gives at that id.
    #[test]
    fn tokens_into_rejects_what_is_not_a_u32() {
        let same_error = |buf: &[u8], n: usize| {
            let fast = Cursor::new(buf).tokens_into(n, &mut Vec::new(), "token_ids");
            let mut c = Cursor::new(buf);
            let slow = (0..n).try_for_each(|_| c.token("token_ids").map(drop));
            assert!(fast.is_err());
            assert_eq!(fast, slow);
        };
        for bad in [u32::MAX as u64 + 1, u64::MAX] {
            let mut buf = encode(&[5, 6, 7, 8, 9, 10, 11, 12]);
            rmp::encode::write_uint(&mut buf, bad).unwrap();
            buf.extend(encode(&[1; 8]));
            same_error(&buf, 17);
        }
        let mut buf = encode(&[5; 8]);
        rmp::encode::write_sint(&mut buf, -3).unwrap();
        buf.extend(encode(&[1; 8]));
        same_error(&buf, 17);
        let mut buf = encode(&[5; 8]);
        rmp::encode::write_str(&mut buf, "x").unwrap();
        buf.extend(encode(&[1; 8]));
        same_error(&buf, 17);
        // Fewer ids than the array claims: truncated, not a panic, nor a huge reservation.
        same_error(&encode(&[300; 4]), 5);
        same_error(&encode(&[300; 40]), 1 << 40);
    }
}
