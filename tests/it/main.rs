//! The black-box tests: the real `kvix` binary driven over real HTTP and ZMQ on
//! 127.0.0.1, one module per area, sharing the harness in `support`.
//!
//! One test binary runs them all, each test in a thread of its own beside the
//! others: a test owns what it starts (servers on ports they choose, temporary files
//! named apart) and never counts on being alone in the process. A test that must run
//! alone lives in a binary of its own (`tests/executor_spin.rs`).
//!
//! `cargo test --test it <module>::` runs one module, e.g. `cargo test --test it
//! e2e_vllm::`; adding a module is a file here and its `mod` line below.

mod support;

mod access_log;
mod bounded;
mod e2e_dialects;
mod e2e_vllm;
mod executor_slice;
mod hostile_clients;
mod hostile_input;
mod http_api;
mod hybrid;
mod lifecycle;
mod metrics;
mod overload;
mod peers;
mod predictions;
mod prompts;
mod replay;
mod slot_tracker;
mod snapshot;
mod stalls;
mod tiered;
mod zmq_bind;
