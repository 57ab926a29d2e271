//! The field readers the dialects share (and the batch envelope uses): hashes,
//! token ids, text, lenient numbers, event checks, vLLM's `extra_keys`.
//!
//! Every length comes from an untrusted frame, so nothing here reserves capacity
//! from a declared length: arrays are refused when their declared length exceeds
//! the bytes left (see [`Cursor::array`]) and then grown one pushed value at a time.
//! Knows no dialect: the dialects call in, never the other way.

use super::msgpack::{Class, Cursor, Int};
use super::{Batch, EventRec, GroupKind, WireError};
use crate::types::EngineHash;
use std::ops::Range;

/// An event tag kvix does not know. The error names it only when it reads as an
/// identifier (a newer engine's event kind is worth seeing); any other bytes are
/// the publisher's payload and are described by their length alone.
pub(super) fn unknown_tag(tag: &[u8]) -> WireError {
    let identifier = (1..=32).contains(&tag.len())
        && tag.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    WireError::UnknownTag(if identifier {
        format!("`{}`", String::from_utf8_lossy(tag))
    } else {
        format!("of {} bytes, not an identifier", tag.len())
    })
}

/// Array lengths of a batch before one event, to drop that event's values.
#[derive(Clone, Copy)]
pub(super) struct Mark {
    hashes: usize,
    tokens: usize,
    replicas: usize,
}

impl Mark {
    pub(super) fn of(out: &Batch) -> Mark {
        Mark {
            hashes: out.hashes.len(),
            tokens: out.tokens.len(),
            replicas: out.replicas.len(),
        }
    }

    pub(super) fn rewind(self, out: &mut Batch) {
        out.hashes.truncate(self.hashes);
        out.tokens.truncate(self.tokens);
        out.replicas.truncate(self.replicas);
    }
}

/// Positional fields still unread in one array-encoded event.
pub(super) struct Fields {
    left: usize,
}

impl Fields {
    pub(super) fn new(left: usize) -> Self {
        Fields { left }
    }

    /// Whether another field follows; `Missing` if a required one does not.
    pub(super) fn next(&mut self, required: bool, field: &'static str) -> Result<bool, WireError> {
        if self.left == 0 {
            return if required {
                Err(WireError::Missing { field })
            } else {
                Ok(false)
            };
        }
        self.left -= 1;
        Ok(true)
    }

    /// Skip the fields nobody reads (newer tail fields are tolerated).
    pub(super) fn skip_rest(&mut self, c: &mut Cursor<'_>) -> Result<(), WireError> {
        for _ in 0..self.left {
            c.skip()?;
        }
        self.left = 0;
        Ok(())
    }
}

/// Parse a hash written as text: decimal, or `0x` hex. Longer hex (a digest,
/// with or without `0x`) keeps its last 16 digits, i.e. the last 8 bytes
/// big-endian, as for binary hashes. `None` if it is neither.
pub(super) fn hash_text(s: &[u8]) -> Option<u64> {
    if let Some(v) = numeric_key(s) {
        return Some(v);
    }
    let hex = s
        .strip_prefix(b"0x")
        .or_else(|| s.strip_prefix(b"0X"))
        .unwrap_or(s);
    if hex.len() > 16 && hex.iter().all(u8::is_ascii_hexdigit) {
        return parse_hex(&hex[hex.len() - 16..]);
    }
    None
}

/// A Mooncake object key that encodes a `u64` seq hash: decimal, or `0x` hex
/// of at most 16 digits. Anything else is an opaque key.
pub(super) fn numeric_key(s: &[u8]) -> Option<u64> {
    if let Some(hex) = s.strip_prefix(b"0x").or_else(|| s.strip_prefix(b"0X")) {
        return if hex.len() <= 16 {
            parse_hex(hex)
        } else {
            None
        };
    }
    if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add((d - b'0') as u64)
    })
}

