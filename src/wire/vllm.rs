//! vLLM / SGLang `KVEventBatch` decoding (msgspec msgpack).
//!
//! Accepts every encoding seen in the field: the batch as a positional array
//! `[ts, events, dp_rank, ...]` or as a map, and each event as a tagged array
//! `["BlockStored", hashes, parent, tokens, block_size, lora_id, medium,
//! lora_name, extra_keys, ...tail]` or as a map with a `"type"` tag. Unknown
//! trailing fields and unknown map keys are skipped. A frame is decoded whole
//! before anything is returned, so a bad event rejects the frame, not half of it.

use super::msgpack::{Cursor, Int};
use super::{Batch, EventKind, EventRec, WireError};
use crate::types::EngineHash;
use std::ops::Range;

/// Decode one payload into `out` (cleared first).
pub fn decode(payload: &[u8], out: &mut Batch) -> Result<(), WireError> {
    out.clear();
    let mut c = Cursor::new(payload);
    let result = if c.is_map()? {
        batch_map(&mut c, out)
    } else {
        batch_array(&mut c, out)
    };
    if let Err(e) = result {
        out.clear();
        return Err(e);
    }
    if c.remaining() != 0 {
        out.clear();
        return Err(WireError::Trailing);
    }
    Ok(())
}

fn batch_array(c: &mut Cursor<'_>, out: &mut Batch) -> Result<(), WireError> {
    let n = c.array("batch")?;
    if n < 2 {
        return Err(WireError::Missing { field: "events" });
    }
    out.ts = c.float("ts")?;
    events(c, out)?;
    if n >= 3 {
        out.dp_rank = c.opt_u32("data_parallel_rank")?;
    }
    for _ in 3..n {
        c.skip()?;
    }
    Ok(())
}

fn batch_map(c: &mut Cursor<'_>, out: &mut Batch) -> Result<(), WireError> {
    let n = c.map("batch")?;
    let mut saw_events = false;
    for _ in 0..n {
        let key = c.str("batch key")?;
        match c.slice(key) {
            b"ts" => out.ts = c.float("ts")?,
            b"events" => {
                events(c, out)?;
                saw_events = true;
            }
            b"data_parallel_rank" | b"attn_dp_rank" | b"dp_rank" => {
                if let Some(r) = c.opt_u32("data_parallel_rank")? {
                    out.dp_rank = Some(r);
                }
            }
            _ => c.skip()?,
        }
    }
    if !saw_events {
        return Err(WireError::Missing { field: "events" });
    }
    Ok(())
}

fn events(c: &mut Cursor<'_>, out: &mut Batch) -> Result<(), WireError> {
    let n = c.array("events")?;
    for _ in 0..n {
        let ev = if c.is_map()? {
            event_map(c, out)?
        } else {
            event_array(c, out)?
        };
        out.events.push(ev);
    }
    Ok(())
}

fn empty_event(kind: EventKind, out: &Batch) -> EventRec {
    EventRec {
        kind,
        hashes: out.hashes.len()..out.hashes.len(),
        parent: None,
        tokens: out.tokens.len()..out.tokens.len(),
        block_size: None,
        lora_id: None,
        medium: None,
        lora_name: None,
        cache_salt: None,
    }
}

fn tag(c: &mut Cursor<'_>) -> Result<EventKind, WireError> {
    let r = c.str("type")?;
    match c.slice(r) {
        b"BlockStored" => Ok(EventKind::Stored),
        b"BlockRemoved" => Ok(EventKind::Removed),
        b"AllBlocksCleared" => Ok(EventKind::Cleared),
        other => Err(WireError::UnknownTag(
            String::from_utf8_lossy(&other[..other.len().min(64)]).into_owned(),
        )),
    }
}

/// Engine block hash: an integer (signed values keep their bits) or bytes
/// (vLLM's sha256 digests; the last 8 bytes big-endian, as vLLM's own int conversion does).
fn hash(c: &mut Cursor<'_>, field: &'static str) -> Result<EngineHash, WireError> {
    if c.is_bin()? {
        let r = c.bytes_or_str(field)?;
        let b = c.slice(r);
        let tail = &b[b.len().saturating_sub(8)..];
        return Ok(EngineHash(
            tail.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64),
        ));
    }
    c.int(field).map(|i| EngineHash(i.bits()))
}

