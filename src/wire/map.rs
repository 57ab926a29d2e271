//! Map-encoded events of every dialect, decoded by one reader.
//!
//! * vLLM / SGLang (msgspec `tag=True` without `array_like`): a `"type"` tag
//!   (`BlockStored`, ...) and the struct's field names. Current vLLM and SGLang
//!   publish exactly this inside a positional batch.
//! * Mooncake RFC #1527: an `"event_type"` of `stored` / `removed` / `cleared`
//!   with the standardized envelope (`event_id`, `timestamp`, `model_name`,
//!   `block_size`, `additional_salt`, `lora_name`, `tenant_id`, `backend_id`,
//!   `medium`, `dp_rank`) and payload (`seq_hashes`, `base_block_idx`,
//!   `parent_hash`, `token_ids`, `object_key`). The Mooncake master also writes
//!   legacy aliases into the same map (`type`, `block_hashes`,
//!   `parent_block_hash`): when `event_type` is present it wins, and the
//!   aliases never add hashes to `seq_hashes` (an alias list read before
//!   `seq_hashes` is dropped again). With no hashes at all, an `object_key`
//!   that is a decimal or `0x` hex `u64` is the event's one seq hash.
//! * Legacy Mooncake in map form: `"type"` = `BlockStoreEvent` /
//!   `BlockUpdateEvent` / `RemoveAllEvent` with the positional field names
//!   (`ts`, `mooncake_key`, `addr_list`|`replicas`, `block_hash`,
//!   `parent_block_hash`, `token_id`|`token_ids`, `block_size`, `model_name`,
//!   `lora_name`, `lora_id`).
//!
//! Unknown keys are skipped, in every dialect.

use super::fields::{
    check_stored, check_stored_optional_tokens, extra_keys, group_kind, hashes, lenient_str,
    lenient_u32, lenient_window, lora_id, numeric_key, opt_hash, opt_u64, seconds_ms, text, tokens,
    unknown_tag,
};
use super::msgpack::{Class, Cursor};
use super::{Batch, Dialect, EventOp, EventRec, HashKind, WireError};
use crate::types::EngineHash;
use std::ops::Range;

fn rfc_op(s: &[u8]) -> Option<EventOp> {
    const OPS: [(&[u8], EventOp); 3] = [
        (b"stored", EventOp::Stored),
        (b"removed", EventOp::Removed),
        (b"cleared", EventOp::Cleared),
    ];
    OPS.iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(s))
        .map(|&(_, op)| op)
}

/// What a map event's keys said beyond its [`EventRec`] fields, resolved once every
/// key is read (the keys come in any order).
#[derive(Default)]
struct Keys {
    event_type: Option<EventOp>,
    type_tag: Option<Range<usize>>,
    /// Hash lists: the standardized one and the legacy alias, kept apart.
    seq: Option<Range<usize>>,
    alias: Option<Range<usize>>,
    parent_seq: Option<EngineHash>,
    parent_alias: Option<EngineHash>,
    saw_tokens: bool,
    group: Option<u32>,
    spec_kind: Option<Range<usize>>,
    window: Option<u32>,
}

/// One map event. `Ok(None)`: an auxiliary KV-cache group's event, dropped.
pub(super) fn event(c: &mut Cursor<'_>, out: &mut Batch) -> Result<Option<EventRec>, WireError> {
    let n = c.map("event")?;
    let mut ev = EventRec::empty(EventOp::Stored, out);
    let mut keys = Keys::default();
    for _ in 0..n {
        let key = c.str("event key")?;
        read_value(c, out, &mut ev, &mut keys, key)?;
    }
    let (op, dialect) = operation(c, &keys)?;
    ev.op = op;
    ev.dialect = dialect;
    choose_hashes(&mut ev, &keys);
    let kind = if ev.dialect == Dialect::Engine {
        group_kind(op, keys.group, keys.spec_kind.clone().map(|r| c.slice(r)))
    } else {
        Some(super::GroupKind::Full)
    };
    let Some(kind) = kind else {
        return Ok(None);
    };
    ev.group_kind = kind;
    check(c, out, &mut ev, &keys)?;
    (ev.group_idx, ev.group_window) = (keys.group, keys.window);
    Ok(Some(ev))
}