fn parse_hex(h: &[u8]) -> Option<u64> {
    if h.is_empty() || h.len() > 16 {
        return None;
    }
    h.iter().try_fold(0u64, |acc, d| {
        let v = (*d as char).to_digit(16)? as u64;
        Some((acc << 4) | v)
    })
}

/// A block hash: an integer (signed values keep their bits), bytes (vLLM's
/// sha256 digests: the last 8 bytes big-endian, as vLLM's own int conversion
/// does) or text (Mooncake: decimal / `0x` hex, see [`hash_text`]).
/// `Ok(None)` for nil and for the empty string (Mooncake's "unset").
pub(super) fn opt_hash(
    c: &mut Cursor<'_>,
    field: &'static str,
) -> Result<Option<EngineHash>, WireError> {
    match c.peek_class()? {
        Class::Nil => {
            c.nil()?;
            Ok(None)
        }
        Class::Bin => {
            let r = c.bytes_or_str(field)?;
            let b = c.slice(r);
            let tail = &b[b.len().saturating_sub(8)..];
            Ok(Some(EngineHash(
                tail.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64),
            )))
        }
        Class::Str => {
            let r = c.str(field)?;
            let s = c.slice(r);
            if s.is_empty() {
                return Ok(None);
            }
            hash_text(s)
                .map(|h| Some(EngineHash(h)))
                .ok_or(WireError::Type {
                    field,
                    expected: "hash (integer, bytes, decimal or hex text)",
                })
        }
        _ => c.int(field).map(|i| Some(EngineHash(i.bits()))),
    }
}

pub(super) fn hash(c: &mut Cursor<'_>, field: &'static str) -> Result<EngineHash, WireError> {
    opt_hash(c, field)?.ok_or(WireError::Type {
        field,
        expected: "hash (integer, bytes, decimal or hex text)",
    })
}

pub(super) fn hashes(
    c: &mut Cursor<'_>,
    out: &mut Batch,
    field: &'static str,
) -> Result<Range<usize>, WireError> {
    let n = c.array(field)?;
    let start = out.hashes.len();
    for _ in 0..n {
        let h = match c.word64() {
            Some(bits) => EngineHash(bits),
            None => hash(c, field)?,
        };
        out.hashes.push(h);
    }
    Ok(start..out.hashes.len())
}

/// Token ids, flat `[t, ...]` or as `(token, next_token)` pairs (EAGLE,
/// SGLang DSv4), whose first elements are kept. Returns the range and
/// whether the ids were pairs; mixing both forms is rejected.
pub(super) fn tokens(
    c: &mut Cursor<'_>,
    out: &mut Batch,
    field: &'static str,
) -> Result<(Range<usize>, bool), WireError> {
    let n = c.array(field)?;
    let start = out.tokens.len();
    if n > 0 && c.peek_class()? != Class::Array {
        // The common case, flat ids: one tight loop (every id takes at least a byte,
        // so a lying length runs out of input instead of memory).
        if n > c.remaining() {
            return Err(WireError::Truncated);
        }
        c.tokens_into(n, &mut out.tokens, field)?;
        return Ok((start..out.tokens.len(), false));
    }
    let mut bigram = None;
    for _ in 0..n {
        let pair = c.peek_class()? == Class::Array;
        if *bigram.get_or_insert(pair) != pair {
            return Err(WireError::Type {
                field,
                expected: "all integers or all (token, next_token) pairs",
            });
        }
        if pair {
            if c.array(field)? != 2 {
                return Err(WireError::Type {
                    field,
                    expected: "(token, next_token) pair",
                });
            }
            let t = c.u32(field)?;
            c.u32(field)?;
            out.tokens.push(t);
        } else {
            let t = c.u32(field)?;
            out.tokens.push(t);
        }
    }
    Ok((start..out.tokens.len(), bigram.unwrap_or(false)))
}

