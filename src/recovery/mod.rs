//! Recovery: every way kvix rebuilds state it did not see live.
//!
//! Owns the recovered-state model ([`State`]), applying it ([`apply`]: registrations,
//! last sequence numbers, and blocks seeded through the ingest threads, so they take
//! the same rings and the same per-shard apply path as live events), peer bootstrap
//! from a `/dump` ([`dump`], [`fetch_peer`]), local snapshots ([`snapshot`]) and the
//! startup order ([`bootstrap`]). Gap replay lives with the listeners
//! ([`crate::ingest::replay`]).

pub mod dump;
pub mod export;
pub mod snapshot;
pub mod workers;

use crate::access::Token;
use crate::app::{Control, ControlError, RecoveryStats, registration};
use crate::ingest::feed::{SeedBlock, SeedGroups};
use crate::ingest::{SeedOutcome, Seeding};
use crate::lifecycle::Lifecycle;
use crate::registry::{Endpoint, InstanceKey};
use crate::ring::Rings;
use crate::types::DpRank;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error("peer {url}: {msg}")]
    Peer { url: String, msg: String },
    #[error(transparent)]
    Dump(#[from] dump::DumpError),
    /// A peer's `/dump` was not taken (unreachable, refused, over a limit, malformed).
    #[error("peer {url}: {err}")]
    PeerDump {
        url: String,
        #[source]
        err: dump::DumpError,
    },
    #[error("snapshot {path}: {msg}")]
    Snapshot { path: String, msg: String },
    #[error("snapshot {path}: i/o: {err}")]
    Io {
        path: String,
        #[source]
        err: std::io::Error,
    },
}

/// A registered listener as recovered state records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerState {
    /// By the router's name: an id given to a name lives only as long as the process.
    pub instance: InstanceKey,
    pub dp: DpRank,
    pub endpoint: Endpoint,
    pub last_seq: Option<u64>,
}

/// One worker's blocks, parents first, and its KV-cache groups other than full
/// attention (empty for a model without them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerBlocks {
    pub instance: InstanceKey,
    pub dp: DpRank,
    pub blocks: Vec<SeedBlock>,
    pub groups: SeedGroups,
}

/// One (model, tenant) index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexState {
    pub model: String,
    pub tenant: String,
    pub block_size: u32,
    pub listeners: Vec<ListenerState>,
    pub workers: Vec<WorkerBlocks>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub indexes: Vec<IndexState>,
}

impl State {
    pub fn blocks(&self) -> usize {
        self.indexes
            .iter()
            .flat_map(|i| &i.workers)
            .map(|w| w.blocks.len())
            .sum()
    }
}

/// Apply recovered state. Every index it names is created (with its block size) if
/// missing. With `register`, its listeners are registered (and their last sequence
/// numbers restored) first. Blocks are seeded only for workers that have a listener
/// here: a worker we do not subscribe to would never see its removes, so its blocks
/// would go stale (Dynamo applies them anyway; kvix prefers answers it can keep
/// true). With `replace`, each seeded worker's current blocks are dropped first.
/// Returns (blocks seeded, blocks skipped).
pub fn apply(
    control: &Control,
    stats: &RecoveryStats,
    state: State,
    register: bool,
    replace: bool,
) -> (u64, u64) {
    let (mut seeded, mut skipped) = (0u64, 0u64);
    for ix in state.indexes {
        if let Err(e) = control
            .registry()
            .ensure_index(&ix.model, &ix.tenant, ix.block_size)
        {
            tracing::warn!(
                model = ix.model,
                tenant = ix.tenant,
                "recovered index not created: {e}"
            );
        }
        if register {
            for l in &ix.listeners {
                let instance = control.registry().intern(&l.instance);
                let key = (&ix.model, &ix.tenant, ix.block_size);
                if let Err(e) = register_listener(control, key, instance, l.dp, &l.endpoint) {
                    tracing::warn!(
                        model = ix.model,
                        instance = %l.instance,
                        dp = l.dp,
                        "cannot re-register recovered worker: {e}"
                    );
                }
                if let Some(seq) = l.last_seq {
                    control
                        .ingest()
                        .restore_seq((instance, l.dp, l.endpoint.endpoint.clone()), seq);
                }
            }
        }
        let Some(info) = control
            .registry()
            .snapshot()
            .lookup(&ix.model, &ix.tenant)
            .cloned()
        else {
            let n: usize = ix.workers.iter().map(|w| w.blocks.len()).sum();
            tracing::info!(
                model = ix.model,
                tenant = ix.tenant,
                blocks = n,
                "recovered index has no worker registered here; not seeded"
            );
            skipped += n as u64;
            continue;
        };
        if info.block_size != ix.block_size {
            tracing::warn!(
                model = ix.model,
                tenant = ix.tenant,
                ours = info.block_size,
                theirs = ix.block_size,
                "recovered index has another block size; not seeded"
            );
            continue;
        }
        for w in ix.workers {
            let n = w.blocks.len() as u64;
            // A name nobody registered here has no listener: nothing to seed.
            let outcome = match control.registry().snapshot().find(&w.instance) {
                Some(id) => {
                    let ingest = control.ingest();
                    ingest.seed(Seeding {
                        index: info.id,
                        instance: id,
                        dp: w.dp,
                        blocks: w.blocks,
                        groups: w.groups,
                        replace,
                    })
                }
                None => SeedOutcome::NoListener,
            };
            match outcome {
                SeedOutcome::Seeded { skipped: s } => {
                    seeded += n - s;
                    skipped += s;
                }
                SeedOutcome::NoListener => {
                    tracing::info!(
                        model = ix.model,
                        instance = %w.instance,
                        dp = w.dp,
                        blocks = n,
                        "recovered worker is not registered here; not seeded"
                    );
                    skipped += n;
                }
            }
        }
    }
    stats.seeded_blocks.fetch_add(seeded, Ordering::Relaxed);
    (seeded, skipped)
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(true)
        .build()
        .into()
}

