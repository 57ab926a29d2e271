//! The process-wide parts of the service and its control plane.
//!
//! Owns [`App`] (built once from a [`Config`]: registry, ingest threads, rings,
//! lifecycle, peers, tokenizers) and the operations that change who is listened to
//! ([`Control`]). Control operations block on ingest-thread replies: they run on the
//! control thread or off the executors (`mesh::ShardMesh::offload`), never on an
//! executor. Nothing here runs per block.

use crate::ingest::{Ingest, SocketOptions};
use crate::lifecycle::Lifecycle;
use crate::partition::Partition;
use crate::prompt::Prompts;
use crate::registry::{Endpoint, EventLimits, ListenerOpts, Registration, Registry, RegistryError};
use crate::ring::Rings;
use crate::shard::BlockBudget;
use crate::types::{DpRank, InstanceId};
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("{0}")]
    Endpoint(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("cannot listen: {0}")]
    Listen(#[from] crate::ingest::ListenError),
}

/// Where and how often to write local snapshots (`--snapshot-path`).
#[derive(Clone, Debug)]
pub struct SnapshotConfig {
    pub path: std::path::PathBuf,
    /// Zero: only on SIGTERM.
    pub interval: std::time::Duration,
}

/// What the service is built from (the validated command line).
#[derive(Clone, Debug)]
pub struct Config {
    /// Engine streams up to which `/metrics` has per-worker series.
    pub metrics_max_workers: usize,
    /// How the open-file limit is shared between HTTP and engines.
    pub descriptors: crate::descriptors::Descriptors,
    /// Executors, one shard each.
    pub shards: usize,
    /// The most shards one index's slots spread over (`--shards-per-index`).
    pub shards_per_index: usize,
    pub ingest_threads: usize,
    /// Ops per ingest→shard ring.
    pub ring_capacity: usize,
    pub snapshot: Option<SnapshotConfig>,
    /// What event data may create in the registry.
    pub event_limits: EventLimits,
    /// Per model, hybrid settings the events do not carry (`--attention-chunk-size`,
    /// `--hybrid-align-tokens`).
    pub hybrid: Vec<(String, crate::registry::HybridDefaults)>,
    pub sockets: SocketOptions,
    /// Tokenizers and chat templates for text queries (`--tokenizer`).
    pub prompts: Arc<Prompts>,
    pub speculation: Speculation,
    /// Most blocks over every index (`--max-blocks`); `None`: unbounded.
    pub max_blocks: Option<u64>,
    /// The tokenizing pool's threads, queue and caps (threads only with `--tokenizer`).
    pub tokenize: crate::tokenize::Limits,
    /// An executor whose heartbeat is older than this is stalled: `/ready` fails
    /// (`--stall-timeout-ms`).
    pub stall_after: std::time::Duration,
    /// The access log (`--access-log`), already started.
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
}

/// How `/speculate`'s predictions live.
#[derive(Clone, Debug, PartialEq)]
pub struct Speculation {
    /// TTL of a prediction when the request names none (`--speculative-ttl-ms`).
    pub ttl: std::time::Duration,
    /// Models whose workers publish no events (`--approximate`): predictions are
    /// their index, created on first use.
    pub approximate: Vec<String>,
    /// TTL of an approximate model's predictions (`--router-ttl-secs`).
    pub router_ttl: std::time::Duration,
    /// Blocks an approximate index may hold before it is pruned (`--router-max-tree-size`).
    pub max_tree_size: usize,
    /// Fraction of `max_tree_size` pruning brings it down to (`--router-prune-target-ratio`).
    pub prune_target_ratio: f64,
    /// The most live predictions an event-fed index holds, and the most blocks
    /// one request predicts (`--max-predictions`).
    pub max_predictions: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            ttl: std::time::Duration::from_millis(2000),
            approximate: Vec::new(),
            router_ttl: std::time::Duration::from_secs(120),
            max_tree_size: 1 << 20,
            prune_target_ratio: 0.8,
            max_predictions: crate::shard::DEFAULT_MAX_PREDICTIONS,
        }
    }
}

