//! Engine wire formats: ZMQ frames and their msgpack event batches.
//!
//! Owns turning bytes into [`Batch`] (one decoded frame, borrowed where it
//! can be, reusable across frames so decoding allocates nothing per block).
//! Must never touch index state: resolving hashes is the ingest layer's job.
//!
//! One entry point, [`decode`], accepts every dialect seen on a kvix listener
//! and detects it per event:
//!
//! * vLLM / SGLang `KVEventBatch` (positional or map events, every version;
//!   see [`vllm`]),
//! * Mooncake RFC #1527 event maps (`event_type` = stored/removed/cleared,
//!   `seq_hashes`, ...; see [`map`]),
//! * legacy Mooncake Store events (`BlockStoreEvent` / `BlockUpdateEvent` /
//!   `RemoveAllEvent`; see [`mooncake`]).
//!
//! The batch envelope is always the vLLM one: `[ts, [events], dp_rank, ...]`
//! (or a map with `ts`/`events`/`data_parallel_rank`|`attn_dp_rank`|`dp_rank`);
//! a legacy Mooncake batch without a timestamp, `[[events]]`, is accepted too.

mod batch;
mod fields;
pub mod map;
pub mod mooncake;
pub mod msgpack;
pub mod vllm;

pub use batch::decode;

use crate::types::EngineHash;
use std::ops::Range;
use thiserror::Error;

/// Why a frame was rejected. The whole frame is skipped; nothing of it is applied.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("frame truncated")]
    Truncated,
    #[error("field `{field}`: expected {expected}")]
    Type {
        field: &'static str,
        expected: &'static str,
    },
    #[error("field `{field}`: value out of range")]
    Range { field: &'static str },
    #[error("field `{field}` is missing")]
    Missing { field: &'static str },
    #[error("unknown event tag {0}")]
    UnknownTag(String),
    #[error("values nested too deeply")]
    TooDeep,
    #[error("expected 3 frames [topic, seq, payload], got {0}")]
    FrameCount(usize),
    #[error("sequence frame must be 8 bytes, got {0}")]
    SeqFrame(usize),
    #[error("BlockStored: {tokens} token ids for {blocks} blocks of {block_size}")]
    TokenCount {
        tokens: usize,
        blocks: usize,
        block_size: usize,
    },
    #[error("trailing bytes after batch")]
    Trailing,
    #[error("a part of {bytes} bytes, over --zmq-max-msg-bytes {limit}")]
    Oversized { bytes: usize, limit: u64 },
}

/// What one event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EventOp {
    /// vLLM/SGLang `BlockStored`, RFC #1527 `stored`, legacy `BlockStoreEvent`.
    #[default]
    Stored,
    /// vLLM/SGLang `BlockRemoved`, RFC #1527 `removed`.
    Removed,
    /// `AllBlocksCleared`, RFC #1527 `cleared`, legacy `RemoveAllEvent`.
    /// An RFC event scopes the clear to its stream (`medium`, `dp_rank`, ...).
    Cleared,
    /// Legacy Mooncake `BlockUpdateEvent`: the replica list (`replicas`) of the
    /// object `object_key` changed; no hashes, no tokens.
    Updated,
}

/// What the values in an event's `hashes` (and `parent`) are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HashKind {
    /// The engine's private block hashes (vLLM/SGLang, legacy Mooncake
    /// `block_hash`): only comparable within one worker, resolved through tokens.
    #[default]
    Engine,
    /// RFC #1527 standardized rolling sequence hashes (`seq_hashes`,
    /// `parent_hash`, or a numeric Mooncake `object_key`): XXH3-64 seed 1337 of
    /// LE u32 tokens, chained `XXH3(prev_le || local_le)`, i.e. kvix's own
    /// `SeqHash`. Usable directly when the event carries no tokens.
    Seq,
}

