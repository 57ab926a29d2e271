//! Replica sharing of the slot tracker, in Dynamo 1.6.1's wire format: each
//! `/add`, `/prefill_complete` and `/free` a replica applies is published on a
//! ZMQ PUB socket as two frames, the topic `dynamo.slot-tracker.v1` and a msgpack
//! named map (Dynamo's `ScopedReplicaEvent`); replicas subscribe to each other and
//! apply what they hear, so a router that talks to any replica sees every
//! router's bookings. Best effort, as Dynamo's: a full queue drops the event
//! (counted), a replica that was down misses what was said meanwhile (the TTL
//! bounds what that leaves behind).
//!
//! Owns the event, its encoding and decoding, and the two threads that hold the
//! sockets. The executors only `try_send` to them and `try_recv` from them:
//! they never wait on a socket or a thread.

use super::{Rank, SlotReq, TrackerKey};
use crate::types::{SeqHash, ShardId};
use crate::wire::WireError;
use crate::wire::msgpack::{Cursor, Int};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The topic frame of every event.
pub const TOPIC: &[u8] = b"dynamo.slot-tracker.v1";

/// Events queued for the publisher, and per shard for its executor, at most.
const QUEUE: usize = 100_000;

/// One lifecycle step of one request, as replicas tell each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub key: TrackerKey,
    pub block_size: u32,
    pub request_id: String,
    pub rank: Rank,
    pub step: Step,
    /// The replica that made it (its own events are not applied again).
    pub router_id: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Add {
        path: Vec<SeqHash>,
        new_tokens: usize,
    },
    PrefillComplete,
    Free,
}

/// `event` as Dynamo's `rmp_serde::to_vec_named` writes a `ScopedReplicaEvent`.
pub fn encode(e: &Event) -> Vec<u8> {
    use rmp::encode::{
        write_array_len, write_bool, write_map_len, write_nil, write_str, write_u32, write_uint,
    };
    let mut b = Vec::with_capacity(128);
    // Writing to a Vec cannot fail.
    let _ = (|| -> Result<(), rmp::encode::ValueWriteError> {
        write_map_len(&mut b, 4)?;
        write_str(&mut b, "model_name")?;
        write_str(&mut b, &e.key.model_name)?;
        write_str(&mut b, "routing_group")?;
        write_str(&mut b, &e.key.routing_group)?;
        write_str(&mut b, "block_size")?;
        write_u32(&mut b, e.block_size)?;
        write_str(&mut b, "event")?;
        write_map_len(&mut b, 5)?;
        write_str(&mut b, "request_id")?;
        write_str(&mut b, &e.request_id)?;
        write_str(&mut b, "worker")?;
        write_map_len(&mut b, 2)?;
        write_str(&mut b, "worker_id")?;
        write_uint(&mut b, e.rank.worker_id)?;
        write_str(&mut b, "dp_rank")?;
        write_uint(&mut b, e.rank.dp_rank as u64)?;
        write_str(&mut b, "data")?;
        match &e.step {
            Step::Add { path, new_tokens } => {
                write_map_len(&mut b, 1)?;
                write_str(&mut b, "AddRequest")?;
                write_map_len(&mut b, 4)?;
                write_str(&mut b, "token_sequence")?;
                write_array_len(&mut b, path.len() as u32)?;
                for h in path {
                    write_uint(&mut b, h.0)?;
                }
                write_str(&mut b, "track_prefill_tokens")?;
                write_bool(&mut b, *new_tokens > 0)
                    .map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?;
                write_str(&mut b, "expected_output_tokens")?;
                write_nil(&mut b).map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?;
                write_str(&mut b, "prefill_load_hint")?;
                if *new_tokens > 0 {
                    write_map_len(&mut b, 2)?;
                    write_str(&mut b, "initial_effective_prefill_tokens")?;
                    write_uint(&mut b, *new_tokens as u64)?;
                    write_str(&mut b, "expected_prefill_duration")?;
                    write_nil(&mut b).map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?;
                } else {
                    write_nil(&mut b).map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?;
                }
            }
            Step::PrefillComplete => write_str(&mut b, "MarkPrefillCompleted")?,
            Step::Free => write_str(&mut b, "Free")?,
        }
        write_str(&mut b, "router_id")?;
        write_uint(&mut b, e.router_id)?;
        write_str(&mut b, "lora_name")?;
        write_nil(&mut b).map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?;
        Ok(())
    })();
    b
}

fn string(c: &mut Cursor, field: &'static str) -> Result<String, WireError> {
    let r = c.str(field)?;
    String::from_utf8(c.slice(r).to_vec()).map_err(|_| WireError::Type {
        field,
        expected: "UTF-8 string",
    })
}

