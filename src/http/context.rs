//! What one request's handler may use: the shards (through [`ShardMesh`]), the
//! registry as it stood when the request came in, and the few services of the
//! HTTP layer, each by name.
//!
//! One registry snapshot per request, taken when the handler first asks the
//! registry (after its body is read and parsed): the index a query resolves is
//! the index it renders, and a registration that lands later is seen by the next
//! request, never by half of this one (an approximate model's index, created by the request
//! that first names it, is the one exception: [`Ctx::index_created`]). Never blocks
//! the executor: control calls go through [`Ctx::control`], off the executor.

use super::Options;
use super::error::ApiError;
use crate::access_log::AccessLog;
use crate::app::{App, Control, Speculation};
use crate::ingest::Ingest;
use crate::lifecycle::Lifecycle;
use crate::mesh::ShardMesh;
use crate::metrics::ShardStats;
use crate::prompt::Prompts;
use crate::registry::{IndexInfo, InstanceKey, Registry, Snapshot};
use crate::types::InstanceId;
use arc_swap::Guard;
use std::cell::OnceCell;
use std::sync::Arc;

/// The tenant of a body that names none.
pub(super) const DEFAULT_TENANT: &str = "default";

/// One request's view of the service.
pub struct Ctx<'r, M> {
    pub mesh: &'r M,
    pub opts: &'r Options,
    app: &'r Arc<App>,
    /// A guard, not a clone: it takes a slot of this thread's, so a request
    /// touches no reference count other cores share.
    snap: OnceCell<Guard<Arc<Snapshot>>>,
}

impl<'r, M: ShardMesh> Ctx<'r, M> {
    pub fn new(mesh: &'r M, app: &'r Arc<App>, opts: &'r Options) -> Self {
        Ctx {
            mesh,
            opts,
            app,
            snap: OnceCell::new(),
        }
    }

    /// The registry as this request sees it: as it was when first asked.
    pub fn snap(&self) -> &Arc<Snapshot> {
        self.snap.get_or_init(|| self.app.registry().snapshot())
    }

    /// The index of `model` and `tenant` (the default tenant if `None`).
    pub fn index(&self, model: &str, tenant: Option<&str>) -> Result<Arc<IndexInfo>, ApiError> {
        index_in(self.snap(), model, tenant)
    }

    /// The index as the registry holds it now: for a request that created it.
    pub fn index_created(
        &self,
        model: &str,
        tenant: Option<&str>,
    ) -> Result<Arc<IndexInfo>, ApiError> {
        index_in(&self.app.registry().snapshot(), model, tenant)
    }

    /// The id of an instance a request names: any integer, or a name registered before.
    pub fn instance(&self, key: &InstanceKey) -> Result<InstanceId, ApiError> {
        self.snap()
            .find(key)
            .ok_or_else(|| ApiError::NotFound(format!("no instance {key} registered")))
    }

    /// The registry itself, for the calls that change it (they run off the executor).
    pub fn registry(&self) -> &Arc<Registry> {
        self.app.registry()
    }

    /// Run a control call (it waits on an ingest thread) off the executor.
    pub async fn control<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Control) -> R + Send + 'static,
    ) -> R {
        let app = self.app.clone();
        self.mesh.offload(move || f(app.control())).await
    }

    /// The peers kvix recovers from at start (`/peers`).
    pub fn peers(&self) -> Arc<Vec<String>> {
        self.app.control().peers()
    }

    pub fn add_peer(&self, url: String) {
        self.app.control().add_peer(url)
    }

    /// Whether `url` was a peer.
    pub fn remove_peer(&self, url: &str) -> bool {
        self.app.control().remove_peer(url)
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        self.app.lifecycle()
    }

    pub fn access_log(&self) -> Option<&Arc<AccessLog>> {
        self.app.access_log()
    }

    /// Tokenizers and chat templates for text queries.
    pub fn prompts(&self) -> &Prompts {
        self.app.prompts()
    }

    /// The pool that encodes text prompts off the executors.
    pub fn tokenize(&self) -> &crate::tokenize::Pool {
        self.app.tokenize()
    }

    /// How `/speculate`'s predictions live.
    pub fn speculation(&self) -> &Speculation {
        self.app.speculation()
    }

    /// The ingest threads (their streams' sequence numbers, for an export).
    pub fn ingest(&self) -> &Arc<Ingest> {
        self.app.ingest()
    }

    /// `/metrics` as Prometheus text from every shard's figures and the
    /// process-wide counters, rendered off the executor.
    pub async fn render_metrics(&self, shards: Vec<ShardStats>) -> String {
        let app = self.app.clone();
        self.mesh
            .offload(move || crate::metrics::render(&app, &shards))
            .await
    }
}

fn index_in(
    snap: &Snapshot,
    model: &str,
    tenant: Option<&str>,
) -> Result<Arc<IndexInfo>, ApiError> {
    let tenant = tenant.unwrap_or(DEFAULT_TENANT);
    snap.lookup(model, tenant)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no indexer for model={model} tenant={tenant}")))
}
