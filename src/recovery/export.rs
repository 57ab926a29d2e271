//! Export the running service's state as [`State`]: the one export behind `/dump` and
//! local snapshots.
//!
//! Gathers, in this order: every engine stream's last sequence number and every feed's
//! engine hashes (from the ingest threads), then each shard's blocks (each shard first
//! applies what its rings hold). So the blocks are at least as new as the recorded
//! sequence numbers, and replaying from `last_seq + 1` after a restart can only re-apply
//! events, never skip one. Shards are read one request at a time while ingestion goes
//! on: a weakly consistent snapshot, like Dynamo's `/dump`. Blocks are read one shard at
//! a time, so queries interleave; ordering runs off the executor.

use super::{IndexState, ListenerState, State, WorkerBlocks};
use crate::ingest::SeqKey;
use crate::ingest::feed::SeedBlock;
use crate::mesh::{ShardMesh, ShardUnavailable};
use crate::registry::{IndexInfo, Snapshot};
use crate::shard::DumpedBlock;
use crate::types::{EngineHash, SeqHash, ShardId, Tier, WorkerSlot};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One index as gathered: its registry entry, its feeds' engine hashes, its blocks.
type RawIndex = (
    Arc<IndexInfo>,
    Vec<(WorkerSlot, SeqHash, EngineHash)>,
    Vec<DumpedBlock>,
);

/// What the executor gathers for a snapshot; turned into a [`State`] off the executor.
pub struct Raw {
    /// The registry when gathered: it names the instances.
    snap: Arc<Snapshot>,
    seqs: HashMap<SeqKey, u64>,
    indexes: Vec<RawIndex>,
}

/// Gather sequence numbers, engine hashes (off the executor: they wait on the ingest
/// threads) and every shard's blocks.
pub async fn gather<M: ShardMesh>(mesh: &M) -> Result<Raw, ShardUnavailable> {
    let ingest = mesh.app().ingest().clone();
    let seqs: HashMap<_, _> = mesh
        .offload(move || ingest.seqs().into_iter().collect())
        .await;
    let snap = mesh.app().registry().snapshot_arc();
    let mut indexes = Vec::new();
    for ix in snap.live_indexes() {
        let (ingest, id) = (mesh.app().ingest().clone(), ix.id);
        let engine = mesh.offload(move || ingest.engine_hashes(id)).await;
        let mut blocks = Vec::new();
        for s in 0..mesh.shards() {
            blocks.append(&mut mesh.export(ShardId(s), ix.id).await?);
        }
        indexes.push((ix.clone(), engine, blocks));
    }
    Ok(Raw {
        snap: snap.clone(),
        seqs,
        indexes,
    })
}

impl Raw {
    /// Order every worker's blocks parents first and attach engine hashes (CPU work:
    /// about a second per million blocks, so it runs on the snapshot writer's thread).
    pub fn into_state(self) -> State {
        let mut state = State::default();
        for (ix, engine, blocks) in self.indexes {
            let engine: hashbrown::HashMap<(WorkerSlot, SeqHash), EngineHash> = engine
                .into_iter()
                .map(|(slot, seq, eh)| ((slot, seq), eh))
                .collect();
            let depth = crate::shard::chain_depths(&blocks);
            // Keys computed once: a hash lookup per comparison costs seconds at 1M blocks.
            let mut keyed: Vec<(WorkerSlot, u32, SeqHash, usize)> = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    (
                        b.holder.slot(),
                        depth.get(&b.seq).copied().unwrap_or(0),
                        b.seq,
                        i,
                    )
                })
                .collect();
            drop(depth);
            keyed.sort_unstable();
            let ext = |slot: WorkerSlot, seq: SeqHash| {
                engine
                    .get(&(slot, seq))
                    .copied()
                    .unwrap_or(EngineHash(seq.0))
            };
            let mut workers: BTreeMap<WorkerSlot, Vec<SeedBlock>> = BTreeMap::new();
            for k in &keyed {
                let b = &blocks[k.3];
                let slot = k.0;
                if !ix.slots.get(slot.0 as usize).is_some_and(|s| s.live) {
                    continue;
                }
                // A block from an engine's event (it has a local hash) but without an
                // engine hash was stored after the engine hashes were read: it arrives
                // live at a recovering peer, and in the replay after a restart (its batch
                // is newer than the recorded sequence). Exporting it under its sequence
                // hash would give the peer a block whose later remove cannot resolve.
                // Blocks stored by sequence hash alone (no tokens, local hash 0) have
                // no engine hash ever and are exported under their sequence hash.
                if b.local.0 != 0 && !engine.contains_key(&(slot, b.seq)) {
                    continue;
                }
                let out = workers.entry(slot).or_default();
                for t in 0..Tier::COUNT as u8 {
                    if b.holder.has(Tier(t)) {
                        out.push(SeedBlock {
                            engine: ext(slot, b.seq),
                            parent_engine: b.parent.map(|p| ext(slot, p)),
                            parent_seq: b.parent,
                            local: b.local,
                            tier: Tier(t),
                        });
                    }
                }
            }
            let mut listeners = Vec::new();
            for (inst, by_dp) in &ix.endpoints {
                for (dp, eps) in by_dp {
                    for ep in eps {
                        listeners.push(ListenerState {
                            instance: self.snap.instance_key(*inst),
                            dp: *dp,
                            endpoint: ep.clone(),
                            last_seq: self.seqs.get(&(*inst, *dp, ep.endpoint.clone())).copied(),
                        });
                    }
                }
            }
            state.indexes.push(IndexState {
                model: ix.model.clone(),
                tenant: ix.tenant.clone(),
                block_size: ix.block_size,
                listeners,
                workers: workers
                    .into_iter()
                    .map(|(slot, blocks)| {
                        let s = ix.slot(slot);
                        WorkerBlocks {
                            instance: self.snap.instance_key(s.instance),
                            dp: s.dp,
                            blocks,
                        }
                    })
                    .collect(),
            });
        }
        state
    }
}

/// The whole export: gather, then order off the executor.
pub async fn export<M: ShardMesh>(mesh: &M) -> Result<State, ShardUnavailable> {
    let raw = gather(mesh).await?;
    Ok(mesh.offload(move || raw.into_state()).await)
}
