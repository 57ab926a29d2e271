//! The service's control plane: registering and unregistering workers, peers.
//!
//! Owns the process-wide handles (registry, ingest threads, rings) and the
//! operations that change who is listened to. Shared by the HTTP API and the
//! CLI's `--workers`; nothing here runs per block.

use crate::cli::validate_endpoint;
use crate::ingest::Ingest;
use crate::registry::{Endpoint, ListenerOpts, Registration, Registry, RegistryError};
use crate::ring::Rings;
use crate::types::{DpRank, InstanceId};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("{0}")]
    Endpoint(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot listen: {0}")]
    Listen(String),
}

pub struct App {
    pub registry: Arc<Registry>,
    pub ingest: Arc<Ingest>,
    pub rings: Arc<Rings>,
    pub peers: Mutex<Vec<String>>,
    /// Executors whose HTTP listener is bound; all bound = ready.
    pub listening: AtomicUsize,
    pub recovery: crate::recovery::RecoveryStats,
    /// Startup recovery (snapshot, peer, catch-up replay) has finished.
    pub recovered: AtomicBool,
    /// Where and how often to write local snapshots (`--snapshot-path`).
    pub snapshot: Option<SnapshotConfig>,
    /// Set by SIGTERM/SIGINT: write a final snapshot and exit.
    pub terminate: Arc<AtomicBool>,
}

#[derive(Clone, Debug)]
pub struct SnapshotConfig {
    pub path: std::path::PathBuf,
    /// Zero: only on SIGTERM.
    pub interval: std::time::Duration,
}

impl App {
    /// Create the rings and start the ingest threads.
    pub fn start(shards: usize, ingest_threads: usize, ring_capacity: usize) -> Arc<App> {
        let registry = Arc::new(Registry::default());
        let rings = Rings::new(ingest_threads.max(1), shards.max(1), ring_capacity.max(16));
        let ingest = Ingest::start(rings.clone(), registry.clone());
        Arc::new(App {
            registry,
            ingest,
            rings,
            peers: Mutex::default(),
            listening: AtomicUsize::new(0),
            recovery: Default::default(),
            recovered: AtomicBool::new(true),
            snapshot: None,
            terminate: Arc::default(),
        })
    }

    /// Like [`App::start`], with local snapshots configured.
    pub fn start_with(
        shards: usize,
        ingest_threads: usize,
        ring_capacity: usize,
        snapshot: Option<SnapshotConfig>,
    ) -> Arc<App> {
        let mut app = Self::start(shards, ingest_threads, ring_capacity);
        Arc::get_mut(&mut app).expect("fresh app").snapshot = snapshot;
        app
    }

    /// Register a worker endpoint and start listening to it.
    pub fn register(&self, reg: Registration) -> Result<(), ControlError> {
        validate_endpoint(&reg.endpoint.endpoint).map_err(ControlError::Endpoint)?;
        if let Some(r) = &reg.endpoint.replay_endpoint {
            validate_endpoint(r).map_err(|e| {
                ControlError::Endpoint(format!("invalid replay endpoint `{r}`: {e}"))
            })?;
        }
        let (index, _slot) = self.registry.register(&reg)?;
        if let Err(e) = self.ingest.add(
            index,
            reg.instance,
            reg.dp,
            reg.block_size,
            reg.endpoint.clone(),
            reg.opts.clone(),
        ) {
            let _ =
                self.registry
                    .unregister(&reg.model, Some(&reg.tenant), reg.instance, Some(reg.dp));
            return Err(ControlError::Listen(e));
        }
        Ok(())
    }

    /// Stop listening to an instance (one dp rank, or all) and drop its blocks.
    /// Returns the dp ranks whose listeners were removed.
    pub fn unregister(
        &self,
        model: &str,
        tenant: Option<&str>,
        instance: InstanceId,
        dp: Option<DpRank>,
    ) -> Result<Vec<DpRank>, ControlError> {
        let mut removed = Vec::new();
        for (index, dps, slots) in self.registry.unregister(model, tenant, instance, dp)? {
            self.ingest.remove(index, instance, dp, slots);
            removed.extend(dps);
        }
        Ok(removed)
    }

    pub fn add_peer(&self, url: String) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if !peers.contains(&url) {
            peers.push(url);
        }
    }

    pub fn remove_peer(&self, url: &str) -> bool {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let before = peers.len();
        peers.retain(|p| p != url);
        peers.len() != before
    }

    pub fn peers(&self) -> Vec<String> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Build a registration from API or CLI values.
pub fn registration(
    model: String,
    tenant: String,
    block_size: u32,
    instance: InstanceId,
    dp: DpRank,
    endpoint: Endpoint,
    opts: ListenerOpts,
) -> Registration {
    Registration {
        model,
        tenant,
        block_size,
        instance,
        dp,
        endpoint: Endpoint {
            publisher: opts.publisher.clone(),
            ..endpoint
        },
        opts,
    }
}