impl Speculation {
    pub fn is_approximate(&self, model: &str) -> bool {
        self.approximate.iter().any(|m| m == model)
    }
}

impl Config {
    pub fn new(shards: usize) -> Self {
        let descriptors = crate::descriptors::Descriptors::plan(
            crate::descriptors::raise_open_file_limit(),
            shards,
            shards,
            0,
            0,
        );
        Config {
            metrics_max_workers: 1024,
            descriptors,
            shards,
            shards_per_index: shards,
            ingest_threads: shards,
            ring_capacity: 16 * 1024,
            snapshot: None,
            event_limits: EventLimits::default(),
            hybrid: Vec::new(),
            sockets: SocketOptions {
                max_engines: descriptors.engines,
                ..SocketOptions::default()
            },
            prompts: Arc::default(),
            speculation: Speculation::default(),
            max_blocks: None,
            tokenize: crate::tokenize::Limits::default(),
            stall_after: std::time::Duration::from_secs(1),
            access_log: None,
        }
    }
}

/// Why a peer's `/dump` was not taken: the `reason` labels of
/// `kvix_peer_dump_failures_total`.
pub const PEER_DUMP_FAILURES: [&str; 5] = [
    "unreachable",
    "too_large",
    "too_many_blocks",
    "malformed",
    "broken_off",
];

/// Recovery counters (rare events only).
#[derive(Default, Debug)]
pub struct RecoveryStats {
    pub snapshots_written: AtomicU64,
    pub snapshot_failures: AtomicU64,
    /// Snapshots refused at start and moved aside.
    pub snapshots_rejected: AtomicU64,
    pub seeded_blocks: AtomicU64,
    /// Peer dumps not taken, by [`PEER_DUMP_FAILURES`] reason.
    pub peer_dump_failures: [AtomicU64; PEER_DUMP_FAILURES.len()],
}

