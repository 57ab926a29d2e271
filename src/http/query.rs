//! `/query` and `/query_by_hash`: a prompt as token ids, text or block hashes,
//! scored against every worker of one index, in Dynamo's or Mooncake's shape.
//!
//! Owns the two bodies and the flow parse → scope → hash → scatter (through
//! [`ShardMesh`]) → gather → render. Never locks and never blocks the executor:
//! text is encoded on the tokenizing pool.

use super::Reply;
use super::context::Ctx;
use super::error::{ApiError, parse};
use super::json;
use super::scope::{HashNum, Scope, Shape, Target, TokenIds, named, resolve, resolve_named};
use super::token_ids;
use crate::hash;
use crate::mesh::ShardMesh;
use crate::prompt::{self, PromptError, Prompts, Text};
use crate::registry::IndexInfo;
use crate::score::{self, gather};
use crate::shard::PromptBlocks;
use crate::types::{BlockHash, InstanceId, SeqHash, WorkerSlot};
use hyper::StatusCode;
use serde::Deserialize;
use std::sync::Arc;

impl From<PromptError> for ApiError {
    fn from(e: PromptError) -> Self {
        let (field, msg) = (e.field().into(), e.to_string());
        match e {
            PromptError::TooLong { .. } => ApiError::TooLong { field, msg },
            PromptError::Busy { .. } => ApiError::AtCapacity(msg),
            _ => ApiError::Field { field, msg },
        }
    }
}

/// The token ids of a `/query` body, checked as the handler checks it before it
/// reads the registry (fast path or serde_json, as the handler reads them). A
/// `prompt` or `messages` is checked against no tokenizers: it ends in the 422 a
/// model without `--tokenizer` gets. For [`super::routes::check_body`].
pub(super) fn check(body: &[u8], forced: Option<Shape>) -> Result<Vec<u32>, ApiError> {
    let mut r = parse_query(body)?;
    let input = r.input()?;
    let n = named(&mut r.scope, forced)?;
    Ok(match input {
        Input::Ids(ids) => ids,
        Input::Text(t) => Prompts::default().model_for(&n.model, &t)?.encode(&t)?,
    })
}

/// A `/query_by_hash` body, checked as the handler checks it before it reads the
/// registry.
pub(super) fn check_by_hash(body: &[u8], forced: Option<Shape>) -> Result<(), ApiError> {
    let mut r: QueryByHashReq = parse(body)?;
    named(&mut r.scope, forced).map(drop)
}

async fn score_prompt<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    t: &Target,
    prompt: PromptBlocks,
    loads: Option<crate::slot_tracker::SlotReq>,
) -> Result<Reply, ApiError> {
    let ix = &t.ix;
    let lookup = cx.mesh.lookup(ix.id, ix.slots.len(), Arc::new(prompt));
    // Overlap and loads are asked for at once: one round trip to the shards.
    let (replies, loads) = match loads {
        None => (lookup.await?, None),
        Some(call) => {
            let (replies, loads) =
                futures_lite::future::zip(lookup, super::slot_tracker::potential(cx.mesh, call))
                    .await;
            (replies?, Some(loads?))
        }
    };
    let merged = score::merge(replies);
    let live = |s: WorkerSlot| {
        let info = ix.slot(s);
        info.live && t.only.is_none_or(|i| i == info.instance)
    };
    let snap = cx.snap();
    let body = match t.shape {
        Shape::Conductor => {
            let cond = conductor_overlap(ix, &merged, &live);
            json::conductor(snap, ix, &t.tenant, &cond)
        }
        Shape::Dynamo => {
            let overlap = gather(&merged, ix.slots.len(), live);
            let llmd = t
                .weights
                .map(|w| score::weighted(&merged, ix.slots.len(), live, &w));
            let holds = |s: WorkerSlot| {
                overlap
                    .matched
                    .get(s.0 as usize)
                    .is_some_and(|m| m.iter().any(|&n| n > 0))
            };
            let shown = |s: WorkerSlot| live(s) && (!t.matched_only || holds(s));
            json::scores(snap, ix, &overlap, llmd.as_deref(), &shown)
        }
    };
    let body = match loads {
        Some(l) => super::slot_tracker::append_loads(body, &l),
        None => body,
    };
    Ok(json::bytes(StatusCode::OK, body))
}

/// Conductor overlap of every live instance, in instance order.
fn conductor_overlap(
    ix: &IndexInfo,
    merged: &score::Merged,
    live: &impl Fn(WorkerSlot) -> bool,
) -> Vec<(InstanceId, score::InstanceOverlap)> {
    let mut instances: Vec<InstanceId> = ix
        .slots
        .iter()
        .enumerate()
        .filter(|(i, _)| live(WorkerSlot(*i as u32)))
        .map(|(_, s)| s.instance)
        .collect();
    instances.sort_unstable();
    instances.dedup();
    let instance_of: Vec<Option<usize>> = ix
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            live(WorkerSlot(i as u32))
                .then(|| instances.binary_search(&s.instance).ok())
                .flatten()
        })
        .collect();
    let per = score::conductor(merged, &instance_of, instances.len());
    instances.into_iter().zip(per).collect()
}

