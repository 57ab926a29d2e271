//! vLLM / SGLang positional event decoding (msgspec msgpack).
//!
//! Every layout seen in the field, as `["BlockStored", ...fields]`:
//!
//! | engine / version | BlockStored fields after the tag |
//! |---|---|
//! | vLLM ≤ 0.9, SGLang (old) | hashes, parent, tokens, block_size, lora_id |
//! | SGLang (attn_dp_rank era) | … lora_id, medium |
//! | SGLang with metadata | … lora_id, medium, `{"cache_salt": str}` |
//! | vLLM 0.10+ | … lora_id, medium, lora_name |
//! | vLLM 0.11+ | … lora_name, extra_keys |
//! | vLLM (hybrid KV groups) | … extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window |
//! | vLLM (newest) | … kv_cache_spec_sliding_window, locality, ... |
//!
//! `BlockRemoved`: hashes [, medium [, group_idx [, locality ...]]].
//! `AllBlocksCleared`: no fields (tail tolerated). Unknown trailing fields are
//! skipped; tail fields whose type changed between versions (`group_idx`,
//! `kv_cache_spec_kind`) are read leniently. The group fields say which
//! KV-cache group an event is of ([`super::GroupKind`]); events of a group kvix
//! has no hit rule for are dropped (counted in [`Batch::ignored`](super::Batch)).
//!
//! Current vLLM and SGLang encode events as tagged *maps* inside a positional
//! batch; those are decoded by [`super::map`]. The batch envelope is in
//! `batch.rs`, and [`super::decode`] is the entry point for every dialect.

use super::fields::{
    Fields, check_stored, extra_keys, group_kind, hashes, lenient_str, lenient_u32, lenient_window,
    lora_id, opt_hash, text, tokens,
};
use super::msgpack::Cursor;
use super::{Batch, EventOp, EventRec, WireError};

/// The operation of a vLLM/SGLang event tag.
pub(super) fn tag_op(tag: &[u8]) -> Option<EventOp> {
    match tag {
        b"BlockStored" => Some(EventOp::Stored),
        b"BlockRemoved" => Some(EventOp::Removed),
        b"AllBlocksCleared" => Some(EventOp::Cleared),
        _ => None,
    }
}