impl RecoveryStats {
    /// Count a peer dump not taken for `reason` (one of [`PEER_DUMP_FAILURES`]).
    pub fn peer_dump_failed(&self, reason: &str) {
        if let Some(i) = PEER_DUMP_FAILURES.iter().position(|r| *r == reason) {
            self.peer_dump_failures[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Everything process-wide, shared by every executor, the ingest threads' owners and
/// the recovery thread.
pub struct App {
    control: Control,
    rings: Arc<Rings>,
    lifecycle: Lifecycle,
    recovery: RecoveryStats,
    snapshot: Option<SnapshotConfig>,
    prompts: Arc<Prompts>,
    speculation: Speculation,
    /// The bound on the blocks every shard together holds (`--max-blocks`).
    block_budget: Option<BlockBudget>,
    /// Text prompts' tokenization, off the executors and the control threads.
    tokenize: crate::tokenize::Pool,
    access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// Engine streams up to which `/metrics` has per-worker series.
    metrics_max_workers: usize,
}

impl App {
    /// Create the rings and start the ingest threads.
    pub fn new(cfg: &Config) -> Result<Arc<App>, String> {
        let shards = cfg.shards.max(1);
        let registry =
            Arc::new(Registry::with_limits(cfg.event_limits).with_hybrid(cfg.hybrid.clone()));
        let rings = Rings::partitioned(
            cfg.ingest_threads.max(1),
            Partition::new(shards, cfg.shards_per_index),
            cfg.ring_capacity.max(16),
        );
        let ingest = Ingest::start(rings.clone(), registry.clone(), cfg.sockets)?;
        Ok(Arc::new(App {
            control: Control {
                registry,
                ingest,
                peers: ArcSwap::default(),
            },
            rings,
            lifecycle: Lifecycle::new(shards, cfg.stall_after),
            recovery: RecoveryStats::default(),
            snapshot: cfg.snapshot.clone(),
            prompts: cfg.prompts.clone(),
            speculation: cfg.speculation.clone(),
            block_budget: cfg
                .max_blocks
                .map(|n| BlockBudget::new(n.clamp(1, usize::MAX as u64) as usize)),
            // Without a tokenizer no text is ever tokenized: no threads.
            tokenize: crate::tokenize::Pool::start(crate::tokenize::Limits {
                threads: if cfg.prompts.names().is_empty() {
                    0
                } else {
                    cfg.tokenize.threads.max(1)
                },
                ..cfg.tokenize
            })
            .expect("spawn tokenizing threads"),
            access_log: cfg.access_log.clone(),
            metrics_max_workers: cfg.metrics_max_workers,
        }))
    }

    /// Engine streams up to which `/metrics` has per-worker series
    /// (`--metrics-max-workers`); above, none, so a scrape stays small.
    pub fn metrics_max_workers(&self) -> usize {
        self.metrics_max_workers
    }

    /// The access log, when `--access-log` names one.
    pub fn access_log(&self) -> Option<&Arc<crate::access_log::AccessLog>> {
        self.access_log.as_ref()
    }

    pub fn control(&self) -> &Control {
        &self.control
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.control.registry
    }

    pub fn ingest(&self) -> &Arc<Ingest> {
        &self.control.ingest
    }

    pub fn rings(&self) -> &Arc<Rings> {
        &self.rings
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    pub fn recovery_stats(&self) -> &RecoveryStats {
        &self.recovery
    }

    pub fn snapshot_config(&self) -> Option<&SnapshotConfig> {
        self.snapshot.as_ref()
    }

    pub fn prompts(&self) -> &Arc<Prompts> {
        &self.prompts
    }

    pub fn speculation(&self) -> &Speculation {
        &self.speculation
    }

    /// The bound every shard shares; `None`: unbounded.
    pub fn block_budget(&self) -> Option<&BlockBudget> {
        self.block_budget.as_ref()
    }

    pub fn tokenize(&self) -> &crate::tokenize::Pool {
        &self.tokenize
    }
}

/// Who is listened to: registrations, their ZMQ listeners, and peers.
pub struct Control {
    registry: Arc<Registry>,
    ingest: Arc<Ingest>,
    /// Read lock-free by `/peers`; replaced whole on a change.
    peers: ArcSwap<Vec<String>>,
}

impl Control {
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn ingest(&self) -> &Arc<Ingest> {
        &self.ingest
    }

    /// Register a worker endpoint and start listening to it. Blocks until its
    /// ingest thread has connected the socket; on failure exactly this
    /// registration is undone.
    pub fn register(&self, reg: Registration) -> Result<(), ControlError> {
        crate::ingest::endpoint::validate(&reg.endpoint.endpoint)
            .map_err(ControlError::Endpoint)?;
        if let Some(r) = &reg.endpoint.replay_endpoint {
            crate::ingest::endpoint::validate(r).map_err(|e| {
                ControlError::Endpoint(format!("invalid replay endpoint `{r}`: {e}"))
            })?;
        }
        let done = self.registry.register(&reg)?;
        if let Err(e) = self.ingest.add(
            done.index,
            reg.instance,
            reg.dp,
            reg.block_size,
            reg.endpoint.clone(),
            reg.opts.clone(),
        ) {
            self.registry.undo(&reg, &done);
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
        let u = crate::registry::Unregistration {
            model,
            tenant,
            instance,
            dp,
        };
        for (index, dps, slots) in self.registry.unregister(&u)? {
            self.ingest.remove(crate::ingest::Removal {
                index,
                instance,
                dp,
                also_clear: slots,
            });
            removed.extend(dps);
        }
        Ok(removed)
    }

    pub fn add_peer(&self, url: String) {
        self.peers.rcu(|peers| {
            let mut next = Vec::clone(peers);
            if !next.contains(&url) {
                next.push(url.clone());
            }
            next
        });
    }

    pub fn remove_peer(&self, url: &str) -> bool {
        let before = self.peers.load().len();
        self.peers.rcu(|peers| {
            let mut next = Vec::clone(peers);
            next.retain(|p| p != url);
            next
        });
        self.peers.load().len() != before
    }

    pub fn peers(&self) -> Arc<Vec<String>> {
        self.peers.load_full()
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
