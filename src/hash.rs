//! Block identity: Dynamo-compatible local and sequence hashes.
//!
//! Owns the one hashing decision (ARCHITECTURE.md, "Block identity"): local
//! hash = XXH3-64 over the block's tokens as little-endian `u32`, seed 1337 (LoRA
//! name mixed in); sequence hash = XXH3-64(parent ‖ local, 1337). Must never
//! depend on engine hashes.

use crate::types::{BlockHash, SeqHash};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Dynamo's base seed for both block and chain hashes.
pub const XXH3_SEED: u64 = 1337;

/// Seed for local block hashes: the base seed, plus XXH3(lora_name) when a
/// LoRA adapter is named, plus XXH3(cache_salt, seed 1) when a cache salt is
/// given. Empty strings mean absent (the base model, no salt).
pub fn block_seed(lora_name: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut seed = XXH3_SEED;
    if let Some(name) = lora_name.filter(|n| !n.is_empty()) {
        seed = seed.wrapping_add(xxh3_64(name.as_bytes()));
    }
    if let Some(salt) = cache_salt.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
    }
    seed
}

/// Local hash of one block of tokens.
#[inline]
pub fn local_hash(tokens: &[u32], seed: u64) -> BlockHash {
    // Hash the tokens' little-endian bytes without copying on little-endian targets.
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `u32` has no padding and every bit pattern is a valid `u8`; the
        // byte view covers exactly the slice's memory, which outlives this call, and
        // on little-endian targets it equals the concatenated `to_le_bytes()`.
        let bytes = unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        };
        BlockHash(xxh3_64_with_seed(bytes, seed))
    }
    #[cfg(not(target_endian = "little"))]
    {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        BlockHash(xxh3_64_with_seed(&bytes, seed))
    }
}

/// Local hash of a block carrying multimodal objects: XXH3 of the tokens' LE
/// bytes followed by the objects' hashes, ascending, as LE u64 (Dynamo's rule).
/// `mm` must be sorted; `buf` is scratch space reused across calls.
pub fn local_hash_mm(tokens: &[u32], mm: &[u64], seed: u64, buf: &mut Vec<u8>) -> BlockHash {
    if mm.is_empty() {
        return local_hash(tokens, seed);
    }
    buf.clear();
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    for h in mm {
        buf.extend_from_slice(&h.to_le_bytes());
    }
    BlockHash(xxh3_64_with_seed(buf, seed))
}

/// Next link of the sequence chain; the first block's sequence hash is its local hash.
#[inline]
pub fn chain(parent: Option<SeqHash>, local: BlockHash) -> SeqHash {
    match parent {
        None => SeqHash(local.0),
        Some(p) => {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&p.0.to_le_bytes());
            buf[8..].copy_from_slice(&local.0.to_le_bytes());
            SeqHash(xxh3_64_with_seed(&buf, XXH3_SEED))
        }
    }
}

/// Sequence hashes for the complete blocks of `tokens` (a trailing partial block is ignored).
pub fn seq_hashes_for_tokens(tokens: &[u32], block_size: usize, seed: u64, out: &mut Vec<SeqHash>) {
    out.clear();
    if block_size == 0 {
        return;
    }
    let locals = tokens.chunks_exact(block_size).map(|c| local_hash(c, seed));
    out.extend(chained(None, locals));
}

/// Sequence hashes from already computed local hashes.
pub fn seq_hashes_for_locals(locals: &[BlockHash], out: &mut Vec<SeqHash>) {
    out.clear();
    out.extend(chained(None, locals.iter().copied()));
}