/// Which wire dialect an event was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Dialect {
    /// vLLM or SGLang `BlockStored`/`BlockRemoved`/`AllBlocksCleared`.
    #[default]
    Engine,
    /// Mooncake RFC #1527 event map (`event_type` key).
    Rfc1527,
    /// Legacy Mooncake Store `BlockStoreEvent`/`BlockUpdateEvent`/`RemoveAllEvent`.
    MooncakeLegacy,
}

/// The kind of vLLM KV-cache group an event belongs to, from its
/// `kv_cache_spec_kind` (or its `group_idx` alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum GroupKind {
    /// Full attention (`full_attention`, `mla_attention`, `sink_full_attention`),
    /// or no group fields at all: the prefix index Dynamo keeps.
    #[default]
    Full,
    /// `sliding_window`, `sliding_window_mla`: the window is in `group_window`.
    SlidingWindow,
    /// `chunked_local_attention`: the chunk size is a setting, not on the wire.
    ChunkedLocal,
    /// `mamba`: one state block stands for the whole prefix before it.
    Mamba,
    /// A removal naming a `group_idx` other than 0: its kind is the one that
    /// group's stores said.
    Named,
}

impl GroupKind {
    /// The kind a `kv_cache_spec_kind` names; `None` for kinds kvix has no hit
    /// rule for (their events are dropped).
    pub fn of_spec(kind: &[u8]) -> Option<GroupKind> {
        match kind {
            b"full_attention" | b"mla_attention" | b"sink_full_attention" => Some(GroupKind::Full),
            b"sliding_window" | b"sliding_window_mla" => Some(GroupKind::SlidingWindow),
            b"chunked_local_attention" => Some(GroupKind::ChunkedLocal),
            b"mamba" => Some(GroupKind::Mamba),
            _ => None,
        }
    }
}

/// One replica location of a legacy Mooncake object: byte ranges into the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRec {
    /// Replica type when the publisher sends `[type, location]` pairs
    /// (`"memory"`, `"disk"`, `"local_disk"`); `None` for a bare address string.
    pub kind: Option<Range<usize>>,
    /// Transport endpoint or file path.
    pub location: Range<usize>,
}

/// One decoded event; ranges index into the owning [`Batch`]'s arrays or the frame payload.
///
/// Every string range was validated as UTF-8 while decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRec {
    /// Block hashes, into [`Batch::hashes`]; their meaning is given by `hash_kind`.
    pub hashes: Range<usize>,
    /// Hash of the block before the first one (same `hash_kind` as `hashes`).
    pub parent: Option<EngineHash>,
    /// Token ids of all blocks, into [`Batch::tokens`].
    pub tokens: Range<usize>,
    pub block_size: Option<u32>,
    pub lora_id: Option<i64>,
    /// Byte ranges into the payload.
    pub medium: Option<Range<usize>>,
    pub lora_name: Option<Range<usize>>,
    pub cache_salt: Option<Range<usize>>,
    // ---- added for RFC #1527 / Mooncake; defaults reproduce the old meaning ----
    /// Full-fidelity operation (adds `Updated`).
    pub op: EventOp,
    pub dialect: Dialect,
    pub hash_kind: HashKind,
    /// RFC #1527 `event_id`: per-stream monotonic sequence number.
    pub event_id: Option<u64>,
    /// RFC #1527 per-event `timestamp` (Unix ms), or a legacy event's float
    /// seconds converted to ms. Informational only.
    pub timestamp_ms: Option<u64>,
    /// Per-event data-parallel rank (RFC #1527 `dp_rank`); overrides [`Batch::dp_rank`].
    pub dp_rank: Option<u32>,
    /// RFC #1527 `base_block_idx`: zero-based depth of the first block.
    pub base_block_idx: Option<u32>,
    /// vLLM `group_idx` (KV-cache group), as sent.
    pub group_idx: Option<u32>,
    /// What kind of KV-cache group the event is of (see [`GroupKind`]).
    pub group_kind: GroupKind,
    /// `kv_cache_spec_sliding_window` (tokens) of a sliding-window group's store.
    pub group_window: Option<u32>,
    /// Token ids arrived as `(token, next_token)` pairs (EAGLE / SGLang DSv4);
    /// `tokens` holds the first of each pair, i.e. the block's own tokens.
    pub bigram_tokens: bool,
    pub tenant_id: Option<Range<usize>>,
    pub backend_id: Option<Range<usize>>,
    /// `model_name` (RFC, legacy) or `model`.
    pub model_name: Option<Range<usize>>,
    /// RFC #1527 `additional_salt` (hash namespace; cf. `cache_salt`).
    pub additional_salt: Option<Range<usize>>,
    /// Mooncake store key (RFC `object_key`, legacy `mooncake_key`).
    pub object_key: Option<Range<usize>>,
    /// Legacy Mooncake replica list, into [`Batch::replicas`].
    pub replicas: Range<usize>,
    /// Multimodal hashes from vLLM `extra_keys`, into [`Batch::mm`].
    pub mm: Range<usize>,
}