/// The fields after the tag of one positional event (`left` of them).
/// `Ok(None)`: a well-formed event of an auxiliary KV-cache group, dropped.
pub(super) fn event_array(
    c: &mut Cursor<'_>,
    out: &mut Batch,
    op: EventOp,
    left: usize,
) -> Result<Option<EventRec>, WireError> {
    let mut ev = EventRec::empty(op, out);
    let mut f = Fields::new(left);
    let (mut group, mut spec_kind, mut window) = (None, None, None);
    match op {
        EventOp::Stored => {
            f.next(true, "block_hashes")?;
            ev.hashes = hashes(c, out, "block_hashes")?;
            f.next(true, "parent_block_hash")?;
            ev.parent = opt_hash(c, "parent_block_hash")?;
            f.next(true, "token_ids")?;
            (ev.tokens, ev.bigram_tokens) = tokens(c, out, "token_ids")?;
            if f.next(false, "block_size")? {
                ev.block_size = c.opt_u32("block_size")?;
            }
            if f.next(false, "lora_id")? {
                ev.lora_id = lora_id(c)?;
            }
            if f.next(false, "medium")? {
                ev.medium = text(c, "medium")?;
            }
            if f.next(false, "lora_name")? {
                // vLLM puts the LoRA name here; SGLang a map `{"cache_salt": str}`.
                if c.is_map()? {
                    for _ in 0..c.map("lora_name")? {
                        let key = c.str("lora_name key")?;
                        if c.slice(key) == b"cache_salt" {
                            ev.cache_salt = text(c, "cache_salt")?;
                        } else {
                            c.skip()?;
                        }
                    }
                } else {
                    ev.lora_name = text(c, "lora_name")?;
                }
            }
            if f.next(false, "extra_keys")? {
                // kvix rehashes from tokens, so multimodal keys must be folded in again.
                extra_keys(c, out, &mut ev)?;
            }
            if f.next(false, "group_idx")? {
                group = lenient_u32(c)?;
            }
            if f.next(false, "kv_cache_spec_kind")? {
                spec_kind = lenient_str(c)?;
            }
            if f.next(false, "kv_cache_spec_sliding_window")? {
                window = lenient_window(c)?;
            }
        }
        EventOp::Removed => {
            f.next(true, "block_hashes")?;
            ev.hashes = hashes(c, out, "block_hashes")?;
            if f.next(false, "medium")? {
                ev.medium = text(c, "medium")?;
            }
            if f.next(false, "group_idx")? {
                group = lenient_u32(c)?;
            }
        }
        EventOp::Cleared | EventOp::Updated => {}
    }
    // Newer tail fields (locality, ownership, ...) are tolerated.
    f.skip_rest(c)?;
    let Some(kind) = group_kind(op, group, spec_kind.map(|r| c.slice(r))) else {
        return Ok(None);
    };
    (ev.group_idx, ev.group_kind, ev.group_window) = (group, kind, window);
    if op == EventOp::Stored {
        check_stored(&ev)?;
    }
    Ok(Some(ev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::EngineHash;
    use crate::wire::{Event, EventOp, decode};

    /// Payloads encoded by msgspec exactly as the engines encode them (scripts/gen_vllm_fixtures.py).
    pub fn fixture(name: &str) -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/wire_fixtures.json");
        let all: std::collections::HashMap<String, String> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let hex = &all[name];
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decoded(name: &str) -> (Batch, Vec<u8>) {
        let p = fixture(name);
        let mut b = Batch::default();
        decode(&p, &mut b).unwrap_or_else(|e| panic!("{name}: {e}"));
        (b, p)
    }

    fn events<'a>(b: &'a Batch, p: &'a [u8]) -> Vec<Event<'a>> {
        b.events(p).collect()
    }

    #[test]
    fn vllm_positional_with_every_field() {
        let (b, p) = decoded("vllm_array_full");
        assert_eq!(b.dp_rank, Some(3));
        let ev = events(&b, &p);
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].op, EventOp::Stored);
        assert_eq!(
            ev[0].hashes,
            &[EngineHash(-5i64 as u64), EngineHash(u64::MAX)]
        );
        assert_eq!(ev[0].parent, None);
        assert_eq!(ev[0].tokens, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ev[0].block_size, Some(4));
        assert_eq!(ev[0].medium, Some("GPU"));
        assert_eq!(ev[0].lora_name, Some("my-lora"));
        assert_eq!(ev[1].op, EventOp::Removed);
        assert_eq!(ev[1].hashes, &[EngineHash(-5i64 as u64)]);
        assert_eq!(ev[2].op, EventOp::Cleared);
    }

    #[test]
    fn vllm_positional_minimal_and_null_dp() {
        let (b, p) = decoded("vllm_array_minimal");
        assert_eq!(b.dp_rank, None);
        let ev = events(&b, &p);
        assert_eq!(ev[0].hashes, &[EngineHash(7)]);
        assert_eq!(ev[0].medium, None);
    }

    #[test]
    fn bytes_hashes_use_last_eight_bytes() {
        let (b, p) = decoded("vllm_bytes_hashes");
        let ev = events(&b, &p);
        assert_eq!(
            ev[0].hashes,
            &[EngineHash(u64::from_be_bytes([
                24, 25, 26, 27, 28, 29, 30, 31
            ]))]
        );
        assert_eq!(
            ev[0].parent,
            Some(EngineHash(u64::from_be_bytes([
                25, 26, 27, 28, 29, 30, 31, 32
            ])))
        );
        assert_eq!(ev[0].medium, Some("CPU"));
    }

    #[test]
    fn map_batch_and_map_events() {
        let (b, p) = decoded("vllm_map");
        assert_eq!(b.dp_rank, Some(2));
        let ev = events(&b, &p);
        assert_eq!(ev[0].op, EventOp::Stored);
        assert_eq!(ev[0].parent, Some(EngineHash(9)));
        assert_eq!(ev[0].lora_name, Some("sql"));
        assert_eq!(ev[1].op, EventOp::Removed);
        assert_eq!(ev[2].op, EventOp::Cleared);
    }

    #[test]
    fn positional_batch_with_map_events() {
        let (b, p) = decoded("w2d1_s0_store");
        assert_eq!(b.dp_rank, Some(1));
        assert_eq!(
            events(&b, &p)[0].hashes,
            &[EngineHash(301), EngineHash(302)]
        );
    }

    #[test]
    fn sglang_short_stored_and_attn_dp_rank() {
        let (b, p) = decoded("sglang_array");
        assert_eq!(b.dp_rank, Some(1));
        let ev = events(&b, &p);
        assert_eq!(ev[0].hashes.len(), 2);
        assert_eq!(ev[0].block_size, Some(4));
        assert_eq!(ev[0].medium, None);
    }

    fn reject(bytes: &[u8]) -> WireError {
        let mut b = Batch::default();
        let e = decode(bytes, &mut b).expect_err("must be rejected");
        assert!(
            b.events.is_empty(),
            "a rejected frame leaves nothing behind"
        );
        e
    }

    #[test]
    fn malformed_frames_are_rejected_whole() {
        let good = fixture("vllm_array_full");
        // Every truncation of a valid frame is an error, never a panic.
        for cut in 0..good.len() {
            let _ = reject(&good[..cut]);
        }
        // Unknown tag.
        let mut unknown = good.clone();
        let pos = unknown
            .windows(11)
            .position(|w| w == b"BlockStored")
            .unwrap();
        unknown[pos..pos + 11].copy_from_slice(b"BlockStorex");
        assert!(matches!(reject(&unknown), WireError::UnknownTag(_)));
        // Wrong type: a string where token ids belong.
        let bad = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0xab]
            .iter()
            .copied()
            .chain(*b"BlockStored")
            .chain([0x91, 0x01, 0xc0, 0xa1, b'x'])
            .collect::<Vec<u8>>();
        assert_eq!(
            reject(&bad),
            WireError::Type {
                field: "token_ids",
                expected: "array"
            }
        );
        // A huge declared array with no bytes behind it.
        assert_eq!(
            reject(&[0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff]),
            WireError::Truncated
        );
        // Token count that does not match the declared block size.
        let mismatch = [0x92, 0x00, 0x91, 0x95, 0xab]
            .iter()
            .copied()
            .chain(*b"BlockStored")
            .chain([0x91, 0x01, 0xc0, 0x93, 1, 2, 3, 0x04])
            .collect::<Vec<u8>>();
        assert!(matches!(reject(&mismatch), WireError::TokenCount { .. }));
        // Trailing garbage after a complete batch.
        let mut trailing = good.clone();
        trailing.push(0xc0);
        assert_eq!(reject(&trailing), WireError::Trailing);
        // Not a batch at all.
        assert!(matches!(reject(b"\xa5hello"), WireError::Type { .. }));
        // Deep nesting in a skipped tail field.
        let mut deep = vec![0x92, 0x00, 0x91, 0x99, 0xab];
        deep.extend_from_slice(b"BlockStored");
        deep.extend_from_slice(&[0x90, 0xc0, 0x90, 0x04, 0xc0, 0xc0, 0xc0]);
        deep.extend(std::iter::repeat_n(0x91, 100));
        deep.push(0xc0);
        assert_eq!(reject(&deep), WireError::TooDeep);
    }
}
