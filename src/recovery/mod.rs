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

use crate::ingest::SeedOutcome;
use crate::ingest::feed::SeedBlock;
use crate::registry::Endpoint;
use crate::service::{App, ControlError, registration};
use crate::types::{DpRank, InstanceId};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error("peer {url}: {msg}")]
    Peer { url: String, msg: String },
    #[error("malformed dump: {0}")]
    Dump(String),
    #[error("snapshot {path}: {msg}")]
    Snapshot { path: String, msg: String },
    #[error("snapshot {path}: i/o: {err}")]
    Io {
        path: String,
        #[source]
        err: std::io::Error,
    },
}

/// Recovery counters (rare events only).
#[derive(Default, Debug)]
pub struct RecoveryStats {
    pub snapshots_written: AtomicU64,
    pub snapshot_failures: AtomicU64,
    pub seeded_blocks: AtomicU64,
}

/// A registered listener as recovered state records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerState {
    pub instance: InstanceId,
    pub dp: DpRank,
    pub endpoint: Endpoint,
    pub last_seq: Option<u64>,
}

/// One worker's blocks, parents first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerBlocks {
    pub instance: InstanceId,
    pub dp: DpRank,
    pub blocks: Vec<SeedBlock>,
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

/// Apply recovered state. With `register`, its listeners are registered (and their last
/// sequence numbers restored) first. Blocks are seeded only for workers that have a
/// listener here: a worker we do not subscribe to would never see its removes, so its
/// blocks would go stale (Dynamo applies them anyway; kvix prefers answers it can keep
/// true). With `replace`, each seeded worker's current blocks are dropped first.
/// Returns (blocks seeded, blocks skipped).
pub fn apply(app: &App, state: State, register: bool, replace: bool) -> (u64, u64) {
    let (mut seeded, mut skipped) = (0u64, 0u64);
    for ix in state.indexes {
        if register {
            for l in &ix.listeners {
                let r = app.register(registration(
                    ix.model.clone(),
                    ix.tenant.clone(),
                    ix.block_size,
                    l.instance,
                    l.dp,
                    l.endpoint.clone(),
                    // Per-listener salt / LoRA defaults are not in the registry, so not
                    // in the snapshot: re-register such listeners after a restart.
                    crate::registry::ListenerOpts {
                        publisher: l.endpoint.publisher.clone(),
                        ..Default::default()
                    },
                ));
                match r {
                    Ok(())
                    | Err(ControlError::Registry(
                        crate::registry::RegistryError::AlreadyRegistered { .. },
                    )) => {}
                    Err(e) => tracing::warn!(
                        model = ix.model,
                        instance = l.instance,
                        dp = l.dp,
                        "cannot re-register recovered worker: {e}"
                    ),
                }
                if let Some(seq) = l.last_seq {
                    app.ingest
                        .restore_seq((l.instance, l.dp, l.endpoint.endpoint.clone()), seq);
                }
            }
        }
        let Some(info) = app
            .registry
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
            match app
                .ingest
                .seed(info.id, w.instance, w.dp, w.blocks, replace)
            {
                SeedOutcome::Seeded { skipped: s } => {
                    seeded += n - s;
                    skipped += s;
                }
                SeedOutcome::NoListener => {
                    tracing::info!(
                        model = ix.model,
                        instance = w.instance,
                        dp = w.dp,
                        blocks = n,
                        "recovered worker is not registered here; not seeded"
                    );
                    skipped += n;
                }
            }
        }
    }
    app.recovery
        .seeded_blocks
        .fetch_add(seeded, Ordering::Relaxed);
    (seeded, skipped)
}

/// Fetch and parse a peer's `/dump`.
pub fn fetch_peer(url: &str, timeout: Duration) -> Result<State, RecoveryError> {
    let err = |msg: String| RecoveryError::Peer {
        url: url.to_string(),
        msg,
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(true)
        .build()
        .into();
    let dump_url = format!("{}/dump", url.trim_end_matches('/'));
    let mut resp = agent
        .get(&dump_url)
        .call()
        .map_err(|e| err(e.to_string()))?;
    let body = resp
        .body_mut()
        .with_config()
        .limit(16 * 1024 * 1024 * 1024)
        .read_to_vec()
        .map_err(|e| err(e.to_string()))?;
    dump::parse(&body).map_err(|e| err(e.to_string()))
}

/// Startup recovery configuration.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub snapshot_path: Option<PathBuf>,
    /// How long to wait after connecting SUB sockets before asking a peer (Dynamo: 1 s).
    pub peer_wait: Duration,
}

/// Startup order (the ingest threads are paused by the caller before `--workers` connect):
/// 1. load the local snapshot, if any (registrations, last sequences, blocks);
/// 2. wait `peer_wait`, then seed from the first peer that answers `/dump`;
/// 3. resume the ingest threads (buffered live frames apply on top);
/// 4. replay, for every worker with a replay endpoint, what it published since the
///    snapshot's last sequence.
pub fn bootstrap(app: Arc<App>, opts: Options) {
    let t0 = Instant::now();
    if let Some(path) = &opts.snapshot_path {
        match snapshot::read(path) {
            Ok(Some(state)) => {
                let n = state.blocks();
                let (seeded, skipped) = apply(&app, state, true, false);
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
            Err(e) => tracing::error!("snapshot rejected, starting without it: {e}"),
        }
    }
    let peers = app.peers();
    if !peers.is_empty() {
        std::thread::sleep(opts.peer_wait);
        let mut recovered = false;
        for url in &peers {
            match fetch_peer(url, Duration::from_secs(30)) {
                Ok(state) => {
                    let n = state.blocks();
                    let (seeded, skipped) = apply(&app, state, false, true);
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
                Err(e) => tracing::warn!("P2P recovery: {e}"),
            }
        }
        if !recovered {
            tracing::warn!("P2P recovery: no peer reachable; starting with local state only");
        }
    }
    app.ingest.pause(false);
    app.ingest.catch_up();
    app.recovered
        .store(true, std::sync::atomic::Ordering::Release);
    tracing::info!(
        took_ms = t0.elapsed().as_millis() as u64,
        "recovery done; ingesting live events"
    );
}
