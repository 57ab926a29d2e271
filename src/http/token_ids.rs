//! Token ids read straight from a `/query` body's JSON text.
//!
//! Owns the fast path for the one large field of a query. A body is mostly a
//! thousand or more token ids; scanning them with serde_json (to delimit the
//! value) and then converting them was the largest kvix-side cost of `/query`.
//! Here each id is read once: in
//! compact runs (`1,22,333,`) 64-byte windows at a time, every id converted from
//! one word, four words at a time where the CPU has AVX2 (`compact_run`); anything
//! else id by id (`atoi_simd`).
//!
//! Never decides an error: anything but a plain top-level `token_ids` array of
//! non-negative integers returns `None`, and the caller parses the whole body
//! with serde_json, which names the offending field.

use memchr::memmem;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m128i, __m256i};

const KEY: &[u8] = b"\"token_ids\"";

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && is_ws(s[i]) {
        i += 1;
    }
    i
}

/// A JSON array of plain u32s starting at `s[0]` (after optional whitespace):
/// the ids and the offset just past its `]`. `None` for signs, fractions,
/// exponents, leading zeros, overflow, other types or a malformed array.
pub fn array_prefix(s: &[u8]) -> Option<(Vec<u32>, usize)> {
    let mut i = skip_ws(s, 0);
    if s.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_ws(s, i + 1);
    // Every id but the last takes at least two bytes ("1,"): a safe capacity bound.
    let mut out = Vec::with_capacity((s.len() - i) / 2 + 1);
    if s.get(i) == Some(&b']') {
        return Some((out, i + 1));
    }
    loop {
        i = compact_run(s, i, &mut out);
        let rest = s.get(i..)?;
        let (v, len) = atoi_simd::parse_prefix_pos::<u32, false>(rest).ok()?;
        // JSON has no leading zeros; atoi_simd accepts them.
        if len == 0 || (len > 1 && rest[0] == b'0') {
            return None;
        }
        out.push(v);
        i = skip_ws(s, i + len);
        match s.get(i) {
            Some(b',') => i = skip_ws(s, i + 1),
            Some(b']') => return Some((out, i + 1)),
            _ => return None,
        }
    }
}

/// The ids of compact text (`12,345,6789,`: digits and commas only) from `s[i]`,
/// the first digit of an id, appended to `out`; returns where the first id it
/// did not read starts. Reads 64-byte windows: the commas of a window are found
/// at once, so where each id ends no longer waits on reading the one before, and
/// each id of up to eight digits is converted from one word, whatever its length
/// (four words at a time where the CPU has AVX2). Stops at (leaves to the caller)
/// a window holding anything else (spaces, `]`, a sign), an id of more than eight
/// digits or a leading zero, and the text's last 64 bytes.
#[cfg(target_arch = "x86_64")]
fn compact_run(s: &[u8], i: usize, out: &mut Vec<u32>) -> usize {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { compact_run_avx2(s, i, out) }
    } else {
        compact_run_words(s, i, out)
    }
}

/// The commas of the 64-byte window `s[i..i + 64]`, whose byte 0 starts an id,
/// when the window can be read whole: digits and commas only, at least one
/// comma, no empty id, no leading zero, no id of nine digits or more. `None`
/// otherwise, and past the text's last 64 bytes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn compact_window(s: &[u8], i: usize) -> Option<u64> {
    let window = s.get(i..i + 64)?;
    let (commas, digits, zeros) = classify(window.first_chunk::<64>().expect("64 bytes"));
    // Starts of ids: byte 0 and each byte after a comma.
    let starts = commas << 1 | 1;
    // Nine digits in a row end at bit k: bit k of the and of the masks shifted 0..=8.
    let nine = (1..9).fold(digits, |m, k| m & digits >> k);
    let whole = commas | digits == u64::MAX
        && commas != 0
        // An empty id (a comma first or after a comma).
        && commas & starts == 0
        // A leading zero: a '0' starting an id and followed by a digit.
        && zeros & starts & digits >> 1 == 0
        && nine == 0;
    whole.then_some(commas)
}

/// [`compact_run`] one id at a time, each converted from its word by
/// [`eight_digits`].
#[cfg(target_arch = "x86_64")]
fn compact_run_words(s: &[u8], mut i: usize, out: &mut Vec<u32>) -> usize {
    // An id's word is the eight bytes ending at its comma: at least eight before.
    if i < 8 {
        return i;
    }
    while let Some(commas) = compact_window(s, i) {
        // At most 32 ids end in a window (an id and its comma take two bytes).
        out.reserve(32);
        let spare = &mut out.spare_capacity_mut()[..32];
        let (mut start, mut n) = (0usize, 0usize);
        let mut m = commas;
        while m != 0 {
            let end = m.trailing_zeros() as usize;
            // 1..=8 digits: the window's checks ruled out empty and longer ids.
            let len = end - start;
            let word = s[i + end - 8..i + end].first_chunk::<8>().expect("8 bytes");
            spare[n].write(eight_digits(u64::from_le_bytes(*word), len));
            n += 1;
            start = end + 1;
            m &= m - 1;
        }
        // SAFETY: the loop above wrote the first `n` (<= 32) spare slots, in order.
        unsafe { out.set_len(out.len() + n) };
        i += start;
    }
    i
}

