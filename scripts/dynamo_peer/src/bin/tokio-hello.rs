//! tokio-hello: the HTTP ceiling of a plain tokio + hyper server, the stack
//! Dynamo's indexer is built on (axum is a layer over the same hyper).
//!
//! Owns a multi-threaded tokio runtime of `--threads` workers, one accept loop
//! and one task per connection. Every request has its body read and gets the
//! same JSON answer, shaped like a `/query` reply and padded to `--body-bytes`,
//! so the ceiling pays for a realistic response size and nothing else.

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::Response;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Parser)]
#[command(about = "tokio + hyper hello server answering a constant /query-sized JSON body")]
struct Args {
    #[arg(long, default_value_t = 8099)]
    port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// tokio worker threads
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Size of the constant answer, in bytes (at least the smallest score reply)
    #[arg(long, default_value_t = 400)]
    body_bytes: usize,
}

/// A score reply of `/query`'s shape, with one more worker per step until it
/// reaches `bytes` (it can exceed it by one worker's entry).
fn answer(bytes: usize) -> Vec<u8> {
    let mut workers = 1;
    loop {
        let scores: Vec<String> = (1..=workers)
            .map(|w| format!("\"{w}\":{{\"0\":{}}}", 1024 - 16 * w))
            .collect();
        let freqs: Vec<String> = (0..64)
            .map(|i| (workers - (i * workers / 64)).to_string())
            .collect();
        let s = format!(
            "{{\"scores\":{{{}}},\"frequencies\":[{}]}}",
            scores.join(","),
            freqs.join(",")
        );
        if s.len() >= bytes || workers >= 4096 {
            return s.into_bytes();
        }
        workers += 1;
    }
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let addr: SocketAddr = format!("{}:{}", a.host, a.port).parse()?;
    let body = Bytes::from(answer(a.body_bytes));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.max(1))
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let body = Arc::new(body);
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let body = body.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let body = Bytes::clone(&body);
                            async move {
                                req.into_body().collect().await.map(|_| {
                                    Response::builder()
                                        .header("content-type", "application/json")
                                        .body(Full::new(body))
                                        .expect("static response")
                                })
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
}