fn uint(c: &mut Cursor, field: &'static str) -> Result<u64, WireError> {
    match c.int(field)? {
        Int::U(v) => Ok(v),
        Int::I(v) => u64::try_from(v).map_err(|_| WireError::Range { field }),
    }
}

fn boolean(c: &mut Cursor, field: &'static str) -> Result<bool, WireError> {
    use rmp::Marker;
    let v = match c.peek_marker()? {
        Marker::True => true,
        Marker::False => false,
        _ => {
            return Err(WireError::Type {
                field,
                expected: "bool",
            });
        }
    };
    c.skip()?;
    Ok(v)
}

/// Each (key, value) of a map; `f` reads the value of the keys it knows and
/// returns `false` for the others, which are skipped.
fn fields(
    c: &mut Cursor,
    field: &'static str,
    mut f: impl FnMut(&[u8], &mut Cursor) -> Result<bool, WireError>,
) -> Result<(), WireError> {
    for _ in 0..c.map(field)? {
        let k = c.str(field)?;
        let key = c.slice(k);
        if !f(key, c)? {
            c.skip()?;
        }
    }
    Ok(())
}

/// An event as Dynamo's replicas (and kvix's) publish it.
pub fn decode(buf: &[u8]) -> Result<Event, WireError> {
    let c = &mut Cursor::new(buf);
    let (mut model, mut group, mut block_size) = (None, None, None);
    let (mut request_id, mut rank, mut step, mut router_id) = (None, None, None, None);
    fields(c, "ScopedReplicaEvent", |k, c| {
        match k {
            b"model_name" => model = Some(string(c, "model_name")?),
            b"routing_group" => group = Some(string(c, "routing_group")?),
            b"block_size" => {
                block_size =
                    Some(
                        u32::try_from(uint(c, "block_size")?).map_err(|_| WireError::Range {
                            field: "block_size",
                        })?,
                    )
            }
            b"event" => fields(c, "event", |k, c| {
                match k {
                    b"request_id" => request_id = Some(string(c, "request_id")?),
                    b"worker" => rank = Some(worker(c)?),
                    b"data" => step = Some(data(c)?),
                    b"router_id" => router_id = Some(uint(c, "router_id")?),
                    _ => return Ok(false),
                }
                Ok(true)
            })?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let missing = |field| WireError::Missing { field };
    Ok(Event {
        key: TrackerKey {
            model_name: model.ok_or(missing("model_name"))?,
            routing_group: group.ok_or(missing("routing_group"))?,
        },
        block_size: block_size.ok_or(missing("block_size"))?,
        request_id: request_id.ok_or(missing("request_id"))?,
        rank: rank.ok_or(missing("worker"))?,
        step: step.ok_or(missing("data"))?,
        router_id: router_id.ok_or(missing("router_id"))?,
    })
}

fn worker(c: &mut Cursor) -> Result<Rank, WireError> {
    let (mut w, mut r) = (None, None);
    fields(c, "worker", |k, c| {
        match k {
            b"worker_id" => w = Some(uint(c, "worker_id")?),
            b"dp_rank" => {
                r = Some(
                    u32::try_from(uint(c, "dp_rank")?)
                        .map_err(|_| WireError::Range { field: "dp_rank" })?,
                )
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(Rank {
        worker_id: w.ok_or(WireError::Missing { field: "worker_id" })?,
        dp_rank: r.ok_or(WireError::Missing { field: "dp_rank" })?,
    })
}

fn data(c: &mut Cursor) -> Result<Step, WireError> {
    if !c.is_map()? {
        let tag = string(c, "data")?;
        return match tag.as_str() {
            "Free" => Ok(Step::Free),
            "MarkPrefillCompleted" => Ok(Step::PrefillComplete),
            _ => Err(WireError::UnknownTag(tag)),
        };
    }
    let mut add = None;
    fields(c, "data", |k, c| {
        if k != b"AddRequest" {
            return Err(WireError::UnknownTag(
                String::from_utf8_lossy(k).into_owned(),
            ));
        }
        let (mut path, mut track, mut tokens) = (Vec::new(), true, 0usize);
        fields(c, "AddRequest", |k, c| {
            match k {
                b"token_sequence" => {
                    if !c.nil()? {
                        for _ in 0..c.array("token_sequence")? {
                            path.push(SeqHash(c.int("token_sequence")?.bits()));
                        }
                    }
                }
                b"track_prefill_tokens" => track = boolean(c, "track_prefill_tokens")?,
                b"prefill_load_hint" if !c.nil()? => fields(c, "prefill_load_hint", |k, c| {
                    if k != b"initial_effective_prefill_tokens" {
                        return Ok(false);
                    }
                    tokens = usize::try_from(uint(c, "initial_effective_prefill_tokens")?)
                        .unwrap_or(usize::MAX);
                    Ok(true)
                })?,
                b"prefill_load_hint" => {}
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        add = Some(Step::Add {
            path: std::mem::take(&mut path),
            new_tokens: if track { tokens } else { 0 },
        });
        Ok(true)
    })?;
    add.ok_or(WireError::Missing {
        field: "AddRequest",
    })
}

/// What the replica links did, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub published: u64,
    pub dropped_out: u64,
    pub received: u64,
    pub dropped_in: u64,
}

/// The queues between the executors and the replica links' threads.
#[derive(Debug)]
pub struct Links {
    /// This replica's id in the events it publishes.
    pub router_id: u64,
    out: (Sender<Event>, Receiver<Event>),
    inboxes: Vec<(Sender<Event>, Receiver<Event>)>,
    published: AtomicU64,
    /// Events not published (the publisher's queue was full).
    dropped_out: AtomicU64,
    /// Events heard but not applied (a shard's queue was full, or undecodable).
    dropped_in: AtomicU64,
    /// Events heard from peers and handed to their shard.
    received: AtomicU64,
}

impl Links {
    pub fn new(shards: usize, router_id: u64) -> Arc<Links> {
        Arc::new(Links {
            router_id,
            out: crossbeam_channel::bounded(QUEUE),
            inboxes: (0..shards)
                .map(|_| crossbeam_channel::bounded(QUEUE / shards.max(1)))
                .collect(),
            published: AtomicU64::new(0),
            dropped_out: AtomicU64::new(0),
            dropped_in: AtomicU64::new(0),
            received: AtomicU64::new(0),
        })
    }

    pub fn counts(&self) -> Counts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            published: get(&self.published),
            dropped_out: get(&self.dropped_out),
            received: get(&self.received),
            dropped_in: get(&self.dropped_in),
        }
    }

    /// Queue `e` for the peers; never waits.
    pub fn publish(&self, e: Event) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.out.0.try_send(e) {
            self.dropped_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The next event for `shard` heard from a peer, if any; never waits.
    pub fn next_for(&self, shard: ShardId) -> Option<Event> {
        self.inboxes.get(shard.0)?.1.try_recv().ok()
    }

    /// The publisher thread: bind a PUB socket at `bind` and send what the
    /// executors queue, until the process ends.
    pub fn run_publisher(self: Arc<Self>, sock: zmq::Socket) {
        while let Ok(e) = self.out.1.recv() {
            match sock.send_multipart([TOPIC, &encode(&e)[..]], 0) {
                Ok(()) => {
                    self.published.fetch_add(1, Ordering::Relaxed);
                }
                Err(err) => {
                    self.dropped_out.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("slot-tracker replica publish failed: {err}");
                }
            }
        }
    }

    /// The subscriber thread: hand each peer's event to the shard owning its
    /// tracker, then `wake` that shard.
    pub fn run_subscriber(self: Arc<Self>, sock: zmq::Socket, wake: impl Fn(ShardId)) {
        let shards = self.inboxes.len();
        loop {
            let frames = match sock.recv_multipart(0) {
                Ok(f) => f,
                Err(err) => {
                    tracing::warn!("slot-tracker replica receive failed: {err}");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
            };
            let e = match frames.as_slice() {
                [topic, payload] if topic == TOPIC => decode(payload),
                _ => Err(WireError::FrameCount(frames.len())),
            };
            let e = match e {
                Ok(e) if e.router_id == self.router_id => continue,
                Ok(e) => e,
                Err(err) => {
                    self.dropped_in.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("slot-tracker replica event not understood: {err}");
                    continue;
                }
            };
            let owner = e.key.owner(shards);
            match self.inboxes[owner.0].0.try_send(e) {
                Ok(()) => {
                    self.received.fetch_add(1, Ordering::Relaxed);
                    wake(owner);
                }
                Err(_) => {
                    self.dropped_in.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// What an event heard from a peer asks of its tracker.
pub fn call(e: Event) -> SlotReq {
    SlotReq::Replica(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip() {
        for step in [
            Step::Add {
                path: vec![SeqHash(1), SeqHash(u64::MAX)],
                new_tokens: 40,
            },
            Step::Add {
                path: vec![],
                new_tokens: 0,
            },
            Step::PrefillComplete,
            Step::Free,
        ] {
            let e = Event {
                key: TrackerKey {
                    model_name: "m".into(),
                    routing_group: "g".into(),
                },
                block_size: 16,
                request_id: "r".into(),
                rank: Rank {
                    worker_id: 7,
                    dp_rank: 3,
                },
                step,
                router_id: 99,
            };
            assert_eq!(decode(&encode(&e)), Ok(e));
        }
        assert!(decode(&[0x80]).is_err());
        assert!(decode(b"").is_err());
    }
}