/// [`compact_run`] four ids at a time: their four words and the byte offsets of
/// their commas are gathered straight into vectors (no trip through memory, where
/// a wide load of four narrow stores would wait for all of them), and converted
/// by [`four_ids`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn compact_run_avx2(s: &[u8], mut i: usize, out: &mut Vec<u32>) -> usize {
    use std::arch::x86_64::*;
    if i < 8 {
        return i;
    }
    while let Some(commas) = compact_window(s, i) {
        let count = commas.count_ones() as usize;
        out.reserve(32);
        let spare = out.spare_capacity_mut()[..32].as_mut_ptr().cast::<u32>();
        // The word of an id whose comma is window byte `end` starts at `words + end`.
        // Past the window's last comma `end` reads 64: the window's last word,
        // converted into a spare slot that is never counted.
        let words = s[i - 8..i + 64].as_ptr();
        // SAFETY: `words` starts 72 readable bytes and `end` <= 64, so each
        // unaligned eight-byte read ends inside them.
        let word = |end: u32| unsafe { words.add(end as usize).cast::<u64>().read_unaligned() };
        let mut m = commas;
        let mut next = || {
            let end = m.trailing_zeros();
            m &= m.wrapping_sub(1);
            end
        };
        // The comma before the window's first id, as if at byte -1.
        let mut prev = -1i64;
        for k in (0..count).step_by(4) {
            let (e0, e1, e2, e3) = (next(), next(), next(), next());
            let w = _mm256_set_epi64x(
                word(e3) as i64,
                word(e2) as i64,
                word(e1) as i64,
                word(e0) as i64,
            );
            let ends = _mm256_set_epi64x(e3 as i64, e2 as i64, e1 as i64, e0 as i64);
            // Each lane's previous comma: the lanes shifted up by one, `prev` first.
            let prevs = _mm256_blend_epi32::<0b0000_0011>(
                _mm256_permute4x64_epi64::<0b10_01_00_00>(ends),
                _mm256_set1_epi64x(prev),
            );
            // Bits before an id's digits: 8 * (8 - len), len = end - prev - 1. Lanes
            // past the last comma come out negative or over 64, so shift all out.
            let shifts = _mm256_slli_epi64::<3>(_mm256_sub_epi64(
                _mm256_add_epi64(prevs, _mm256_set1_epi64x(9)),
                ends,
            ));
            // SAFETY: k < count <= 32 and k is a multiple of 4, so the four slots
            // from `k` are among the 32 spare ones reserved above.
            unsafe { _mm_storeu_si128(spare.add(k).cast(), four_ids(w, shifts)) };
            prev = e3 as i64;
        }
        // SAFETY: the loop above wrote the first `count` (<= 32) spare slots, in
        // order (and perhaps up to three more, not counted).
        unsafe { out.set_len(out.len() + count) };
        // Past the window's last comma.
        i += 64 - commas.leading_zeros() as usize;
    }
    i
}

/// Four ids from four words as [`eight_digits`] reads one: a word's digits are its
/// top bytes, and its `shifts` lane is eight bits for each byte before them (64
/// or more: none of them). The eight digit values of a lane (leading zeros for
/// the bytes cleared) are summed in pairs, quads and halves by multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn four_ids(words: __m256i, shifts: __m256i) -> __m128i {
    use std::arch::x86_64::*;
    // The bytes before the id's digits cleared, then digit values (cleared bytes
    // stay zero).
    let keep = _mm256_sllv_epi64(_mm256_set1_epi64x(-1), shifts);
    let d = _mm256_subs_epu8(_mm256_and_si256(words, keep), _mm256_set1_epi8(b'0' as i8));
    // Per 16 bits: 10 * the earlier digit + the later one.
    let pairs = _mm256_maddubs_epi16(d, _mm256_set1_epi16(0x010A));
    // Per 32 bits: 100 * the earlier pair + the later one.
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x0001_0064));
    // Per 64 bits, in the low half: 10000 * the earlier quad + the later one.
    let ids = _mm256_add_epi64(
        _mm256_mul_epu32(quads, _mm256_set1_epi64x(10_000)),
        _mm256_srli_epi64(quads, 32),
    );
    let packed = _mm256_permutevar8x32_epi32(ids, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    _mm256_castsi256_si128(packed)
}

