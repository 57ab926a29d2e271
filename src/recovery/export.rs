//! Export the running service's state as [`State`] (for local snapshots).
//!
//! Gathers, in this order: every engine stream's last sequence number and every feed's
//! engine hashes (from the ingest threads), then each shard's blocks (each shard first
//! applies what its rings hold). So the blocks are at least as new as the recorded
//! sequence numbers, and replaying from `last_seq + 1` after a restart can only re-apply
//! events, never skip one. Shards are read one request at a time while ingestion goes
//! on: a weakly consistent snapshot, like Dynamo's `/dump`.

use super::{IndexState, ListenerState, State, WorkerBlocks};
use crate::ingest::feed::SeedBlock;
use crate::runtime::Core;
use crate::shard::DumpedBlock;
use crate::types::{EngineHash, SeqHash, Tier, WorkerSlot};
use std::collections::{BTreeMap, HashMap};

/// Depth of every block in its chain (0 = root or parent missing), so that sorting by
/// depth puts parents before children.
pub fn depths(blocks: &[DumpedBlock]) -> HashMap<SeqHash, u32> {
    let parent_of: HashMap<SeqHash, Option<SeqHash>> =
        blocks.iter().map(|b| (b.seq, b.parent)).collect();
    let mut depth: HashMap<SeqHash, u32> = HashMap::with_capacity(parent_of.len());
    let mut chain = Vec::new();
    for b in blocks {
        let mut cur = b.seq;
        let base = loop {
            if let Some(d) = depth.get(&cur) {
                break d + 1;
            }
            chain.push(cur);
            match parent_of.get(&cur).copied().flatten() {
                Some(p) if parent_of.contains_key(&p) && chain.len() <= parent_of.len() => cur = p,
                _ => break 0,
            }
        };
        for (i, s) in chain.drain(..).rev().enumerate() {
            depth.insert(s, base + i as u32);
        }
    }
    depth
}

pub async fn export(core: &Core) -> State {
    let app = &core.app;
    let seqs: HashMap<_, _> = app.ingest.seqs().into_iter().collect();
    let snap = app.registry.snapshot_arc();
    let mut state = State::default();
    for ix in snap.live_indexes() {
        let engine: HashMap<(WorkerSlot, SeqHash), EngineHash> = app
            .ingest
            .engine_hashes(ix.id)
            .into_iter()
            .map(|(slot, seq, eh)| ((slot, seq), eh))
            .collect();
        let blocks = core.dump(ix.id).await;
        let depth = depths(&blocks);
        let mut order: Vec<&DumpedBlock> = blocks.iter().collect();
        order.sort_by_key(|b| {
            (
                b.holder.slot(),
                depth.get(&b.seq).copied().unwrap_or(0),
                b.seq,
            )
        });
        let ext = |slot: WorkerSlot, seq: SeqHash| {
            engine
                .get(&(slot, seq))
                .copied()
                .unwrap_or(EngineHash(seq.0))
        };
        let mut workers: BTreeMap<WorkerSlot, Vec<SeedBlock>> = BTreeMap::new();
        for b in order {
            let slot = b.holder.slot();
            if !ix.slots.get(slot.0 as usize).is_some_and(|s| s.live) {
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
        for (inst, eps) in &ix.endpoints {
            for (dp, ep) in eps {
                listeners.push(ListenerState {
                    instance: *inst,
                    dp: *dp,
                    endpoint: ep.clone(),
                    last_seq: seqs.get(&(*inst, *dp, ep.endpoint.clone())).copied(),
                });
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
                        instance: s.instance,
                        dp: s.dp,
                        blocks,
                    }
                })
                .collect(),
        });
    }
    state
}
