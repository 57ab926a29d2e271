//! The handlers in process: a real [`App`] (registry, control plane) and real
//! shards behind [`LocalMesh`], a mesh that answers on the calling thread. The
//! black-box tests drive the same handlers over HTTP and ZMQ; these pin what a
//! handler does with its one registry snapshot and its errors, without a server.

use super::context::Ctx;
use super::error::ApiError;
use super::{Options, Reply};
use crate::app::{App, Config, registration};
use crate::mesh::{ShardMesh, ShardUnavailable};
use crate::metrics::{HttpStats, ShardStats};
use crate::registry::{Endpoint, ListenerOpts};
use crate::shard::{ChainAt, PredictRefused, PredictStep, PruneBound, Shard, ShardExport, ShardOp};
use crate::shard::{PromptBlocks, ShardReply};
use crate::slot_tracker::{SlotRep, SlotReq};
use crate::types::{EngineHash, IndexId, InstanceId, ShardId, Tier, WorkerSlot};
use http_body_util::BodyExt;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

const BS: u32 = 4;

/// Shards on the calling thread: every call is answered before it returns.
#[derive(Default)]
struct LocalMesh {
    shards: Vec<RefCell<Shard>>,
    http: RefCell<HttpStats>,
}

impl LocalMesh {
    fn new(shards: usize) -> Self {
        LocalMesh {
            shards: (0..shards).map(|_| RefCell::default()).collect(),
            http: RefCell::default(),
        }
    }
}

/// What the in-process mesh does not serve: those routes are tested over HTTP.
async fn not_here<T>() -> Result<T, ShardUnavailable> {
    Err(ShardUnavailable(ShardId(0)))
}

impl ShardMesh for LocalMesh {
    fn http_stats(&self) -> &RefCell<HttpStats> {
        &self.http
    }

    async fn lookup(
        &self,
        index: IndexId,
        _slots: usize,
        prompt: Arc<PromptBlocks>,
    ) -> Result<Vec<ShardReply>, ShardUnavailable> {
        Ok(self
            .shards
            .iter()
            .map(|s| crate::shard::answer(&mut s.borrow_mut(), index, prompt.as_prompt()))
            .collect())
    }

    fn export(
        &self,
        _: ShardId,
        _: IndexId,
    ) -> impl Future<Output = Result<ShardExport, ShardUnavailable>> {
        not_here()
    }

    async fn predict(
        &self,
        index: IndexId,
        step: PredictStep,
        _prune: Option<PruneBound>,
    ) -> Result<Result<ChainAt, PredictRefused>, ShardUnavailable> {
        Ok(self.shards[0].borrow_mut().predict_step(index, &step))
    }

    fn slot_tracker(
        &self,
        _: SlotReq,
    ) -> impl Future<Output = Result<Vec<SlotRep>, ShardUnavailable>> {
        not_here()
    }

    fn stats(&self) -> impl Future<Output = Result<Vec<ShardStats>, ShardUnavailable>> {
        not_here()
    }

    fn shards(&self) -> usize {
        self.shards.len()
    }

    async fn offload<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        f()
    }

    async fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }

    fn pauser(&self) -> impl Fn() -> Pin<Box<dyn Future<Output = ()>>> + 'static {
        || Box::pin(async {})
    }
}

/// A service with model `m`, default tenant, block size [`BS`].
fn app() -> Arc<App> {
    App::new(&Config::new(1)).expect("service")
}

/// Register instance `id` (dp rank 0) of model `m`; its engine is nowhere, which
/// a ZMQ subscription does not mind.
fn register(app: &App, id: u64) -> WorkerSlot {
    app.control()
        .register(registration(
            "m".into(),
            "default".into(),
            BS,
            InstanceId::from(id),
            0,
            Endpoint::new(format!("tcp://127.0.0.1:{}", 1 + id), None),
            ListenerOpts::default(),
        ))
        .expect("registered");
    let snap = app.registry().snapshot();
    let ix = snap.lookup("m", "default").expect("index");
    ix.slot_of[&(InstanceId::from(id), 0)]
}

/// `slot` holds the blocks of `tokens` on the device, as its engine would report.
fn store(mesh: &LocalMesh, app: &App, slot: WorkerSlot, tokens: &[u32]) {
    let index = app.registry().snapshot().lookup("m", "default").unwrap().id;
    let seed = crate::hash::block_seed(None, None);
    let mut parent = None;
    let mut shard = mesh.shards[0].borrow_mut();
    for (i, chunk) in tokens.chunks_exact(BS as usize).enumerate() {
        let block = EngineHash(1000 + i as u64);
        shard.apply(ShardOp::Store {
            index,
            slot,
            tier: Tier::DEVICE,
            parent,
            block,
            local: crate::hash::local_hash(chunk, seed),
            by_seq: false,
            event_start: i == 0,
        });
        parent = Some(block);
    }
}