#[cfg(not(target_arch = "x86_64"))]
fn compact_run(_: &[u8], i: usize, _: &mut Vec<u32>) -> usize {
    i
}

/// Bit masks of the commas, the digits and the '0's among 64 bytes (bit k: byte k).
#[cfg(target_arch = "x86_64")]
fn classify(bytes: &[u8; 64]) -> (u64, u64, u64) {
    use std::arch::x86_64::*;
    let (mut commas, mut digits, mut zeros) = (0u64, 0u64, 0u64);
    for (k, lane) in bytes.chunks_exact(16).enumerate() {
        // SAFETY: SSE2 is part of x86_64; the load reads the 16 bytes of `lane`
        // (unaligned loads allowed), and the rest are register operations.
        let (c, d, z) = unsafe {
            let v = _mm_loadu_si128(lane.as_ptr().cast());
            let c = _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b',' as i8)));
            // A digit is a byte whose distance above '0' is at most 9 (unsigned).
            let t = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
            let d = _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(9)), t));
            let z = _mm_movemask_epi8(_mm_cmpeq_epi8(t, _mm_setzero_si128()));
            (c as u16 as u64, d as u16 as u64, z as u16 as u64)
        };
        commas |= c << (16 * k);
        digits |= d << (16 * k);
        zeros |= z << (16 * k);
    }
    (commas, digits, zeros)
}

/// The value of the last `len` (1..=8) bytes of `word`, ASCII digits with the
/// first in the lowest of them: the bytes before are dropped (they read as
/// leading zeros), then pairs, quads and the two halves combine by multiplies.
#[cfg(target_arch = "x86_64")]
#[inline]
fn eight_digits(word: u64, len: usize) -> u32 {
    let keep = u64::MAX << (8 * (8 - len));
    // Wrapping throughout: a window found bad afterwards converts bytes that are not
    // digits (its result is dropped), and the last step's high lanes wrap by design
    // (only bits 32..64 are kept).
    let v = (word & keep).wrapping_sub(0x3030_3030_3030_3030 & keep);
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    let hi = (v & 0x0000_00FF_0000_00FF).wrapping_mul(100 + (1_000_000 << 32));
    let lo = ((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32));
    (hi.wrapping_add(lo) >> 32) as u32
}

/// The whole of `s` is one plain u32 array (surrounding whitespace allowed).
pub fn plain_u32_array(s: &[u8]) -> Option<Vec<u32>> {
    let (ids, end) = array_prefix(s)?;
    (skip_ws(s, end) == s.len()).then_some(ids)
}

/// Is offset `at` of `body` a key position of the top-level object? Walks the
/// text before it (in practice a few bytes: `{` or `{"model_name":"m",`),
/// tracking strings and nesting.
fn at_top_level_key(body: &[u8], at: usize) -> bool {
    let (mut depth, mut in_str, mut esc) = (0u32, false, false);
    let mut last = 0u8;
    for &b in &body[..at] {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if !is_ws(b) {
            last = b;
        }
    }
    !in_str && depth == 1 && matches!(last, b'{' | b',') && body.first() == Some(&b'{')
}

