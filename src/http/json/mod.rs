//! Response rendering: the score and `/dump` JSON (`/workers` renders its own,
//! off the executor, in `http/workers.rs`).
//!
//! Owns the exact wire shape of responses. Scores are written straight into
//! a byte buffer (this is the hot path); the rare control responses use serde_json.
//!
//! `write.rs` writes numbers and keys; `scores.rs` the score replies; `dump.rs`
//! `/dump`'s body. Here: the reply envelopes.

mod dump;
mod scores;
mod write;

pub use dump::{DumpCursor, dump_chunk};
pub use scores::{conductor, scores, tiered};

use super::Reply;
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::StatusCode;
use hyper::header::{CONTENT_TYPE, HeaderValue};

pub fn bytes(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut r = hyper::Response::new(Either::Left(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub fn empty(status: StatusCode) -> Reply {
    let mut r = hyper::Response::new(Either::Left(Full::new(Bytes::new())));
    *r.status_mut() = status;
    r
}

pub fn ok(status: StatusCode) -> Reply {
    bytes(status, br#"{"status":"ok"}"#.to_vec())
}