fn hashes(c: &mut Cursor<'_>, out: &mut Batch) -> Result<Range<usize>, WireError> {
    let n = c.array("block_hashes")?;
    let start = out.hashes.len();
    for _ in 0..n {
        let h = hash(c, "block_hashes")?;
        out.hashes.push(h);
    }
    Ok(start..out.hashes.len())
}

fn tokens(c: &mut Cursor<'_>, out: &mut Batch) -> Result<Range<usize>, WireError> {
    let n = c.array("token_ids")?;
    let start = out.tokens.len();
    for _ in 0..n {
        let t = c.u32("token_ids")?;
        out.tokens.push(t);
    }
    Ok(start..out.tokens.len())
}

fn text(c: &mut Cursor<'_>, field: &'static str) -> Result<Option<Range<usize>>, WireError> {
    let r = c.opt_str(field)?;
    if let Some(r) = &r {
        std::str::from_utf8(c.slice(r.clone())).map_err(|_| WireError::Type {
            field,
            expected: "UTF-8 string",
        })?;
    }
    Ok(r)
}

fn lora_id(c: &mut Cursor<'_>) -> Result<Option<i64>, WireError> {
    if c.nil()? {
        return Ok(None);
    }
    match c.int("lora_id")? {
        Int::I(i) => Ok(Some(i)),
        Int::U(u) => i64::try_from(u)
            .map(Some)
            .map_err(|_| WireError::Range { field: "lora_id" }),
    }
}

fn opt_parent(c: &mut Cursor<'_>) -> Result<Option<EngineHash>, WireError> {
    if c.nil()? {
        Ok(None)
    } else {
        hash(c, "parent_block_hash").map(Some)
    }
}

fn check_stored(ev: &EventRec) -> Result<(), WireError> {
    if let Some(bs) = ev.block_size {
        let blocks = ev.hashes.len();
        if bs == 0 || ev.tokens.len() != blocks * bs as usize {
            return Err(WireError::TokenCount {
                tokens: ev.tokens.len(),
                blocks,
                block_size: bs as usize,
            });
        }
    }
    Ok(())
}

fn event_array(c: &mut Cursor<'_>, out: &mut Batch) -> Result<EventRec, WireError> {
    let n = c.array("event")?;
    if n == 0 {
        return Err(WireError::Missing { field: "type" });
    }
    let kind = tag(c)?;
    let mut ev = empty_event(kind, out);
    // Fields still unread in this positional event.
    let mut left = n - 1;
    let mut has = |needed: bool, field: &'static str| -> Result<bool, WireError> {
        if left == 0 {
            return if needed {
                Err(WireError::Missing { field })
            } else {
                Ok(false)
            };
        }
        left -= 1;
        Ok(true)
    };
    match kind {
        EventKind::Stored => {
            has(true, "block_hashes")?;
            ev.hashes = hashes(c, out)?;
            has(true, "parent_block_hash")?;
            ev.parent = opt_parent(c)?;
            has(true, "token_ids")?;
            ev.tokens = tokens(c, out)?;
            if has(false, "block_size")? {
                ev.block_size = c.opt_u32("block_size")?;
            }
            if has(false, "lora_id")? {
                ev.lora_id = lora_id(c)?;
            }
            if has(false, "medium")? {
                ev.medium = text(c, "medium")?;
            }
            if has(false, "lora_name")? {
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
            check_stored(&ev)?;
        }
        EventKind::Removed => {
            has(true, "block_hashes")?;
            ev.hashes = hashes(c, out)?;
            if has(false, "medium")? {
                ev.medium = text(c, "medium")?;
            }
        }
        EventKind::Cleared => {}
    }
    // Newer tail fields (extra_keys, group index, cache-spec kind, ...) are tolerated.
    for _ in 0..left {
        c.skip()?;
    }
    Ok(ev)
}