/// Split a query body into its top-level `token_ids` (parsed here) and the rest
/// of the body with that array replaced by `[]`, small enough for serde_json.
pub fn split(body: &[u8]) -> Option<(Vec<u32>, Vec<u8>)> {
    let key = memmem::find(body, KEY)?;
    if !at_top_level_key(body, key) {
        return None;
    }
    let colon = skip_ws(body, key + KEY.len());
    if body.get(colon) != Some(&b':') {
        return None;
    }
    let start = skip_ws(body, colon + 1);
    let (ids, len) = array_prefix(&body[start..])?;
    let end = start + len;
    let mut rest = Vec::with_capacity(body.len() - (end - start) + 2);
    rest.extend_from_slice(&body[..start]);
    rest.extend_from_slice(b"[]");
    rest.extend_from_slice(&body[end..]);
    Some((ids, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_token_arrays_parse_and_anything_else_falls_back() {
        assert_eq!(
            plain_u32_array(b"[1, 22,333 ,\n4294967295]"),
            Some(vec![1, 22, 333, u32::MAX])
        );
        assert_eq!(plain_u32_array(b" [ ] "), Some(vec![]));
        assert_eq!(plain_u32_array(b"[0,10]"), Some(vec![0, 10]));
        assert_eq!(
            plain_u32_array(b"[123456789,1234567890,7]"),
            Some(vec![123456789, 1234567890, 7])
        );
        for bad in [
            &b"[4294967296]"[..],
            b"[-1]",
            b"[+1]",
            b"[1.0]",
            b"[1e3]",
            b"[01]",
            b"[00]",
            b"[1,]",
            b"[,1]",
            b"[1 2]",
            b"[\"1\"]",
            b"[1",
            b"[1,",
            b"[",
            b"",
            b"[1]]",
            b"{}",
            b"[99999999999999999999]",
            b"[0000000000001]",
        ] {
            assert_eq!(
                plain_u32_array(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Both conversions of the window path read the same ids and stop at the same
    /// place (on a CPU with AVX2 the one-word conversion runs only here).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_one_word_conversions_agree() {
        let mut rng = crate::testing::Xorshift::new(0x2545_F491_4F6C_DD1D);
        let mut read = 0;
        for _ in 0..2_000 {
            let ids: Vec<u32> = (0..rng.below(200))
                .map(|_| match rng.below(4) {
                    0 => rng.below(10),
                    1 => rng.below(100_000_000),
                    _ => rng.below(200_000),
                } as u32)
                .collect();
            let mut text = b"{\"token_ids\":[".to_vec();
            let first = text.len();
            let list: Vec<String> = ids.iter().map(u32::to_string).collect();
            text.extend_from_slice(list.join(",").as_bytes());
            text.push(b']');
            let mut words = Vec::new();
            let end = compact_run_words(&text, first, &mut words);
            assert_eq!(words, ids[..words.len()]);
            read += words.len();
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut fours = Vec::new();
                // SAFETY: the CPU has AVX2, checked just above.
                let end4 = unsafe { compact_run_avx2(&text, first, &mut fours) };
                assert_eq!((end4, fours), (end, words));
            }
        }
        assert!(read > 100_000, "the window path read only {read} ids");
    }

    /// Windows of compact ids read as id by id does, whatever the id lengths,
    /// leading zeros, long ids, spaces or other bytes mixed in (which the
    /// window reader leaves to the id-by-id path, or to a rejection).
    #[test]
    fn window_reads_equal_id_by_id_reads() {
        let mut rng = crate::testing::Xorshift::new(0x9E37_79B9_7F4A_7C15u64);
        let mut next = |n: u64| rng.below(n);
        for round in 0..3_000 {
            let ids: Vec<u64> = (0..next(300))
                .map(|_| match next(10) {
                    0 => next(10),
                    1 => next(u32::MAX as u64 + 1),
                    2 => 10u64.pow(next(10) as u32),
                    _ => next(200_000),
                })
                .collect();
            let mut text = b"[".to_vec();
            for (k, id) in ids.iter().enumerate() {
                if k > 0 {
                    text.push(b',');
                }
                text.extend_from_slice(id.to_string().as_bytes());
            }
            text.push(b']');
            if round % 3 == 1 {
                // Some damage: a space, a sign, a leading zero, a stray byte.
                let at = 1 + next(text.len() as u64 - 1) as usize;
                text.insert(at, [b' ', b'-', b'0', b'x', b','][next(5) as usize]);
            }
            let slow = serde_json::from_slice::<Vec<u32>>(&text).ok();
            assert_eq!(
                plain_u32_array(&text),
                slow,
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
    }

    #[test]
    fn splits_top_level_token_ids_only() {
        let (ids, rest) = split(br#"{"model_name":"m", "token_ids" : [1,2, 3],"x":{}}"#).unwrap();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(rest, br#"{"model_name":"m", "token_ids" : [],"x":{}}"#);
        let (ids, rest) = split(br#"{"token_ids":[7]}"#).unwrap();
        assert_eq!(
            (ids, rest.as_slice()),
            (vec![7], &br#"{"token_ids":[]}"#[..])
        );
        // An escaped quote inside a string is not a key; the real one follows.
        let (ids, _) = split(br#"{"model_name":"\"token_ids\":[1]","token_ids":[2]}"#).unwrap();
        assert_eq!(ids, vec![2]);
        // An unterminated object still splits: serde_json then rejects the rest.
        assert_eq!(
            split(br#"{"token_ids":[1]"#).unwrap().1,
            br#"{"token_ids":[]"#
        );
        // Whatever follows the array stays in the rest, trailing data included, so
        // serde_json's strict parse of the rest still sees (and rejects) it.
        let (_, rest) = split(br#"{"token_ids":[1]} {"x":1}"#).unwrap();
        assert_eq!(rest, br#"{"token_ids":[]} {"x":1}"#);
        assert!(serde_json::from_slice::<serde_json::Value>(&rest).is_err());
        for other in [
            // Nested, not a key, or not a plain array: left to serde_json.
            &br#"{"a":{"token_ids":[1]},"token_ids":[2]}"#[..],
            br#"{"a":["token_ids",[1]]}"#,
            br#"["token_ids",[1]]"#,
            br#"{"token_ids":[1.5]}"#,
            br#"{"token_ids":"1"}"#,
            br#"{"token_ids" [1]}"#,
            br#" {"token_ids":[1]}"#,
        ] {
            assert!(split(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
    }
}