/// The sequence hashes `locals` chain to after `parent` (`None`: from the first block).
pub fn chained(
    parent: Option<SeqHash>,
    locals: impl IntoIterator<Item = BlockHash>,
) -> impl Iterator<Item = SeqHash> {
    locals.into_iter().scan(parent, |parent, local| {
        let seq = chain(*parent, local);
        *parent = Some(seq);
        Some(seq)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Case {
        block_size: usize,
        token_ids: Vec<u32>,
        lora_name: Option<String>,
        local_block_hashes: Vec<u64>,
        sequence_hashes: Vec<u64>,
    }

    /// The `cases` of reference vectors `file` (in tests/data).
    fn cases<T: serde::de::DeserializeOwned>(file: &str) -> Vec<T> {
        #[derive(serde::Deserialize)]
        struct File<T> {
            cases: Vec<T>,
        }
        let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
        let f: File<T> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        f.cases
    }

    /// Every vector produced by the reference implementation must match.
    #[test]
    fn reproduces_reference_vectors() {
        let cases: Vec<Case> = cases("dynamo_block_hashes.json");
        assert!(cases.len() >= 9);
        for c in &cases {
            let seed = block_seed(c.lora_name.as_deref(), None);
            let locals: Vec<u64> = c
                .token_ids
                .chunks_exact(c.block_size)
                .map(|ch| local_hash(ch, seed).0)
                .collect();
            assert_eq!(
                locals, c.local_block_hashes,
                "local hashes, block_size {}",
                c.block_size
            );
            let mut seqs = Vec::new();
            seq_hashes_for_tokens(&c.token_ids, c.block_size, seed, &mut seqs);
            let seqs: Vec<u64> = seqs.iter().map(|s| s.0).collect();
            assert_eq!(
                seqs, c.sequence_hashes,
                "sequence hashes, block_size {}",
                c.block_size
            );
        }
    }

    #[test]
    fn empty_lora_and_salt_are_absent() {
        assert_eq!(block_seed(Some(""), Some("")), block_seed(None, None));
        assert_ne!(block_seed(Some("a"), None), block_seed(None, None));
    }

    /// Cases from the reference (salted and LoRA-plus-salt seeds), tokens [1, 2, 3, 4], block size 4.
    #[test]
    fn salt_matches_reference() {
        let t = [1u32, 2, 3, 4];
        assert_eq!(
            local_hash(&t, block_seed(None, None)).0,
            14643705804678351452
        );
        assert_eq!(
            local_hash(&t, block_seed(Some("my-lora"), None)).0,
            15671544057904749233
        );
        assert_eq!(
            local_hash(&t, block_seed(None, Some("tenant-a"))).0,
            5738685477468498325
        );
        assert_eq!(
            local_hash(&t, block_seed(Some("my-lora"), Some("tenant-a"))).0,
            6157910915076630503
        );
    }

    #[derive(serde::Deserialize)]
    struct MmCase {
        block_size: usize,
        token_ids: Vec<u32>,
        block_mm_hashes: Vec<Option<Vec<u64>>>,
        lora_name: Option<String>,
        cache_salt: Option<String>,
        local_block_hashes: Vec<u64>,
        sequence_hashes: Vec<u64>,
    }

    /// Multimodal, LoRA and cache-namespace cases generated from the reference
    /// implementation by `scripts/dynamo_vectors`.
    #[test]
    fn reproduces_reference_mm_and_namespace_vectors() {
        let cases: Vec<MmCase> = cases("dynamo_mm_vectors.json");
        assert!(cases.len() >= 5);
        for c in &cases {
            let seed = block_seed(c.lora_name.as_deref(), c.cache_salt.as_deref());
            let (mut buf, mut parent, mut locals, mut seqs) =
                (Vec::new(), None, Vec::new(), Vec::new());
            for (i, chunk) in c.token_ids.chunks_exact(c.block_size).enumerate() {
                let mut mm = c
                    .block_mm_hashes
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or_default();
                mm.sort_unstable();
                let l = local_hash_mm(chunk, &mm, seed, &mut buf);
                let s = chain(parent, l);
                locals.push(l.0);
                seqs.push(s.0);
                parent = Some(s);
            }
            assert_eq!(locals, c.local_block_hashes, "{:?}", c.block_mm_hashes);
            assert_eq!(seqs, c.sequence_hashes);
        }
    }
}