/// Read the value of `key` into `ev` or `keys`; unknown keys are skipped.
fn read_value(
    c: &mut Cursor<'_>,
    out: &mut Batch,
    ev: &mut EventRec,
    keys: &mut Keys,
    key: Range<usize>,
) -> Result<(), WireError> {
    match c.slice(key) {
        b"event_type" => {
            let r = c.str("event_type")?;
            let s = c.slice(r);
            keys.event_type = Some(rfc_op(s).ok_or_else(|| unknown_tag(s))?);
        }
        // Resolved at the end: `event_type`, if any, wins over it.
        b"type" => {
            if !c.nil()? {
                keys.type_tag = Some(c.str("type")?);
            }
        }
        b"seq_hashes" if c.nil()? => {}
        b"seq_hashes" => {
            // Drop an alias list read just before, so hashes never double.
            if let Some(a) = keys.alias.take()
                && a.end == out.hashes.len()
            {
                out.hashes.truncate(a.start);
            }
            keys.seq = Some(hashes(c, out, "seq_hashes")?);
        }
        b"block_hashes" if c.nil()? => {}
        b"block_hashes" if keys.seq.is_none() => keys.alias = Some(hashes(c, out, "block_hashes")?),
        b"block_hash" if keys.seq.is_none() => {
            let start = out.hashes.len();
            if let Some(h) = opt_hash(c, "block_hash")? {
                out.hashes.push(h);
            }
            keys.alias = Some(start..out.hashes.len());
        }
        b"block_hashes" | b"block_hash" => c.skip()?,
        b"parent_hash" => keys.parent_seq = opt_hash(c, "parent_hash")?,
        b"parent_block_hash" => keys.parent_alias = opt_hash(c, "parent_block_hash")?,
        b"token_ids" | b"token_id" if c.nil()? => {}
        b"token_ids" | b"token_id" => {
            (ev.tokens, ev.bigram_tokens) = tokens(c, out, "token_ids")?;
            keys.saw_tokens = true;
        }
        b"block_size" => ev.block_size = c.opt_u32("block_size")?,
        b"lora_id" => ev.lora_id = lora_id(c)?,
        b"medium" => ev.medium = text(c, "medium")?,
        b"lora_name" => ev.lora_name = text(c, "lora_name")?,
        b"cache_salt" => ev.cache_salt = text(c, "cache_salt")?,
        b"extra_keys" => extra_keys(c, out, ev)?,
        b"additional_salt" => ev.additional_salt = text(c, "additional_salt")?,
        b"model_name" | b"model" => ev.model_name = text(c, "model_name")?,
        b"tenant_id" => ev.tenant_id = text(c, "tenant_id")?,
        b"backend_id" => ev.backend_id = text(c, "backend_id")?,
        b"object_key" | b"mooncake_key" => ev.object_key = text(c, "object_key")?,
        b"event_id" => ev.event_id = opt_u64(c, "event_id")?,
        b"timestamp" => {
            // RFC #1527: integer Unix ms; a float is taken as seconds.
            ev.timestamp_ms = match c.peek_class()? {
                Class::Float => seconds_ms(c, "timestamp")?,
                _ => opt_u64(c, "timestamp")?,
            };
        }
        b"ts" => ev.timestamp_ms = seconds_ms(c, "ts")?,
        b"dp_rank" | b"data_parallel_rank" | b"attn_dp_rank" => {
            ev.dp_rank = c.opt_u32("dp_rank")?
        }
        b"base_block_idx" => ev.base_block_idx = c.opt_u32("base_block_idx")?,
        b"group_idx" => keys.group = lenient_u32(c)?,
        b"kv_cache_spec_kind" => keys.spec_kind = lenient_str(c)?,
        b"kv_cache_spec_sliding_window" => keys.window = lenient_window(c)?,
        b"addr_list" | b"replicas" => ev.replicas = super::mooncake::replicas(c, out)?,
        _ => c.skip()?,
    }
    Ok(())
}