#[derive(Deserialize)]
struct QueryReq {
    /// Exactly one of `token_ids`, `prompt` and `messages` (see [`QueryReq::input`]).
    token_ids: Option<TokenIds>,
    /// Text for the model's tokenizer (`--tokenizer`).
    prompt: Option<String>,
    /// Chat messages for the model's chat template.
    messages: Option<prompt::Messages>,
    /// With `messages`: end with the template's assistant header (default true).
    add_generation_prompt: Option<bool>,
    cache_salt: Option<String>,
    /// Per block, the hashes of the multimodal objects it carries (or null),
    /// folded into its hash as Dynamo does.
    block_mm_hashes: Option<Vec<Option<Vec<HashNum>>>>,
    #[serde(flatten)]
    scope: Scope,
    #[serde(flatten)]
    ask: super::slot_tracker::LoadsAsk,
}

/// A `/query` body: the token ids by the fast path when it applies (see
/// [`token_ids`]), the rest by serde_json.
fn parse_query(body: &[u8]) -> Result<QueryReq, ApiError> {
    Ok(match token_ids::split(body) {
        Some((ids, rest)) => match serde_json::from_slice::<QueryReq>(&rest) {
            Ok(r) => QueryReq {
                token_ids: Some(TokenIds(ids)),
                ..r
            },
            // Errors are reported against the body as sent.
            Err(_) => parse(body)?,
        },
        None => parse(body)?,
    })
}

/// What a query asks about: token ids, or text for the model's tokenizer.
enum Input {
    Ids(Vec<u32>),
    Text(Text),
}

/// A query's input once a text has its tokenizer.
enum Tokens {
    Ids(Vec<u32>),
    Text(Arc<prompt::Model>, Text),
}

impl QueryReq {
    /// The one input the body carries; none or two is a 422 naming a field.
    fn input(&mut self) -> Result<Input, ApiError> {
        let extra = |field: &str| ApiError::Field {
            field: field.into(),
            msg: "a query carries one of `token_ids`, `prompt` and `messages`".into(),
        };
        match (
            self.token_ids.take(),
            self.prompt.take(),
            self.messages.take(),
        ) {
            (Some(ids), None, None) => Ok(Input::Ids(ids.0)),
            (None, Some(p), None) => Ok(Input::Text(Text::Prompt(p))),
            (None, None, Some(messages)) => Ok(Input::Text(Text::Messages {
                messages,
                add_generation_prompt: self.add_generation_prompt.unwrap_or(true),
            })),
            (None, None, None) => Err(ApiError::Field {
                field: "token_ids".into(),
                msg: "missing field `token_ids` (or `prompt` or `messages`, for a model \
                      given by --tokenizer)"
                    .into(),
            }),
            (_, _, Some(_)) => Err(extra("messages")),
            (Some(_), Some(_), None) => Err(extra("prompt")),
        }
    }
}

/// `client`: the connection the query came on; a text's tokenizing is withdrawn once
/// it is gone.
pub async fn query<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    body: &[u8],
    forced: Option<Shape>,
    client: Option<super::client::Client>,
) -> Result<Reply, ApiError> {
    let mut r = parse_query(body)?;
    let input = r.input()?;
    let n = named(&mut r.scope, forced)?;
    // A text's tokenizer is checked before the registry, as token ids are parsed
    // before it; the encoding, the costly part, runs once the index is known.
    let text = match input {
        Input::Ids(ids) => Tokens::Ids(ids),
        Input::Text(text) => Tokens::Text(cx.prompts().model_for(&n.model, &text)?, text),
    };
    let t = resolve_named(cx, n, r.scope)?;
    let token_ids = match text {
        Tokens::Ids(ids) => ids,
        // On the tokenizing pool: encoding 1k tokens costs many times what a whole
        // token-id query does (BENCHMARKS.md, "Text prompts"), time in which this
        // core's other connections and shard lookups, or the control calls, would wait.
        Tokens::Text(model, text) => {
            let pending = cx.tokenize().submit(model, text)?;
            super::client::unless_gone(cx.mesh, client, pending)
                .await
                .ok_or(ApiError::Abandoned)??
        }
    };
    let seed = hash::block_seed(t.lora.as_deref(), r.cache_salt.as_deref());
    let bs = t.ix.block_size as usize;
    let mut locals = Vec::with_capacity(token_ids.len() / bs + 1);
    match r.block_mm_hashes {
        None => locals.extend(
            token_ids
                .chunks_exact(bs)
                .map(|chunk| hash::local_hash(chunk, seed)),
        ),
        Some(mm) => {
            let (mut sorted, mut buf) = (Vec::new(), Vec::new());
            for (i, chunk) in token_ids.chunks_exact(bs).enumerate() {
                sorted.clear();
                if let Some(Some(hs)) = mm.get(i) {
                    sorted.extend(hs.iter().map(|h| h.0));
                    sorted.sort_unstable();
                }
                locals.push(hash::local_hash_mm(chunk, &sorted, seed, &mut buf));
            }
        }
    }
    let loads = r.ask.call(
        &t.ix.model,
        &t.ix.tenant,
        || seqs_of(&locals),
        token_ids.len(),
    );
    score_prompt(cx, &t, PromptBlocks::Locals(locals), loads).await
}