fn body(reply: Reply) -> (u16, serde_json::Value) {
    let status = reply.status().as_u16();
    let bytes = futures_lite::future::block_on(reply.into_body().collect())
        .unwrap()
        .to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn query(cx: &Ctx<'_, LocalMesh>, json: &str) -> Result<Reply, ApiError> {
    futures_lite::future::block_on(super::query::query(cx, json.as_bytes(), None, None))
}

/// The error a query is refused with.
fn refused(cx: &Ctx<'_, LocalMesh>, json: &str) -> ApiError {
    match query(cx, json) {
        Ok(r) => panic!("{json}: answered {}", r.status()),
        Err(e) => e,
    }
}

#[test]
fn a_query_scores_the_workers_holding_its_prefix() {
    let (app, mesh, opts) = (app(), LocalMesh::new(1), Options::default());
    let (a, _) = (register(&app, 1), register(&app, 2));
    store(&mesh, &app, a, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let cx = Ctx::new(&mesh, &app, &opts);
    let q = r#"{"model_name": "m", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}"#;
    let (status, v) = body(query(&cx, q).unwrap());
    assert_eq!(status, 200);
    assert_eq!(v["scores"]["1"]["0"], 8, "{v}");
    assert!(v["scores"].get("2").is_none_or(|s| s["0"] == 0), "{v}");
    // Asked for the holders only, the worker holding nothing is left out.
    let q = r#"{"model_name": "m", "token_ids": [1, 2, 3, 4], "matched_only": true}"#;
    let (_, v) = body(query(&cx, q).unwrap());
    assert!(v["tree_sizes"].get("2").is_none(), "{v}");
    assert_eq!(v["tree_sizes"]["1"]["0"], 2, "{v}");
}

#[test]
fn a_request_renders_the_registry_it_resolved_against() {
    let (app, mesh, opts) = (app(), LocalMesh::new(1), Options::default());
    register(&app, 1);
    let cx = Ctx::new(&mesh, &app, &opts);
    // The handler has read the registry (as a query's first step does) ...
    assert!(cx.index("m", None).is_ok());
    // ... so a worker registered now is not in its answer, though in the registry
    // before the query resolves and renders.
    register(&app, 2);
    let q = r#"{"model_name": "m", "token_ids": [1, 2, 3, 4]}"#;
    let (_, v) = body(query(&cx, q).unwrap());
    assert!(v["tree_sizes"].get("1").is_some(), "{v}");
    assert!(v["tree_sizes"].get("2").is_none(), "{v}");
    let (_, v) = body(query(&Ctx::new(&mesh, &app, &opts), q).unwrap());
    assert!(v["tree_sizes"].get("2").is_some(), "{v}");
}

#[test]
fn an_unknown_model_or_instance_is_a_404_naming_it() {
    let (app, mesh, opts) = (app(), LocalMesh::new(1), Options::default());
    register(&app, 1);
    let cx = Ctx::new(&mesh, &app, &opts);
    let e = refused(&cx, r#"{"model_name": "x", "token_ids": [1]}"#);
    assert_eq!(e.status().as_u16(), 404);
    assert!(e.to_string().contains("model=x"), "{e}");
    let q = r#"{"model_name": "m", "token_ids": [1], "instance_id": "nobody"}"#;
    let e = refused(&cx, q);
    assert_eq!(e.status().as_u16(), 404);
    assert!(e.to_string().contains("nobody"), "{e}");
    let q = r#"{"model_name": "m", "token_ids": [1], "block_size": 16}"#;
    assert_eq!(refused(&cx, q).status().as_u16(), 400);
}

#[test]
fn workers_lists_the_requests_registry() {
    let (app, mesh, opts) = (app(), LocalMesh::new(1), Options::default());
    register(&app, 7);
    let cx = Ctx::new(&mesh, &app, &opts);
    let reply = futures_lite::future::block_on(super::workers::workers(&cx, "model_name=m"));
    let (status, v) = body(reply.unwrap());
    assert_eq!(status, 200);
    assert_eq!(v[0]["instance_id"], 7, "{v}");
    assert_eq!(v[0]["block_size"], BS, "{v}");
    let reply = futures_lite::future::block_on(super::workers::workers(&cx, "model_name=x"));
    assert_eq!(body(reply.unwrap()).1, serde_json::json!([]));
}