/// Which dialect, which operation: `event_type` wins over a `type` tag.
fn operation(c: &Cursor<'_>, keys: &Keys) -> Result<(EventOp, Dialect), WireError> {
    let tag = keys.type_tag.clone().map(|r| c.slice(r));
    match (keys.event_type, tag) {
        (Some(op), _) => Ok((op, Dialect::Rfc1527)),
        (None, Some(t)) => {
            if let Some(op) = super::vllm::tag_op(t) {
                Ok((op, Dialect::Engine))
            } else if let Some(op) = super::mooncake::tag_op(t) {
                Ok((op, Dialect::MooncakeLegacy))
            } else {
                Err(unknown_tag(t))
            }
        }
        (None, None) => Err(WireError::Missing { field: "type" }),
    }
}

/// Which hashes (and which parent) the event names: the standardized ones, or the
/// legacy alias.
fn choose_hashes(ev: &mut EventRec, keys: &Keys) {
    ev.hash_kind = if keys.seq.is_some() || ev.dialect == Dialect::Rfc1527 {
        HashKind::Seq
    } else {
        HashKind::Engine
    };
    if let Some(r) = keys.seq.clone().or(keys.alias.clone()) {
        ev.hashes = r;
    }
    ev.parent = if ev.hash_kind == HashKind::Seq {
        keys.parent_seq.or(keys.parent_alias)
    } else {
        keys.parent_alias.or(keys.parent_seq)
    };
}

/// What each dialect requires of its events (and its defaults that mean unset).
fn check(c: &Cursor<'_>, out: &mut Batch, ev: &mut EventRec, keys: &Keys) -> Result<(), WireError> {
    let saw_hashes = keys.seq.is_some() || keys.alias.is_some();
    match ev.dialect {
        Dialect::Engine => match ev.op {
            EventOp::Stored if !saw_hashes => Err(WireError::Missing {
                field: "block_hashes",
            }),
            EventOp::Stored if !keys.saw_tokens => Err(WireError::Missing { field: "token_ids" }),
            EventOp::Stored => check_stored(ev),
            EventOp::Removed if !saw_hashes => Err(WireError::Missing {
                field: "block_hashes",
            }),
            _ => Ok(()),
        },
        Dialect::Rfc1527 => {
            if matches!(ev.op, EventOp::Stored | EventOp::Removed) {
                if ev.hashes.is_empty() {
                    // An object key holding the seq hash stands for `seq_hashes: [h]`.
                    if let Some(h) = ev.object_key.clone().and_then(|k| numeric_key(c.slice(k))) {
                        let start = out.hashes.len();
                        out.hashes.push(EngineHash(h));
                        ev.hashes = start..start + 1;
                    } else if !saw_hashes && ev.object_key.is_none() {
                        return Err(WireError::Missing {
                            field: "seq_hashes",
                        });
                    }
                }
                check_stored_optional_tokens(ev)?;
            }
            Ok(())
        }
        Dialect::MooncakeLegacy => {
            if matches!(ev.op, EventOp::Stored | EventOp::Updated) && ev.object_key.is_none() {
                return Err(WireError::Missing {
                    field: "mooncake_key",
                });
            }
            // C++ defaults: "" and 0 mean unset.
            ev.block_size = ev.block_size.filter(|&b| b != 0);
            ev.parent = ev.parent.filter(|p| p.0 != 0);
            ev.lora_name = ev.lora_name.take().filter(|r| !r.is_empty());
            ev.model_name = ev.model_name.take().filter(|r| !r.is_empty());
            check_stored_optional_tokens(ev)
        }
    }
}
