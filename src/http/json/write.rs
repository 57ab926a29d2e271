//! Numbers, keys and floats written straight into a reply's bytes.
//!
//! Owns the digits: a reply holds hundreds of numbers, each written without a
//! scratch buffer or a formatter on the hot path. Must never write structure
//! (braces, field names): the renderers do.

/// Two-digit pairs "00".."99", so a number is written two digits per division.
pub(super) const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Append `n` in decimal. Digits go straight into the buffer's spare room: a
/// reply holds hundreds of numbers, and formatting each into a scratch buffer
/// and copying it out cost a `memcpy` call apiece.
pub(super) fn num(out: &mut Vec<u8>, n: impl Into<u64>) {
    let mut n: u64 = n.into();
    let digits = n.checked_ilog10().unwrap_or(0) as usize + 1;
    out.reserve(digits);
    let start = out.len();
    let spare = &mut out.spare_capacity_mut()[..digits];
    let mut i = digits;
    while n >= 100 {
        let pair = 2 * (n % 100) as usize;
        n /= 100;
        i -= 2;
        spare[i].write(PAIRS[pair]);
        spare[i + 1].write(PAIRS[pair + 1]);
    }
    if n >= 10 {
        let pair = 2 * n as usize;
        spare[0].write(PAIRS[pair]);
        spare[1].write(PAIRS[pair + 1]);
    } else {
        spare[0].write(b'0' + n as u8);
    }
    // SAFETY: `spare[..digits]` is written above: the loop fills it from the end,
    // two digits at a time, down to index 2 or 1, and the branch fills the rest.
    unsafe { out.set_len(start + digits) };
}

/// A number's decimal text, rendered once where a reply repeats it (an
/// instance's tiers mostly hold the same count). Up to eight digits are kept as
/// one word, built in a register and stored whole: text built byte by byte and
/// then copied out as one wide load stalls the store buffer.
#[derive(Clone, Copy)]
pub(super) enum Digits {
    /// The digits as little-endian bytes of the word, and how many there are.
    Short(u64, u8),
    /// Nine digits or more: written by [`num`].
    Long(u64),
}

impl Digits {
    #[inline]
    pub(super) fn of(n: u64) -> Digits {
        if n >= 100_000_000 {
            return Digits::Long(n);
        }
        let digits = n.checked_ilog10().unwrap_or(0) as u8 + 1;
        let mut n = n as u32;
        let mut word = 0u64;
        // Pairs from the least significant up, each shifted in below the ones
        // before, so that the most significant digit ends in the lowest byte.
        for _ in 0..digits / 2 {
            let pair = 2 * (n % 100) as usize;
            n /= 100;
            word = word << 16 | u16::from_le_bytes([PAIRS[pair], PAIRS[pair + 1]]) as u64;
        }
        if digits % 2 == 1 {
            word = word << 8 | (b'0' + n as u8) as u64;
        }
        Digits::Short(word, digits)
    }

    #[inline]
    pub(super) fn put(self, out: &mut Vec<u8>) {
        match self {
            Digits::Short(word, len) => {
                out.reserve(8);
                let start = out.len();
                // SAFETY: `reserve` left room for 8 more bytes, so the unaligned
                // write stays inside the allocation; `set_len` then keeps only
                // the first `len` (<= 8) of them, all written.
                unsafe {
                    out.as_mut_ptr()
                        .add(start)
                        .cast::<u64>()
                        .write_unaligned(word.to_le());
                    out.set_len(start + len as usize);
                }
            }
            Digits::Long(n) => num(out, n),
        }
    }
}

pub(super) fn key(out: &mut Vec<u8>, n: impl Into<u64>) {
    out.push(b'"');
    num(out, n);
    out.extend_from_slice(b"\":");
}

/// One JSON object key with its colon (`"7":`), rendered once.
#[derive(Clone)]
pub(super) enum Key {
    /// Most keys: the text in a fixed cell, copied whole (no `memcpy` call)
    /// and then cut to its length.
    Short([u8; KEY_CELL], u8),
    Long(Box<[u8]>),
}

pub(super) const KEY_CELL: usize = 32;

impl Key {
    pub(super) fn new(text: &[u8]) -> Key {
        if text.len() <= KEY_CELL {
            let mut cell = [0u8; KEY_CELL];
            cell[..text.len()].copy_from_slice(text);
            Key::Short(cell, text.len() as u8)
        } else {
            Key::Long(text.into())
        }
    }

    #[inline]
    pub(super) fn put(&self, out: &mut Vec<u8>) {
        match self {
            Key::Short(cell, len) => {
                out.reserve(KEY_CELL);
                let start = out.len();
                // SAFETY: `reserve` left room for KEY_CELL more bytes, so the copy stays
                // inside the allocation and cannot overlap `cell`; `set_len` then keeps
                // only the first `len` (<= KEY_CELL) of the bytes just written.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        cell.as_ptr(),
                        out.as_mut_ptr().add(start),
                        KEY_CELL,
                    );
                    out.set_len(start + *len as usize);
                }
            }
            Key::Long(text) => out.extend_from_slice(text),
        }
    }
}

pub(super) fn float(out: &mut Vec<u8>, v: f32) {
    // Scores are sums of weights in [0, 1]; four decimals keep them exact enough.
    let v = (v as f64 * 10_000.0).round() / 10_000.0;
    // `{:?}` keeps a decimal point (1.0, not 1): these are JSON floats.
    out.extend_from_slice(format!("{v:?}").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num_and_digits_write_what_display_writes() {
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15);
        let mut ns = vec![
            0,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            u64::MAX,
            u64::MAX - 1,
        ];
        ns.extend((1..20).flat_map(|p| [10u64.pow(p) - 1, 10u64.pow(p)]));
        ns.extend((0..100_000_000).step_by(9_973));
        for _ in 0..1000 {
            let x = rng.next_u64();
            ns.push(x >> (x % 64));
        }
        for n in ns {
            let mut out = b"[".to_vec();
            num(&mut out, n);
            assert_eq!(out, format!("[{n}").into_bytes());
            let mut out = b"[".to_vec();
            Digits::of(n).put(&mut out);
            assert_eq!(out, format!("[{n}").into_bytes(), "{n} as Digits");
        }
    }

    #[test]
    fn keys_of_any_length_are_written_whole() {
        for len in [0, 1, KEY_CELL - 1, KEY_CELL, KEY_CELL + 1, 300] {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let mut out = b"{".to_vec();
            Key::new(&text).put(&mut out);
            Key::new(b"\"7\":").put(&mut out);
            assert_eq!(out, [&b"{"[..], &text, b"\"7\":"].concat());
        }
    }
}
