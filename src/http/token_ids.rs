//! Token ids read straight from a `/query` body's JSON text.
//!
//! Owns the fast path for the one large field of a query. A body is mostly a
//! thousand or more token ids; scanning them with serde_json (to delimit the
//! value) and then converting them was the largest kvix-side cost of `/query`
//! (perf, 16 connections: ~18% of server CPU). Here each id is read once, eight
//! digits at a time (`atoi_simd`).
//!
//! Never decides an error: anything but a plain top-level `token_ids` array of
//! non-negative integers returns `None`, and the caller parses the whole body
//! with serde_json, which names the offending field.

use memchr::memmem;

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
