//! The `kvix` binary: the allocator and its settings, logging, then
//! [`kvix::startup::run`].

#![warn(clippy::undocumented_unsafe_blocks)]

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    kvix::heap::configure_allocator();
    let args = kvix::cli::Args::parse();
    kvix::logs::init(&args.log_format);
    if let Err(e) = kvix::startup::run(args) {
        tracing::error!("{e}");
        eprintln!("kvix: {e}");
        std::process::exit(2);
    }
}
