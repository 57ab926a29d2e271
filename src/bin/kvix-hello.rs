//! `kvix-hello`: the HTTP ceiling. The same runtime as kvix (pinned glommio
//! executors, hyper 1.x over the same I/O adapter, one `SO_REUSEPORT` listener
//! per core) but every request only has its body read and gets a constant
//! score answer. Whatever kvix does beyond this is the cost of indexing.

use bytes::Bytes;
use clap::Parser;
use glommio::net::TcpListener;
use glommio::{LocalExecutorPoolBuilder, PoolPlacement};
use http_body_util::{BodyExt, Full};
use hyper::Response;
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
}

const ANSWER: &[u8] = br#"{"scores":{"1":{"0":16}},"frequencies":[1],"tree_sizes":{"1":{"0":1}}}"#;

fn main() {
    let a = Args::parse();
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .expect("--host/--port form a socket address");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = a.threads.clamp(1, cores);
    LocalExecutorPoolBuilder::new(PoolPlacement::MaxSpread(threads, None))
        .on_all_shards(move || async move {
            let listener = TcpListener::bind(addr).expect("bind");
            loop {
                let Ok(stream) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                glommio::spawn_local(async move {
                    let service = hyper::service::service_fn(
                        |req: hyper::Request<hyper::body::Incoming>| async {
                            let body = req.into_body().collect().await.map(|b| b.to_bytes().len());
                            let reply = Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(ANSWER)));
                            body.map(|_| reply.expect("static response"))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(HyperStream(stream), service)
                        .await;
                })
                .detach();
            }
        })
        .expect("start executors")
        .join_all();
}