fn event_map(c: &mut Cursor<'_>, out: &mut Batch) -> Result<EventRec, WireError> {
    let n = c.map("event")?;
    let mut kind = None;
    let mut ev = empty_event(EventKind::Cleared, out);
    let (mut saw_hashes, mut saw_tokens) = (false, false);
    for _ in 0..n {
        let key = c.str("event key")?;
        match c.slice(key) {
            b"type" => kind = Some(tag(c)?),
            b"block_hashes" => {
                ev.hashes = hashes(c, out)?;
                saw_hashes = true;
            }
            b"parent_block_hash" => ev.parent = opt_parent(c)?,
            b"token_ids" => {
                ev.tokens = tokens(c, out)?;
                saw_tokens = true;
            }
            b"block_size" => ev.block_size = c.opt_u32("block_size")?,
            b"lora_id" => ev.lora_id = lora_id(c)?,
            b"medium" => ev.medium = text(c, "medium")?,
            b"lora_name" => ev.lora_name = text(c, "lora_name")?,
            b"cache_salt" => ev.cache_salt = text(c, "cache_salt")?,
            _ => c.skip()?,
        }
    }
    ev.kind = kind.ok_or(WireError::Missing { field: "type" })?;
    match ev.kind {
        EventKind::Stored if !saw_hashes => {
            return Err(WireError::Missing {
                field: "block_hashes",
            });
        }
        EventKind::Stored if !saw_tokens => return Err(WireError::Missing { field: "token_ids" }),
        EventKind::Stored => check_stored(&ev)?,
        EventKind::Removed if !saw_hashes => {
            return Err(WireError::Missing {
                field: "block_hashes",
            });
        }
        _ => {}
    }
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Event;

    /// Payloads encoded by msgspec exactly as the engines encode them (scripts/gen_vllm_fixtures.py).
    pub fn fixture(name: &str) -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/wire_fixtures.json");
        let all: std::collections::HashMap<String, String> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let hex = &all[name];
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
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
        assert_eq!(ev[0].kind, EventKind::Stored);
        assert_eq!(ev[0].hashes, &[EngineHash(-5i64 as u64), EngineHash(u64::MAX)]);
        assert_eq!(ev[0].parent, None);
        assert_eq!(ev[0].tokens, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ev[0].block_size, Some(4));
        assert_eq!(ev[0].medium, Some("GPU"));
        assert_eq!(ev[0].lora_name, Some("my-lora"));
        assert_eq!(ev[1].kind, EventKind::Removed);
        assert_eq!(ev[1].hashes, &[EngineHash(-5i64 as u64)]);
        assert_eq!(ev[2].kind, EventKind::Cleared);
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
        assert_eq!(ev[0].hashes, &[EngineHash(u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31]))]);
        assert_eq!(ev[0].parent, Some(EngineHash(u64::from_be_bytes([25, 26, 27, 28, 29, 30, 31, 32]))));
        assert_eq!(ev[0].medium, Some("CPU"));
    }

    #[test]
    fn map_batch_and_map_events() {
        let (b, p) = decoded("vllm_map");
        assert_eq!(b.dp_rank, Some(2));
        let ev = events(&b, &p);
        assert_eq!(ev[0].kind, EventKind::Stored);
        assert_eq!(ev[0].parent, Some(EngineHash(9)));
        assert_eq!(ev[0].lora_name, Some("sql"));
        assert_eq!(ev[1].kind, EventKind::Removed);
        assert_eq!(ev[2].kind, EventKind::Cleared);
    }

    #[test]
    fn positional_batch_with_map_events() {
        let (b, p) = decoded("w2d1_s0_store");
        assert_eq!(b.dp_rank, Some(1));
        assert_eq!(events(&b, &p)[0].hashes, &[EngineHash(301), EngineHash(302)]);
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
        assert!(b.events.is_empty(), "a rejected frame leaves nothing behind");
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
        let pos = unknown.windows(11).position(|w| w == b"BlockStored").unwrap();
        unknown[pos..pos + 11].copy_from_slice(b"BlockStorex");
        assert!(matches!(reject(&unknown), WireError::UnknownTag(_)));
        // Wrong type: a string where token ids belong.
        let bad = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x94, 0xab]
            .iter()
            .copied()
            .chain(*b"BlockStored")
            .chain([0x91, 0x01, 0xc0, 0xa1, b'x'])
            .collect::<Vec<u8>>();
        assert_eq!(reject(&bad), WireError::Type { field: "token_ids", expected: "array" });
        // A huge declared array with no bytes behind it.
        assert_eq!(reject(&[0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff]), WireError::Truncated);
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
