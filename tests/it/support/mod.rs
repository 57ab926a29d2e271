//! Black-box test harness: the real `kvix` binary, real HTTP, real ZMQ publishers.
//!
//! `server.rs` starts, calls and stops the server (on a port of its own choosing),
//! holds ports that nothing listens on (`ReservedPort`) and starts Dynamo's binaries
//! for comparisons; `engine.rs` publishes as engines do and registers them;
//! `events.rs` builds their payloads; `metrics.rs` reads `/metrics`. Everything binds
//! 127.0.0.1.

// Each binary that includes the harness (tests/it, tests/executor_spin.rs, the load
// tool's smoke test) uses part of it.
#![allow(dead_code, unused_imports)]

mod engine;
mod events;
mod metrics;
mod server;
pub mod tokenizer;

pub use engine::*;
pub use events::*;
pub use metrics::*;
pub use server::*;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
