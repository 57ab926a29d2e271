//! Legacy Mooncake Store events (before RFC #1527), positional.
//!
//! Two layouts are in the wild; the type of the field after the tag tells them apart.
//!
//! * Conductor indexer spec, field 1 a number (the timestamp):
//!   `["BlockStoreEvent", ts, mooncake_key, [addr, ...], block_hash,
//!   parent_block_hash, [token_id, ...], block_size, model_name, lora_name,
//!   lora_id]`, `["BlockUpdateEvent", ts, mooncake_key, [addr, ...]]`,
//!   `["RemoveAllEvent"]`. Hashes are `u64`.
//! * Mooncake Store's publisher (`mooncake_event_subscriber_guide.md`), field 1
//!   a string (the key): `["BlockStoreEvent", mooncake_key, [[type, location],
//!   ...], model_name, block_size, block_hash, parent_block_hash, token_ids]`,
//!   `["BlockUpdateEvent", mooncake_key, [[type, location], ...]]`. Hashes are
//!   text (`"0x41234125"`, `""` = unset).
//!
//! Mapping: `block_hash` → the event's one hash ([`HashKind::Engine`]: the
//! engine's block hash, passed through by the store connector), `token_id` →
//! tokens, `mooncake_key` → `object_key`, the address list → `replicas`.
//! C++ defaults mean "unset": `0`/`""` hashes, `block_size` 0, empty
//! `model_name`/`lora_name` all decode as `None`. `BlockUpdateEvent` becomes
//! [`EventOp::Updated`] (kind `Stored`, no hashes): the object's replica set
//! changed, which the index may use to refresh its tiers but never to add or
//! remove blocks. Trailing fields are tolerated. Map forms are in [`super::map`].

use super::fields::{
    Fields, check_stored_optional_tokens, lora_id, opt_hash, seconds_ms, text, text_nonempty,
    tokens,
};
use super::msgpack::{Class, Cursor};
use super::{Batch, Dialect, EventOp, EventRec, HashKind, ReplicaRec, WireError};
use std::ops::Range;

/// The operation of a legacy Mooncake event tag.
pub(super) fn tag_op(tag: &[u8]) -> Option<EventOp> {
    match tag {
        b"BlockStoreEvent" => Some(EventOp::Stored),
        b"BlockUpdateEvent" => Some(EventOp::Updated),
        b"RemoveAllEvent" => Some(EventOp::Cleared),
        _ => None,
    }
}

/// A replica list: bare address strings or `[type, location]` pairs.
pub(super) fn replicas(c: &mut Cursor<'_>, out: &mut Batch) -> Result<Range<usize>, WireError> {
    let start = out.replicas.len();
    if c.nil()? {
        return Ok(start..start);
    }
    let n = c.array("addr_list")?;
    for _ in 0..n {
        let rec = if c.peek_class()? == Class::Array {
            if c.array("replica")? != 2 {
                return Err(WireError::Type {
                    field: "replica",
                    expected: "[type, location] pair",
                });
            }
            let kind = text(c, "replica type")?.ok_or(WireError::Type {
                field: "replica type",
                expected: "string",
            })?;
            let location = text(c, "replica location")?.ok_or(WireError::Type {
                field: "replica location",
                expected: "string",
            })?;
            ReplicaRec {
                kind: Some(kind),
                location,
            }
        } else {
            let location = text(c, "addr_list")?.ok_or(WireError::Type {
                field: "addr_list",
                expected: "string",
            })?;
            ReplicaRec {
                kind: None,
                location,
            }
        };
        out.replicas.push(rec);
    }
    Ok(start..out.replicas.len())
}

fn one_hash(c: &mut Cursor<'_>, out: &mut Batch) -> Result<Range<usize>, WireError> {
    let start = out.hashes.len();
    if let Some(h) = opt_hash(c, "block_hash")?.filter(|h| h.0 != 0) {
        out.hashes.push(h);
    }
    Ok(start..out.hashes.len())
}

fn key(c: &mut Cursor<'_>) -> Result<Range<usize>, WireError> {
    text(c, "mooncake_key")?.ok_or(WireError::Type {
        field: "mooncake_key",
        expected: "string",
    })
}

/// The fields after the tag of one positional legacy event (`left` of them).
pub(super) fn event_array(
    c: &mut Cursor<'_>,
    out: &mut Batch,
    op: EventOp,
    left: usize,
) -> Result<EventRec, WireError> {
    let mut ev = EventRec::empty(op, out);
    ev.dialect = Dialect::MooncakeLegacy;
    ev.hash_kind = HashKind::Engine;
    let mut f = Fields::new(left);
    if op == EventOp::Cleared {
        f.skip_rest(c)?;
        return Ok(ev);
    }
    // The conductor spec's layout starts with the timestamp; the store's own with the key.
    let seed_layout = left > 0 && c.peek_class()? != Class::Str;
    if seed_layout {
        f.next(true, "ts")?;
        ev.timestamp_ms = seconds_ms(c, "ts")?;
    }
    f.next(true, "mooncake_key")?;
    ev.object_key = Some(key(c)?);
    f.next(true, "addr_list")?;
    ev.replicas = replicas(c, out)?;
    if op == EventOp::Stored {
        if seed_layout {
            f.next(true, "block_hash")?;
            ev.hashes = one_hash(c, out)?;
            if f.next(false, "parent_block_hash")? {
                ev.parent = opt_hash(c, "parent_block_hash")?.filter(|h| h.0 != 0);
            }
            if f.next(false, "token_id")? {
                (ev.tokens, ev.bigram_tokens) = tokens(c, out, "token_id")?;
            }
            if f.next(false, "block_size")? {
                ev.block_size = c.opt_u32("block_size")?.filter(|&b| b != 0);
            }
            if f.next(false, "model_name")? {
                ev.model_name = text_nonempty(c, "model_name")?;
            }
            if f.next(false, "lora_name")? {
                ev.lora_name = text_nonempty(c, "lora_name")?;
            }
            if f.next(false, "lora_id")? {
                ev.lora_id = lora_id(c)?;
            }
        } else {
            if f.next(false, "model_name")? {
                ev.model_name = text_nonempty(c, "model_name")?;
            }
            if f.next(false, "block_size")? {
                ev.block_size = c.opt_u32("block_size")?.filter(|&b| b != 0);
            }
            if f.next(false, "block_hash")? {
                ev.hashes = one_hash(c, out)?;
            }
            if f.next(false, "parent_block_hash")? {
                ev.parent = opt_hash(c, "parent_block_hash")?.filter(|h| h.0 != 0);
            }
            if f.next(false, "token_ids")? {
                (ev.tokens, ev.bigram_tokens) = tokens(c, out, "token_ids")?;
            }
        }
        check_stored_optional_tokens(&ev)?;
    }
    f.skip_rest(c)?;
    Ok(ev)
}
