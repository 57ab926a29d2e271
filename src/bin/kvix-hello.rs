//! `kvix-hello`: the HTTP ceiling. The same runtime as kvix (pinned glommio
//! executors, hyper 1.x over the same I/O adapter, one `SO_REUSEPORT` listener
//! per core) but every request only has its body read and gets a constant
//! score answer. Whatever kvix does beyond this is the cost of indexing. An
//! executor keeps polling for `--spin-us` after each request and runs on a short
//! time slice (`--slice-us`), as kvix's do ([`kvix::runtime::awake`]); with 0 it
//! parks whenever idle (glommio's own way) on the kernel's default slice.

use bytes::Bytes;
use clap::Parser;
use glommio::net::TcpListener;
use glommio::{LocalExecutorPoolBuilder, PoolPlacement};
use http_body_util::{BodyExt, Full};
use hyper::Response;
use kvix::runtime::awake::{self, KeepAwake};
use kvix::runtime::io::HyperStream;
use std::net::SocketAddr;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "HTTP hello-world ceiling on kvix's runtime (for benchmarks)")]
struct Args {
    #[arg(long, default_value_t = 8099)]
    port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Pad the answer to this many bytes (a real reply's size); 0: the bare answer.
    #[arg(long, default_value_t = 0)]
    body_bytes: usize,
    /// Keep polling this long after each request, as kvix's `--spin-us` (the same
    /// default and variable); 0: park whenever idle.
    #[arg(long, env = "KVIX_SPIN_US", default_value_t = 200)]
    spin_us: u64,
    /// The time slice an executor asks for while requests come, as kvix's
    /// `--slice-us` (the same default and variable); 0: the kernel's default.
    #[arg(long, env = "KVIX_SLICE_US", default_value_t = 100)]
    slice_us: u64,
}

const ANSWER: &[u8] = br#"{"scores":{"1":{"0":16}},"frequencies":[1],"tree_sizes":{"1":{"0":1}}}"#;

fn main() {
    let a = Args::parse();
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .expect("--host/--port form a socket address");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = a.threads.clamp(1, cores);
    let answer = padded(ANSWER, a.body_bytes);
    let window = std::time::Duration::from_micros(a.spin_us);
    let slice = (a.slice_us > 0).then(|| std::time::Duration::from_micros(a.slice_us));
    LocalExecutorPoolBuilder::new(PoolPlacement::MaxSpread(threads, None))
        .spin_before_park(awake::idle_spin(window))
        .on_all_shards(move || async move {
            let answer = answer.clone();
            let keeper = KeepAwake::new(window, slice);
            glommio::spawn_local(keeper.clone().run()).detach();
            let relaxer = keeper.clone();
            glommio::spawn_local(async move {
                loop {
                    glommio::timer::sleep(std::time::Duration::from_millis(500)).await;
                    relaxer.relax();
                }
            })
            .detach();
            let listener = TcpListener::bind(addr).expect("bind");
            loop {
                let Ok(stream) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (answer, keeper) = (answer.clone(), keeper.clone());
                glommio::spawn_local(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            keeper.note();
                            let answer = answer.clone();
                            async move {
                                let body =
                                    req.into_body().collect().await.map(|b| b.to_bytes().len());
                                let reply = Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(answer));
                                body.map(|_| reply.expect("static response"))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(HyperStream::new(stream), service)
                        .await;
                })
                .detach();
            }
        })
        .expect("start executors")
        .join_all();
}

/// `answer` with spaces inserted before its closing brace up to `bytes` (JSON
/// whitespace, so it stays the same document).
fn padded(answer: &[u8], bytes: usize) -> Bytes {
    let mut v = answer[..answer.len() - 1].to_vec();
    v.resize(bytes.max(answer.len()) - 1, b' ');
    v.push(b'}');
    Bytes::from(v)
}