/// GET `url` + `path` (a recovering peer answers 503: an error).
fn get(
    url: &str,
    path: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> Result<ureq::http::Response<ureq::Body>, String> {
    let full = format!("{}{path}", url.trim_end_matches('/'));
    let mut req = agent(timeout).get(&full);
    if let Some(t) = token {
        req = req.header("Authorization", t.header_value());
    }
    req.call().map_err(|e| e.to_string())
}

/// The most a peer's `/workers` may hold: a list of registrations, far smaller.
const MAX_WORKERS_BYTES: u64 = 64 * 1024 * 1024;

/// Fetch a peer's `/dump` and parse it as it streams in, within `limits`: the body is
/// never held whole.
pub fn fetch_peer(
    url: &str,
    timeout: Duration,
    token: Option<&Token>,
    limits: dump::DumpLimits,
) -> Result<State, RecoveryError> {
    let err = |err| RecoveryError::PeerDump {
        url: url.to_string(),
        err,
    };
    let mut resp =
        get(url, "/dump", timeout, token).map_err(|m| err(dump::DumpError::Unreachable(m)))?;
    // ureq's own limit is the guard's business: lift it past the guard's.
    let body = resp
        .body_mut()
        .with_config()
        .limit(limits.max_bytes.saturating_add(1))
        .reader();
    dump::read(body, limits)
        .map(|(state, _)| state)
        .map_err(err)
}

/// Fetch a peer's `/workers` and parse the registrations it lists.
pub fn fetch_workers(
    url: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> Result<Vec<workers::Adopted>, RecoveryError> {
    let err = |msg: String| RecoveryError::Peer {
        url: url.to_string(),
        msg,
    };
    let body = get(url, "/workers", timeout, token)
        .map_err(err)?
        .body_mut()
        .with_config()
        .limit(MAX_WORKERS_BYTES)
        .read_to_vec()
        .map_err(|e| err(e.to_string()))?;
    workers::parse(&body).map_err(|e| RecoveryError::Peer {
        url: url.to_string(),
        msg: e,
    })
}

/// Register a recovered or adopted listener of index `(model, tenant, block_size)`.
/// Per-listener salt / LoRA defaults are not in the registry, so not in snapshots or
/// `/workers`: such listeners must be registered again by hand. A hybrid model's
/// settings are the command line's. Returns whether a
/// listener was started (false: it was already registered, or it is a pod heard on a
/// bound socket, which registers itself again with its next message).
fn register_listener(
    control: &Control,
    (model, tenant, block_size): (&String, &String, u32),
    instance: crate::types::InstanceId,
    dp: DpRank,
    endpoint: &Endpoint,
) -> Result<bool, ControlError> {
    if endpoint.publisher.as_deref() == Some(crate::ingest::bind::POD_PUBLISHER) {
        return Ok(false);
    }
    let r = control.register(registration(
        model.clone(),
        tenant.clone(),
        block_size,
        instance,
        dp,
        endpoint.clone(),
        // The model's hybrid settings from the command line; a registration's
        // own are not recorded (the recovered groups carry them: see
        // `WorkerFeed::seed`).
        {
            let d = control.registry().hybrid_defaults(model);
            crate::registry::ListenerOpts {
                publisher: endpoint.publisher.clone(),
                attention_chunk_size: d.attention_chunk_size,
                hybrid_align_tokens: d.hybrid_align_tokens,
                ..Default::default()
            }
        },
    ));
    match r {
        Ok(()) => Ok(true),
        Err(ControlError::Registry(crate::registry::RegistryError::AlreadyRegistered {
            ..
        })) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Register here every listener a peer lists (the same endpoints, so this replica
/// hears the same events). Returns how many listeners were started.
pub fn adopt(control: &Control, list: Vec<workers::Adopted>) -> usize {
    let mut started = 0;
    for w in list {
        let instance = control.registry().intern(&w.instance);
        let key = (&w.model, &w.tenant, w.block_size);
        match register_listener(control, key, instance, w.dp, &w.endpoint) {
            Ok(true) => started += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!(
                model = w.model,
                endpoint = w.endpoint.endpoint,
                "cannot adopt peer's worker: {e}"
            ),
        }
    }
    started
}

/// Startup recovery configuration.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub snapshot_path: Option<PathBuf>,
    /// How long to wait after connecting SUB sockets before asking a peer (Dynamo: 1 s).
    pub peer_wait: Duration,
    /// Subscribe to the workers a peer lists in `/workers` before taking its dump.
    pub adopt_workers: bool,
    /// Presented to peers (replicas share their read token): `--query-token-file`.
    pub peer_token: Option<Token>,
    /// What one peer's dump may cost (`--max-peer-dump-bytes`, `--max-peer-dump-blocks`).
    pub dump_limits: dump::DumpLimits,
}

/// Startup order (the ingest threads are paused by the caller before `--workers`
/// connect, and the lifecycle is in Recovering):
/// 1. load the local snapshot, if any (registrations, last sequences, blocks);
/// 2. with adoption, register the workers of the first peer that answers `/workers`
///    (their SUB sockets connect and buffer);
/// 3. wait `peer_wait`, then seed from the first peer that answers `/dump` (a peer
///    that is itself recovering answers 503 and the next one is tried);
/// 4. resume the ingest threads (buffered live frames apply on top);
/// 5. replay, for every worker with a replay endpoint, what it published since the
///    snapshot's last sequence;
/// 6. Ready.
pub fn bootstrap(
    control: &Control,
    rings: &Rings,
    life: &Lifecycle,
    stats: &RecoveryStats,
    opts: Options,
) {
    let t0 = Instant::now();
    if let Some(path) = &opts.snapshot_path {
        match snapshot::read(path) {
            Ok(Some(state)) => {
                let n = state.blocks();
                let (seeded, skipped) = apply(control, stats, state, true, false);
                tracing::info!(
                    path = %path.display(),
                    blocks = n,
                    seeded,
                    skipped,
                    took_ms = t0.elapsed().as_millis() as u64,
                    "loaded snapshot"
                );
            }
            Ok(None) => {
                tracing::info!(path = %path.display(), "no snapshot yet; starting without one")
            }
            Err(e) => {
                stats.snapshots_rejected.fetch_add(1, Ordering::Relaxed);
                match snapshot::set_aside(path) {
                    Ok(to) => tracing::error!(
                        kept = %to.display(),
                        "snapshot rejected, starting without it (kept aside, never overwritten): {e}"
                    ),
                    Err(io) => tracing::error!(
                        "snapshot rejected, starting without it: {e}; it could not be moved aside ({io})"
                    ),
                }
            }
        }
    }
    let peers = control.peers();
    if !peers.is_empty() {
        if opts.adopt_workers {
            for url in peers.iter() {
                match fetch_workers(url, Duration::from_secs(10), opts.peer_token.as_ref()) {
                    Ok(list) => {
                        let listed = list.len();
                        let started = adopt(control, list);
                        tracing::info!(peer = url, listed, started, "adopted peer's workers");
                        break;
                    }
                    Err(e) => tracing::warn!("P2P recovery: {e}"),
                }
            }
        }
        std::thread::sleep(opts.peer_wait);
        let mut recovered = false;
        for url in peers.iter() {
            match fetch_peer(
                url,
                Duration::from_secs(30),
                opts.peer_token.as_ref(),
                opts.dump_limits,
            ) {
                Ok(state) => {
                    let n = state.blocks();
                    let (seeded, skipped) = apply(control, stats, state, false, true);
                    tracing::info!(
                        peer = url,
                        blocks = n,
                        seeded,
                        skipped,
                        "recovered from peer"
                    );
                    recovered = true;
                    break;
                }
                Err(e) => {
                    if let RecoveryError::PeerDump { err, .. } = &e {
                        stats.peer_dump_failed(err.reason());
                    }
                    tracing::warn!("P2P recovery: {e}; trying the next source");
                }
            }
        }
        if !recovered {
            tracing::warn!("P2P recovery: no peer reachable; starting with local state only");
        }
    }
    // Ready must mean "answers include what was recovered": the seeded ops sit on the
    // rings until each shard applies them.
    settle(rings, Duration::from_secs(30));
    control.ingest().pause(false);
    control.ingest().catch_up();
    // Replayed batches too; live frames now keep arriving, so this wait is short.
    settle(rings, Duration::from_secs(2));
    tracing::info!(
        took_ms = t0.elapsed().as_millis() as u64,
        "recovery done; ingesting live events"
    );
    life.recovery_done();
}

/// Wait (at most `limit`) until every shard has applied what its rings hold. A shard
/// takes an op off a ring only after applying it, so an empty ring is an applied one.
fn settle(rings: &Rings, limit: Duration) {
    let t0 = Instant::now();
    while (0..rings.shards()).any(|s| rings.pending(crate::types::ShardId(s)) > 0)
        && t0.elapsed() < limit
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}
