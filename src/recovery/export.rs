//! The one export of the running service's state, behind `/dump` and local snapshots.
//!
//! Gathers, in this order: every engine stream's last sequence number (from the ingest
//! threads), then each shard's blocks and how its workers name them (each shard first
//! applies what its rings hold). So the blocks are at least as new as the recorded
//! sequence numbers, and replaying from `last_seq + 1` after a restart can only re-apply
//! events, never skip one. Shards are read one request at a time while ingestion goes
//! on: a weakly consistent snapshot, like Dynamo's `/dump`. Ordering (parents first per
//! worker) runs off the executor and keeps no per-block hash maps: sorted vectors and
//! binary search, so an export costs a few dozen bytes per (block, holder) pair.

use super::{IndexState, ListenerState, State, WorkerBlocks};
use crate::ingest::feed::{SeedBlock, SeedGroups};
use crate::ingest::{Ingest, SeqKey};
use crate::mesh::{ShardMesh, ShardUnavailable};
use crate::registry::{IndexInfo, Registry, Snapshot};
use crate::shard::tree::SlotGroups;
use crate::shard::{ExportedBlock, NO_NODE};
use crate::types::{DpRank, EngineHash, InstanceId, SeqHash, ShardId, Tier, WorkerSlot};
use std::collections::HashMap;
use std::sync::Arc;

/// One index, gathered and ordered.
pub struct IndexExport {
    pub info: Arc<IndexInfo>,
    blocks: Vec<ExportedBlock>,
    /// The exported pairs, grouped by slot (ascending), parents before children
    /// within a slot, each already named (so rendering does no lookups).
    order: Vec<Named>,
    /// Live slots with KV-cache groups besides full attention, by slot.
    groups: Vec<(WorkerSlot, SlotGroups)>,
}

/// One exported pair: its position in `blocks` and how the worker names the block
/// and its parent.
struct Named {
    at: u32,
    block: EngineHash,
    parent: Option<EngineHash>,
}

/// Every index's export plus the engine streams' last sequence numbers.
pub struct Export {
    /// The registry when gathered: it names the instances.
    snap: Arc<Snapshot>,
    seqs: HashMap<SeqKey, u64>,
    pub indexes: Vec<IndexExport>,
}

/// Gather sequence numbers (off the executor: they wait on the ingest threads) and
/// every shard's blocks and engine hashes, then order them off the executor.
pub async fn export<M: ShardMesh>(
    mesh: &M,
    ingest: Arc<Ingest>,
    registry: &Registry,
) -> Result<Export, ShardUnavailable> {
    let seqs: HashMap<_, _> = mesh
        .offload(move || ingest.seqs().into_iter().collect())
        .await;
    // After the sequence numbers, before the shards: it names what they export.
    let snap = registry.snapshot_arc();
    let mut indexes = Vec::new();
    for ix in snap.live_indexes() {
        let mut all = crate::shard::ShardExport::default();
        for s in 0..mesh.shards() {
            let mut e = mesh.export(ShardId(s), ix.id).await?;
            all.parts.append(&mut e.parts);
            all.names.append(&mut e.names);
            all.groups.append(&mut e.groups);
        }
        let info = ix.clone();
        // Joined off the executor: a copy of every pair at once would hold queries.
        indexes.push(
            mesh.offload(move || {
                let blocks = all.parts.concat();
                drop(all.parts);
                IndexExport::new(info, blocks, all.names).with_groups(all.groups)
            })
            .await,
        );
    }
    Ok(Export {
        snap: snap.clone(),
        seqs,
        indexes,
    })
}

