//! Mooncake trace loading and deterministic expansion of hash ids into tokens and blocks.
//!
//! Owns the one mapping from a trace request to token ids and to kvix sequence
//! hashes; the event simulator and the query load both derive from it, so the
//! prompts they query are exactly the blocks the workers stored.

use kvix::hash;
use serde::Deserialize;
use std::io::{BufRead, BufReader};

/// Tokens covered by one Mooncake hash id.
pub const TRACE_BLOCK: usize = 512;
/// Token ids are drawn below this, like a real vocabulary; sentinels use ids above it.
pub const VOCAB: u64 = 100_000;

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    timestamp: u64,
    input_length: usize,
    #[serde(default)]
    output_length: usize,
    hash_ids: Vec<u64>,
}

/// One trace request, expanded.
pub struct Request {
    #[allow(dead_code)] // Kept for a future paced (trace-timestamp) replay.
    pub timestamp_ms: u64,
    #[allow(dead_code)]
    pub output_length: usize,
    /// `input_length` token ids.
    pub tokens: Vec<u32>,
    /// kvix sequence hashes of the complete blocks of `tokens`.
    pub seqs: Vec<u64>,
}

/// SplitMix64 finalizer: a cheap, stable, well-mixed 64-bit hash.
#[inline]
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Token `j` (< 512) of trace hash id `h`. Stable across runs and machines.
#[inline]
pub fn token(h: u64, j: usize) -> u32 {
    (splitmix((h << 9) | j as u64) % VOCAB) as u32
}

/// Append the first `n` tokens of hash id `h`.
pub fn expand(h: u64, n: usize, out: &mut Vec<u32>) {
    out.extend((0..n.min(TRACE_BLOCK)).map(|j| token(h, j)));
}

/// Read the first `limit` requests of a trace and expand them for `block_size`.
pub fn load(path: &str, limit: usize, block_size: usize) -> Result<Vec<Request>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open trace {path}: {e}"))?;
    let mut out = Vec::new();
    for (n, line) in BufReader::new(f).lines().enumerate() {
        if out.len() >= limit {
            break;
        }
        let line = line.map_err(|e| format!("{path}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).map_err(|e| format!("{path}:{}: {e}", n + 1))?;
        let mut tokens = Vec::with_capacity(l.input_length);
        for &h in &l.hash_ids {
            if tokens.len() >= l.input_length {
                break;
            }
            expand(h, l.input_length - tokens.len(), &mut tokens);
        }
        // A trace whose hash ids cover fewer tokens than input_length: keep what they cover.
        out.push(from_tokens(
            tokens,
            block_size,
            l.timestamp,
            l.output_length,
        ));
    }
    if out.is_empty() {
        return Err(format!("{path}: no requests"));
    }
    Ok(out)
}

/// A request of these tokens, with the sequence hashes of its complete blocks.
pub fn from_tokens(
    tokens: Vec<u32>,
    block_size: usize,
    timestamp_ms: u64,
    output_length: usize,
) -> Request {
    let mut seqs = Vec::new();
    hash::seq_hashes_for_tokens(&tokens, block_size, hash::block_seed(None, None), &mut seqs);
    Request {
        timestamp_ms,
        output_length,
        tokens,
        seqs: seqs.iter().map(|s| s.0).collect(),
    }
}

/// `req`'s tokens truncated or padded to exactly `n`; padding is deterministic
/// per request so padded prompts still share the request's prefix.
pub fn prompt(req: &Request, req_index: usize, n: usize) -> Vec<u32> {
    let mut t: Vec<u32> = req.tokens.iter().copied().take(n).collect();
    let mut k = 0u64;
    while t.len() < n {
        // Pseudo hash ids far above any real trace id.
        let h = (1u64 << 50) | ((req_index as u64) << 16) | k;
        expand(h, n - t.len(), &mut t);
        k += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_stable_and_in_vocab() {
        assert_eq!(token(0, 0), token(0, 0));
        assert_ne!(token(0, 0), token(0, 1));
        assert!((0..512).all(|j| (token(7, j) as u64) < VOCAB));
    }
}
