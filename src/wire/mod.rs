//! Engine wire formats: ZMQ frames and their msgpack event batches.
//!
//! Owns turning bytes into [`Batch`] (one decoded frame, borrowed where it
//! can be, reusable across frames so decoding allocates nothing per block).
//! Must never touch index state: resolving hashes is the ingest layer's job.

pub mod msgpack;
pub mod vllm;

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
    #[error("unknown event tag `{0}`")]
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
}

/// What kind of change one event makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Stored,
    Removed,
    Cleared,
}

/// One decoded event; ranges index into the owning [`Batch`]'s arrays or the frame payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRec {
    pub kind: EventKind,
    pub hashes: Range<usize>,
    pub parent: Option<EngineHash>,
    pub tokens: Range<usize>,
    pub block_size: Option<u32>,
    pub lora_id: Option<i64>,
    /// Byte ranges into the payload.
    pub medium: Option<Range<usize>>,
    pub lora_name: Option<Range<usize>>,
    pub cache_salt: Option<Range<usize>>,
}

/// One decoded frame. Reuse one `Batch` per listener: its vectors keep their capacity.
#[derive(Default, Debug)]
pub struct Batch {
    pub ts: f64,
    /// `data_parallel_rank` (vLLM) or `attn_dp_rank` (SGLang); overrides the registered rank.
    pub dp_rank: Option<u32>,
    pub events: Vec<EventRec>,
    pub hashes: Vec<EngineHash>,
    pub tokens: Vec<u32>,
}

/// A borrowed view of one event, for the ingest layer.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    pub kind: EventKind,
    pub hashes: &'a [EngineHash],
    pub parent: Option<EngineHash>,
    pub tokens: &'a [u32],
    pub block_size: Option<u32>,
    pub medium: Option<&'a str>,
    pub lora_name: Option<&'a str>,
    pub cache_salt: Option<&'a str>,
    pub lora_id: Option<i64>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.ts = 0.0;
        self.dp_rank = None;
        self.events.clear();
        self.hashes.clear();
        self.tokens.clear();
    }

    /// Iterate the events of a batch decoded from `payload`.
    pub fn events<'a>(&'a self, payload: &'a [u8]) -> impl Iterator<Item = Event<'a>> + 'a {
        // Strings were validated as UTF-8 during decoding.
        let text = move |r: &Option<Range<usize>>| {
            r.clone()
                .and_then(|r| std::str::from_utf8(&payload[r]).ok())
        };
        self.events.iter().map(move |e| Event {
            kind: e.kind,
            hashes: &self.hashes[e.hashes.clone()],
            parent: e.parent,
            tokens: &self.tokens[e.tokens.clone()],
            block_size: e.block_size,
            medium: text(&e.medium),
            lora_name: text(&e.lora_name),
            cache_salt: text(&e.cache_salt),
            lora_id: e.lora_id,
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