/// Depth of every distinct block in its chain (0: a root, or a parent not exported),
/// as (sorted distinct sequence hashes, their parents, their depths).
fn depths(blocks: &[ExportedBlock]) -> (Vec<SeqHash>, Vec<u32>) {
    let mut nodes: Vec<(SeqHash, Option<SeqHash>)> =
        blocks.iter().map(|b| (b.seq, b.parent)).collect();
    nodes.sort_unstable_by_key(|n| n.0);
    nodes.dedup_by_key(|n| n.0);
    let find = |s: SeqHash| nodes.binary_search_by_key(&s, |n| n.0).ok();
    const UNKNOWN: u32 = u32::MAX;
    let mut depth = vec![UNKNOWN; nodes.len()];
    let mut chain = Vec::new();
    for i in 0..nodes.len() {
        let mut cur = i;
        // Walk up to a block of known depth or a root; a cycle (corrupt input) ends
        // the walk once the chain is as long as the set.
        let base = loop {
            if depth[cur] != UNKNOWN {
                break depth[cur] + 1;
            }
            chain.push(cur);
            match nodes[cur].1.and_then(find) {
                Some(p) if chain.len() <= nodes.len() => cur = p,
                _ => break 0,
            }
        };
        for (k, n) in chain.drain(..).rev().enumerate() {
            depth[n] = base + k as u32;
        }
    }
    (nodes.into_iter().map(|n| n.0).collect(), depth)
}

impl IndexExport {
    /// Order the pairs (CPU work: run it off the executor). Pairs of slots no longer
    /// live are left out, and so is a block from an engine's event (it has a local
    /// hash) without an engine hash: it was stored after the engine hashes were read,
    /// so it arrives live at a recovering peer and in the replay after a restart (its
    /// batch is newer than the recorded sequence), while exporting it under its
    /// sequence hash would give the peer a block whose later remove cannot resolve.
    /// Blocks stored by sequence hash alone (no tokens, local hash 0) never have an
    /// engine hash and are exported under their sequence hash.
    pub fn new(
        info: Arc<IndexInfo>,
        blocks: Vec<ExportedBlock>,
        mut names: Vec<(WorkerSlot, u32, EngineHash)>,
    ) -> Self {
        // A worker's engine hashes by node, then by sequence hash through the blocks.
        names.sort_unstable_by_key(|e| (e.0, e.1));
        let mut engine: Vec<(WorkerSlot, SeqHash, EngineHash)> = blocks
            .iter()
            .filter(|b| b.node != NO_NODE)
            .filter_map(|b| {
                let slot = b.holder.slot();
                let i = names
                    .binary_search_by_key(&(slot, b.node), |e| (e.0, e.1))
                    .ok()?;
                Some((slot, b.seq, names[i].2))
            })
            .collect();
        drop(names);
        engine.sort_unstable_by_key(|e| (e.0, e.1));
        engine.dedup_by_key(|e| (e.0, e.1));
        let engine_of = |slot: WorkerSlot, seq: SeqHash| {
            engine
                .binary_search_by_key(&(slot, seq), |e| (e.0, e.1))
                .ok()
                .map(|i| engine[i].2)
        };
        let (seqs, depth) = depths(&blocks);
        let mut keyed: Vec<(u32, u32, u32)> = blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                let slot = b.holder.slot();
                info.slots.get(slot.0 as usize).is_some_and(|s| s.live)
                    && (b.local.0 == 0 || engine_of(slot, b.seq).is_some())
            })
            .map(|(i, b)| {
                let d = seqs.binary_search(&b.seq).map(|k| depth[k]).unwrap_or(0);
                (b.holder.slot().0, d, i as u32)
            })
            .collect();
        drop((seqs, depth));
        keyed.sort_unstable();
        let order = keyed
            .into_iter()
            .map(|(_, _, at)| {
                let b = &blocks[at as usize];
                let slot = b.holder.slot();
                let name = |seq: SeqHash| engine_of(slot, seq).unwrap_or(EngineHash(seq.0));
                Named {
                    at,
                    block: name(b.seq),
                    parent: b.parent.map(name),
                }
            })
            .collect();
        IndexExport {
            info,
            blocks,
            order,
            groups: Vec::new(),
        }
    }

    /// The index's slots with other KV-cache groups (those of slots no longer
    /// live are left out, as their blocks are).
    pub fn with_groups(mut self, mut groups: Vec<(WorkerSlot, SlotGroups)>) -> Self {
        let info = &self.info;
        groups.retain(|(s, _)| info.slots.get(s.0 as usize).is_some_and(|s| s.live));
        groups.sort_unstable_by_key(|g| g.0);
        self.groups = groups;
        self
    }

    /// Every live slot with other KV-cache groups: its instance, dp rank and
    /// groups, by slot.
    pub fn slot_groups(&self) -> impl Iterator<Item = (InstanceId, DpRank, SeedGroups)> + '_ {
        self.groups.iter().map(|(slot, g)| {
            let s = self.info.slot(*slot);
            (s.instance, s.dp, seed_groups(g))
        })
    }

    fn groups_of(&self, slot: WorkerSlot) -> SeedGroups {
        self.groups
            .binary_search_by_key(&slot, |g| g.0)
            .map(|i| seed_groups(&self.groups[i].1))
            .unwrap_or_default()
    }

    /// Exported (block, holder) pairs.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The `k`-th pair in export order as its worker and one [`SeedBlock`] per tier
    /// it is held on, appended to `out`. Block and parent are named by the worker's
    /// engine hashes where known, else by sequence hashes.
    pub fn pair(&self, k: usize, out: &mut Vec<SeedBlock>) -> (WorkerSlot, InstanceId, DpRank) {
        let n = &self.order[k];
        let b = &self.blocks[n.at as usize];
        let slot = b.holder.slot();
        for t in 0..Tier::COUNT as u8 {
            if b.holder.has(Tier(t)) {
                out.push(SeedBlock {
                    engine: n.block,
                    parent_engine: n.parent,
                    parent_seq: b.parent,
                    local: b.local,
                    tier: Tier(t),
                    groups: b.groups,
                });
            }
        }
        let s = self.info.slot(slot);
        (slot, s.instance, s.dp)
    }
}

