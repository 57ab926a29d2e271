//! kvix: a thread-per-core KV-cache indexer for LLM inference routers.
//!
//! Data flow, one module per step:
//! - events: ZMQ ([`ingest`]) → decode ([`wire`]) → shard ops ([`ingest::feed`], [`hash`])
//!   → SPSC rings ([`ring`]) → the owning shard ([`shard`], chosen by [`partition`]);
//! - queries: HTTP ([`http`]) → hash ([`hash`]) → scatter to shards ([`runtime`]) →
//!   gather and score ([`score`]) → JSON ([`http::json`]); a text prompt is first turned into
//!   token ids ([`prompt`]) on threads of its own ([`tokenize`]).
//!
//! - recovery: gap replay ([`ingest::replay`]), peer `/dump` bootstrap and local
//!   snapshots ([`recovery`]) feed the same rings; [`metrics`] renders `/metrics`.
//!
//! [`registry`] holds the control plane (models, tenants, workers); [`descriptors`]
//! shares the open-file limit between HTTP and engines; [`runtime`] is the
//! only module that knows glommio. [`config`] turns the flags ([`cli`]) into the
//! service's configuration and [`startup`] starts the service from it.

#![warn(clippy::undocumented_unsafe_blocks)]

pub mod access;
pub mod access_log;
pub mod app;
pub mod cli;
pub mod config;
pub mod descriptors;
pub mod hash;
pub mod heap;
pub mod http;
pub mod ingest;
pub mod lifecycle;
pub mod logs;
pub mod mesh;
pub mod metrics;
pub mod partition;
pub mod prompt;
pub mod recovery;
pub mod registry;
pub mod ring;
pub mod runtime;
pub mod score;
pub mod shard;
pub mod slot_tracker;
pub mod startup;
#[cfg(test)]
mod testing;
pub mod tokenize;
pub mod types;
pub mod wire;
