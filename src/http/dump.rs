//! `GET /dump`: everything indexed, keyed model:tenant, as Dynamo RouterEvents,
//! streamed.
//!
//! Takes the one export ([`crate::recovery::export`]) and renders it in chunks,
//! pausing between them; never holds the whole JSON and never keeps the executor
//! from queries for longer than one chunk.

use super::Reply;
use super::context::Ctx;
use super::error::ApiError;
use super::json;
use crate::mesh::ShardMesh;

/// `GET /dump`: the one export ([`crate::recovery::export`]) rendered as a chunked
/// stream of about 256 KiB per chunk, pausing between chunks
/// ([`ShardMesh::pauser`]), so a large dump neither holds its JSON in memory nor
/// keeps the executor from queries.
pub async fn dump<M: ShardMesh>(cx: &Ctx<'_, M>) -> Result<Reply, ApiError> {
    const CHUNK: usize = 256 * 1024;
    let export =
        crate::recovery::export::export(cx.mesh, cx.ingest().clone(), cx.registry()).await?;
    let pauser = cx.mesh.pauser();
    let stream = futures_lite::stream::unfold(
        (export, json::DumpCursor::default()),
        move |(export, mut cur)| {
            let pause = pauser();
            async move {
                let mut out = Vec::with_capacity(CHUNK + 1024);
                if !json::dump_chunk(&mut out, &export, &mut cur, CHUNK) {
                    return None;
                }
                // Queries that arrived meanwhile run between chunks.
                pause.await;
                let frame = hyper::body::Frame::data(bytes::Bytes::from(out));
                Some((Ok::<_, std::convert::Infallible>(frame), (export, cur)))
            }
        },
    );
    let body: super::Streamed = Box::pin(http_body_util::StreamBody::new(stream));
    let mut r = hyper::Response::new(http_body_util::Either::Right(body));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}