impl EventRec {
    /// An event with no payload at the current ends of `out`'s arrays.
    pub fn empty(op: EventOp, out: &Batch) -> EventRec {
        EventRec {
            hashes: out.hashes.len()..out.hashes.len(),
            parent: None,
            tokens: out.tokens.len()..out.tokens.len(),
            block_size: None,
            lora_id: None,
            medium: None,
            lora_name: None,
            cache_salt: None,
            op,
            dialect: Dialect::Engine,
            hash_kind: HashKind::Engine,
            event_id: None,
            timestamp_ms: None,
            dp_rank: None,
            base_block_idx: None,
            group_idx: None,
            group_kind: GroupKind::Full,
            group_window: None,
            bigram_tokens: false,
            tenant_id: None,
            backend_id: None,
            model_name: None,
            additional_salt: None,
            object_key: None,
            replicas: out.replicas.len()..out.replicas.len(),
            mm: out.mm.len()..out.mm.len(),
        }
    }
}

/// One decoded frame. Reuse one `Batch` for many frames: its vectors keep their
/// capacity (until [`Batch::trim`]).
#[derive(Default, Debug)]
pub struct Batch {
    pub ts: f64,
    /// `data_parallel_rank` (vLLM) or `attn_dp_rank` (SGLang) or `dp_rank`
    /// (map batches, Mooncake master: `0`); overrides the registered rank.
    /// A per-event [`EventRec::dp_rank`] overrides this in turn.
    pub dp_rank: Option<u32>,
    pub events: Vec<EventRec>,
    pub hashes: Vec<EngineHash>,
    pub tokens: Vec<u32>,
    pub replicas: Vec<ReplicaRec>,
    /// (block index within its event, multimodal hash), per event in `EventRec::mm`.
    pub mm: Vec<(u32, u64)>,
    /// Well-formed events the decoder dropped: vLLM stores of a KV-cache group
    /// kvix has no hit rule for (a `kv_cache_spec_kind` such as
    /// `encoder_only_attention`, or a `group_idx` other than 0 without a kind),
    /// as Dynamo drops them. For metrics only.
    pub ignored: u32,
}

impl Batch {
    /// Frees vectors grown past `keep_bytes` each (a burst's largest frame), keeping
    /// smaller ones for the frames to come.
    pub fn trim(&mut self, keep_bytes: usize) {
        use crate::heap::trim;
        trim(&mut self.events, keep_bytes);
        trim(&mut self.hashes, keep_bytes);
        trim(&mut self.tokens, keep_bytes);
        trim(&mut self.replicas, keep_bytes);
        trim(&mut self.mm, keep_bytes);
    }
}