/// The sequence hashes (as routers send the slot tracker) of local block hashes.
fn seqs_of(locals: &[BlockHash]) -> Vec<SeqHash> {
    let mut seqs = Vec::with_capacity(locals.len());
    hash::seq_hashes_for_locals(locals, &mut seqs);
    seqs
}

#[derive(Deserialize)]
struct QueryByHashReq {
    /// Dynamo: local block hashes, chained here into sequence hashes.
    block_hashes: Option<Vec<HashNum>>,
    /// Mooncake: rolling sequence hashes (`block_hash` in earlier drafts).
    seq_hashes: Option<Vec<HashNum>>,
    block_hash: Option<Vec<HashNum>>,
    cache_salt: Option<serde_json::Value>,
    #[serde(flatten)]
    scope: Scope,
    #[serde(flatten)]
    ask: super::slot_tracker::LoadsAsk,
}

pub async fn query_by_hash<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    body: &[u8],
    forced: Option<Shape>,
) -> Result<Reply, ApiError> {
    let r: QueryByHashReq = parse(body)?;
    let t = resolve(cx, r.scope, forced)?;
    let prompt = match t.shape {
        Shape::Dynamo => {
            if r.cache_salt.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(ApiError::BadRequest(
                    "cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt"
                        .into(),
                ));
            }
            let hashes = r.block_hashes.ok_or_else(|| ApiError::Field {
                field: "block_hashes".into(),
                msg: "missing field `block_hashes`".into(),
            })?;
            PromptBlocks::Locals(hashes.iter().map(|h| BlockHash(h.0)).collect())
        }
        // Rolling hashes already carry their LoRA and salt namespaces.
        Shape::Conductor => PromptBlocks::Seqs(
            r.seq_hashes
                .or(r.block_hash)
                .or(r.block_hashes)
                .ok_or_else(|| ApiError::Field {
                    field: "seq_hashes".into(),
                    msg: "missing field `seq_hashes`".into(),
                })?
                .iter()
                .map(|h| SeqHash(h.0))
                .collect(),
        ),
    };
    let blocks = match &prompt {
        PromptBlocks::Locals(l) => l.len(),
        PromptBlocks::Seqs(s) => s.len(),
    };
    let loads = r.ask.call(
        &t.ix.model,
        &t.ix.tenant,
        || match &prompt {
            PromptBlocks::Locals(l) => seqs_of(l),
            PromptBlocks::Seqs(s) => s.clone(),
        },
        blocks * t.ix.block_size as usize,
    );
    score_prompt(cx, &t, prompt, loads).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_carries_one_input_and_text_needs_a_tokenizer() {
        let field = |body: &str| match check(body.as_bytes(), None) {
            Err(e @ ApiError::Field { .. }) => {
                let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
                (
                    e.status().as_u16(),
                    v["field"].as_str().unwrap().to_string(),
                )
            }
            other => panic!("{body}: {:?}", other.map_err(|e| e.to_string())),
        };
        let want = |code, f: &str| (code, f.to_string());
        // No tokenizer is loaded here: text is refused, naming its field.
        assert_eq!(
            field(r#"{"prompt": "hi", "model_name": "m"}"#),
            want(422, "prompt")
        );
        assert_eq!(
            field(r#"{"messages": [{"role": "user", "content": "hi"}], "model": "m"}"#),
            want(422, "messages")
        );
        assert_eq!(
            field(r#"{"messages": "hi", "model": "m"}"#),
            want(422, "messages")
        );
        assert_eq!(field(r#"{"prompt": 1, "model": "m"}"#), want(422, "prompt"));
        // None, or more than one.
        assert_eq!(field(r#"{"model_name": "m"}"#), want(422, "token_ids"));
        assert_eq!(
            field(r#"{"token_ids": [1], "prompt": "x", "model_name": "m"}"#),
            want(422, "prompt")
        );
        assert_eq!(
            field(r#"{"prompt": "x", "messages": [], "model_name": "m"}"#),
            want(422, "messages")
        );
        // Explicit nulls are absent fields; token ids keep their fast path.
        let q = r#"{"token_ids": [4, 5], "prompt": null, "messages": null, "model_name": "m"}"#;
        assert_eq!(check(q.as_bytes(), None).unwrap(), vec![4, 5]);
    }
}