/// An optional string, validated as UTF-8.
pub(super) fn text(
    c: &mut Cursor<'_>,
    field: &'static str,
) -> Result<Option<Range<usize>>, WireError> {
    let r = c.opt_str(field)?;
    if let Some(r) = &r {
        std::str::from_utf8(c.slice(r.clone())).map_err(|_| WireError::Type {
            field,
            expected: "UTF-8 string",
        })?;
    }
    Ok(r)
}

/// Like [`text`], but the empty string (C++ "unset") reads as `None`.
pub(super) fn text_nonempty(
    c: &mut Cursor<'_>,
    field: &'static str,
) -> Result<Option<Range<usize>>, WireError> {
    Ok(text(c, field)?.filter(|r| !r.is_empty()))
}

pub(super) fn lora_id(c: &mut Cursor<'_>) -> Result<Option<i64>, WireError> {
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

pub(super) fn opt_u64(c: &mut Cursor<'_>, field: &'static str) -> Result<Option<u64>, WireError> {
    if c.nil()? {
        return Ok(None);
    }
    match c.int(field)? {
        Int::U(u) => Ok(Some(u)),
        Int::I(i) => u64::try_from(i)
            .map(Some)
            .map_err(|_| WireError::Range { field }),
    }
}

/// Seconds (float or integer) as Unix milliseconds; `None` for nil or a
/// value that is not a finite, non-negative time.
pub(super) fn seconds_ms(
    c: &mut Cursor<'_>,
    field: &'static str,
) -> Result<Option<u64>, WireError> {
    if c.nil()? {
        return Ok(None);
    }
    let s = c.float(field)?;
    Ok((0.0..1.0e16).contains(&s).then_some((s * 1000.0) as u64))
}

/// A tolerated tail field that should be a small integer (`group_idx`):
/// nil or any other type reads as `None` and is skipped.
pub(super) fn lenient_u32(c: &mut Cursor<'_>) -> Result<Option<u32>, WireError> {
    if c.peek_class()? == Class::Int {
        return Ok(u32::try_from(c.int("group_idx")?.bits()).ok());
    }
    c.skip()?;
    Ok(None)
}

/// A tolerated tail field that should be a string (`kv_cache_spec_kind`).
pub(super) fn lenient_str(c: &mut Cursor<'_>) -> Result<Option<Range<usize>>, WireError> {
    if c.peek_class()? == Class::Str {
        return c.str("kv_cache_spec_kind").map(Some);
    }
    c.skip()?;
    Ok(None)
}

/// What vLLM's KV-cache group fields make of an event: its group kind, or `None`
/// for an event to drop (a kind kvix has no hit rule for, or a store of a group
/// other than 0 that names no kind, as Dynamo drops it). A removal names only
/// its group: it is [`GroupKind::Named`], resolved by what the group's stores
/// said.
pub(super) fn group_kind(
    op: super::EventOp,
    group_idx: Option<u32>,
    spec_kind: Option<&[u8]>,
) -> Option<GroupKind> {
    if let Some(kind) = spec_kind {
        return GroupKind::of_spec(kind);
    }
    match (op, group_idx) {
        (_, None) => Some(GroupKind::Full),
        (super::EventOp::Removed, Some(_)) => Some(GroupKind::Named),
        (_, Some(0)) => Some(GroupKind::Full),
        _ => None,
    }
}

/// A tolerated tail field that should be a token count (`kv_cache_spec_sliding_window`).
pub(super) fn lenient_window(c: &mut Cursor<'_>) -> Result<Option<u32>, WireError> {
    if c.peek_class()? == Class::Int {
        return Ok(u32::try_from(c.int("kv_cache_spec_sliding_window")?.bits()).ok());
    }
    c.skip()?;
    Ok(None)
}

/// vLLM/SGLang strictness: with a block size, tokens must fill the blocks exactly.
/// A store of a sliding-window or Mamba group may name fewer blocks than its
/// tokens fill (vLLM leaves out the blocks it keeps no state for), never more.
pub(super) fn check_stored(ev: &EventRec) -> Result<(), WireError> {
    if let Some(bs) = ev.block_size {
        let blocks = ev.hashes.len();
        let sparse = ev.group_kind != GroupKind::Full;
        let ok = bs != 0
            && if sparse {
                ev.tokens.len().is_multiple_of(bs as usize)
                    && ev.tokens.len() >= blocks * bs as usize
            } else {
                ev.tokens.len() == blocks * bs as usize
            };
        if !ok {
            return Err(WireError::TokenCount {
                tokens: ev.tokens.len(),
                blocks,
                block_size: bs as usize,
            });
        }
    }
    Ok(())
}

/// Mooncake strictness: tokens are optional; when present with a block size
/// they must fill whole blocks, and match the hash count when there are hashes.
pub(super) fn check_stored_optional_tokens(ev: &EventRec) -> Result<(), WireError> {
    let (tokens, blocks) = (ev.tokens.len(), ev.hashes.len());
    if tokens == 0 {
        return Ok(());
    }
    if let Some(bs) = ev.block_size {
        let bsz = bs as usize;
        let ok = bsz != 0 && tokens % bsz == 0 && (blocks == 0 || tokens == blocks * bsz);
        if !ok {
            return Err(WireError::TokenCount {
                tokens,
                blocks,
                block_size: bsz,
            });
        }
    }
    Ok(())
}

/// Prefix Dynamo puts on a cache salt it passes through vLLM's `extra_keys`.
const CACHE_SALT_PREFIX: &[u8] = b"dynamo-cache-salt:";

/// A multimodal hash in `extra_keys` marker form, as Dynamo's frontend issues
/// it: 16 hex digits followed by 48 zeros. Native 64-digit vLLM hashes (and
/// LoRA names, salts) are not routing hashes and are left alone, as Dynamo does.
fn mm_marker(s: &[u8]) -> Option<u64> {
    if s.len() != 64
        || !s[..16].iter().all(u8::is_ascii_hexdigit)
        || !s[16..].iter().all(|&b| b == b'0')
    {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(&s[..16]).ok()?, 16).ok()
}

/// vLLM `extra_keys`: nil, or one entry per block, each nil or a list of keys
/// (strings, `[string, offset]` pairs, bytes, numbers). Multimodal markers go to
/// [`Batch::mm`] as (block, hash); a tagged cache salt in the first block's keys
/// becomes the event's `cache_salt` when it has none of its own.
pub(super) fn extra_keys(
    c: &mut Cursor<'_>,
    out: &mut Batch,
    ev: &mut EventRec,
) -> Result<(), WireError> {
    let start = out.mm.len();
    if c.nil()? {
        ev.mm = start..start;
        return Ok(());
    }
    let blocks = c.array("extra_keys")?;
    for block in 0..blocks {
        if c.nil()? {
            continue;
        }
        let keys = c.array("extra_keys")?;
        for _ in 0..keys {
            let s = match c.peek_class()? {
                Class::Str => Some(c.str("extra_keys")?),
                Class::Array => {
                    // `[hash, start_offset]` (vLLM 0.19+).
                    let n = c.array("extra_keys")?;
                    let mut s = None;
                    for i in 0..n {
                        if i == 0 && c.peek_class()? == Class::Str {
                            s = Some(c.str("extra_keys")?);
                        } else {
                            c.skip()?;
                        }
                    }
                    s
                }
                _ => {
                    c.skip()?;
                    None
                }
            };
            let Some(r) = s else { continue };
            let bytes = c.slice(r.clone());
            if let Some(h) = mm_marker(bytes) {
                out.mm.push((block as u32, h));
            } else if block == 0
                && ev.cache_salt.is_none()
                && bytes.starts_with(CACHE_SALT_PREFIX)
                && bytes.len() > CACHE_SALT_PREFIX.len()
                && std::str::from_utf8(bytes).is_ok()
            {
                ev.cache_salt = Some(r.start + CACHE_SALT_PREFIX.len()..r.end);
            }
        }
    }
    ev.mm = start..out.mm.len();
    Ok(())
}
