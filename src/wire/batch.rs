//! The batch envelope and per-event dialect dispatch; the field readers the
//! dialects share are in [`super::fields`].
//!
//! Every length comes from an untrusted frame, so nothing here reserves
//! capacity from a declared length: arrays are refused when their declared
//! length exceeds the bytes left (see [`Cursor::array`]) and then grown one
//! pushed value at a time. A frame is decoded whole before anything is
//! returned, so a bad event rejects the frame, not half of it.

use super::fields::{Mark, unknown_tag};
use super::msgpack::{Class, Cursor};
use super::{Batch, EventRec, WireError};

/// Decode one payload into `out` (cleared first). On error `out` is left empty.
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

/// `[ts, [events], dp_rank, ...tail]`, or the legacy Mooncake `[[events]]`.
fn batch_array(c: &mut Cursor<'_>, out: &mut Batch) -> Result<(), WireError> {
    let n = c.array("batch")?;
    if n == 1 && c.peek_class()? == Class::Array {
        return events(c, out);
    }
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
            b"ts" | b"timestamp" => {
                if !c.nil()? {
                    out.ts = c.float("ts")?;
                }
            }
            b"events" => {
                if saw_events {
                    return Err(WireError::Type {
                        field: "events",
                        expected: "a single events list",
                    });
                }
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
        let mark = Mark::of(out);
        let ev = match c.peek_class()? {
            Class::Map => super::map::event(c, out)?,
            Class::Array => event_array(c, out)?,
            _ => {
                return Err(WireError::Type {
                    field: "event",
                    expected: "array or map",
                });
            }
        };
        match ev {
            Some(ev) => out.events.push(ev),
            None => {
                // A dropped event leaves nothing behind in the shared arrays.
                mark.rewind(out);
                out.ignored = out.ignored.saturating_add(1);
            }
        }
    }
    Ok(())
}

/// A tagged positional event: the tag picks the dialect.
fn event_array(c: &mut Cursor<'_>, out: &mut Batch) -> Result<Option<EventRec>, WireError> {
    let n = c.array("event")?;
    if n == 0 {
        return Err(WireError::Missing { field: "type" });
    }
    let r = c.str("type")?;
    let tag = c.slice(r);
    if let Some(op) = super::vllm::tag_op(tag) {
        super::vllm::event_array(c, out, op, n - 1)
    } else if let Some(op) = super::mooncake::tag_op(tag) {
        super::mooncake::event_array(c, out, op, n - 1).map(Some)
    } else {
        Err(unknown_tag(tag))
    }
}