/// A slot's groups as recovered state records them (the index's block size
/// is the index's own).
fn seed_groups(g: &SlotGroups) -> SeedGroups {
    SeedGroups {
        groups: g.groups.clone(),
        align: g.align,
    }
}

impl Export {
    /// How routers name `id` (an integer, or a Mooncake name).
    pub fn instance_key(&self, id: InstanceId) -> crate::registry::InstanceKey {
        self.snap.instance_key(id)
    }

    /// Everything as recovered-state records (for a snapshot).
    pub fn into_state(self) -> State {
        let mut state = State::default();
        let mut tiers = Vec::new();
        for ix in self.indexes {
            let mut workers: Vec<(WorkerSlot, WorkerBlocks)> = Vec::new();
            for k in 0..ix.len() {
                tiers.clear();
                let (slot, instance, dp) = ix.pair(k, &mut tiers);
                if workers.last().is_none_or(|w| w.0 != slot) {
                    workers.push((
                        slot,
                        WorkerBlocks {
                            instance: self.snap.instance_key(instance),
                            dp,
                            blocks: Vec::new(),
                            groups: ix.groups_of(slot),
                        },
                    ));
                }
                if let Some(w) = workers.last_mut() {
                    w.1.blocks.append(&mut tiers);
                }
            }
            let info = &ix.info;
            let mut listeners = Vec::new();
            for (inst, by_dp) in &info.endpoints {
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
                model: info.model.clone(),
                tenant: info.tenant.clone(),
                block_size: info.block_size,
                listeners,
                workers: workers.into_iter().map(|w| w.1).collect(),
            });
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::holders::Holder;
    use crate::types::BlockHash;

    fn block(seq: u64, parent: Option<u64>, slot: u32) -> ExportedBlock {
        ExportedBlock {
            seq: SeqHash(seq),
            parent: parent.map(SeqHash),
            local: BlockHash(seq + 1000),
            holder: Holder::new(WorkerSlot(slot), Tier::DEVICE.bit()),
            node: NO_NODE,
            groups: 0,
        }
    }

    #[test]
    fn parents_come_first_per_worker_and_cycles_end() {
        // Chain 30 → 20 → 10 given children first, plus a two-block cycle.
        let blocks = vec![
            block(10, Some(20), 0),
            block(20, Some(30), 0),
            block(30, None, 0),
            block(7, Some(8), 0),
            block(8, Some(7), 0),
        ];
        let (seqs, depth) = depths(&blocks);
        let d = |s: u64| depth[seqs.binary_search(&SeqHash(s)).unwrap()];
        assert_eq!((d(30), d(20), d(10)), (0, 1, 2));
        assert!(d(7) < 10 && d(8) < 10);
    }
}