/// A borrowed view of one event, for the ingest layer.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    pub hashes: &'a [EngineHash],
    pub parent: Option<EngineHash>,
    pub tokens: &'a [u32],
    pub block_size: Option<u32>,
    pub medium: Option<&'a str>,
    pub lora_name: Option<&'a str>,
    pub cache_salt: Option<&'a str>,
    pub lora_id: Option<i64>,
    pub op: EventOp,
    pub dialect: Dialect,
    pub hash_kind: HashKind,
    pub event_id: Option<u64>,
    pub timestamp_ms: Option<u64>,
    pub dp_rank: Option<u32>,
    pub base_block_idx: Option<u32>,
    pub group_idx: Option<u32>,
    pub group_kind: GroupKind,
    pub group_window: Option<u32>,
    pub bigram_tokens: bool,
    pub tenant_id: Option<&'a str>,
    pub backend_id: Option<&'a str>,
    pub model_name: Option<&'a str>,
    pub additional_salt: Option<&'a str>,
    pub object_key: Option<&'a str>,
    pub replicas: Replicas<'a>,
    /// (block index, multimodal hash) pairs of this event, blocks ascending.
    pub mm: &'a [(u32, u64)],
}

/// A legacy Mooncake object's replica list, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct Replicas<'a> {
    recs: &'a [ReplicaRec],
    payload: &'a [u8],
}

/// One replica: `(type, location)`; `type` is `None` for a bare address string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica<'a> {
    pub kind: Option<&'a str>,
    pub location: &'a str,
}

impl<'a> Replicas<'a> {
    pub fn len(&self) -> usize {
        self.recs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = Replica<'a>> + 'a {
        let payload = self.payload;
        self.recs.iter().map(move |r| Replica {
            kind: r.kind.clone().map(|k| utf8(payload, k)),
            location: utf8(payload, r.location.clone()),
        })
    }
}

/// Strings were validated as UTF-8 during decoding; a range that somehow is not
/// (a payload other than the decoded one) reads as empty rather than panicking.
fn utf8(payload: &[u8], r: Range<usize>) -> &str {
    payload
        .get(r)
        .and_then(|b| std::str::from_utf8(b).ok())
        .unwrap_or("")
}

impl Batch {
    pub fn clear(&mut self) {
        self.ts = 0.0;
        self.dp_rank = None;
        self.events.clear();
        self.hashes.clear();
        self.tokens.clear();
        self.replicas.clear();
        self.mm.clear();
        self.ignored = 0;
    }

    /// Iterate the events of a batch decoded from `payload`.
    pub fn events<'a>(&'a self, payload: &'a [u8]) -> impl Iterator<Item = Event<'a>> + 'a {
        let text = move |r: &Option<Range<usize>>| r.clone().map(|r| utf8(payload, r));
        self.events.iter().map(move |e| Event {
            hashes: &self.hashes[e.hashes.clone()],
            parent: e.parent,
            tokens: &self.tokens[e.tokens.clone()],
            block_size: e.block_size,
            medium: text(&e.medium),
            lora_name: text(&e.lora_name),
            cache_salt: text(&e.cache_salt),
            lora_id: e.lora_id,
            op: e.op,
            dialect: e.dialect,
            hash_kind: e.hash_kind,
            event_id: e.event_id,
            timestamp_ms: e.timestamp_ms,
            dp_rank: e.dp_rank,
            base_block_idx: e.base_block_idx,
            group_idx: e.group_idx,
            group_kind: e.group_kind,
            group_window: e.group_window,
            bigram_tokens: e.bigram_tokens,
            tenant_id: text(&e.tenant_id),
            backend_id: text(&e.backend_id),
            model_name: text(&e.model_name),
            additional_salt: text(&e.additional_salt),
            object_key: text(&e.object_key),
            replicas: Replicas {
                recs: &self.replicas[e.replicas.clone()],
                payload,
            },
            mm: &self.mm[e.mm.clone()],
        })
    }
}

/// The batch sequence number frame: 8 bytes, big-endian.
pub fn split_seq(frame: &[u8]) -> Result<u64, WireError> {
    let seq: [u8; 8] = frame
        .try_into()
        .map_err(|_| WireError::SeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(seq))
}

#[cfg(test)]
mod tests;
