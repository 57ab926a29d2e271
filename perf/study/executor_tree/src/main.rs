//! Today's event path against an executor-owned engine map over an arena tree,
//! on one thread and the same frames (see README.md). A measurement, not the
//! product: the tree here stores blocks and holders and nothing else.

use hashbrown::HashTable;
use kvix::hash;
use kvix::ingest::feed::WorkerFeed;
use kvix::registry::{Endpoint, Registration, Registry};
use kvix::ring::OpSink;
use kvix::shard::table::{BlockTable, Keyed};
use kvix::shard::{Shard, ShardOp};
use kvix::types::{DpRank, EngineHash, InstanceId, SeqHash};
use kvix::wire::{self, Batch};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BS: usize = 16;
const WORKERS: usize = 16;
const CONVERSATIONS: usize = 60_000;
const STEPS: usize = 150_000;
/// Prompts looked up after the load.
const QUERIES: usize = 20_000;
/// Events per frame, as an engine batches them.
const EVENTS_PER_FRAME: usize = 16;

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A conversation: its blocks (a content seed each) and how many of them each
/// worker holds.
struct Conversation {
    blocks: Vec<u64>,
    worker: usize,
    held: [usize; WORKERS],
}

struct Workload {
    /// (worker, vLLM KVEventBatch frame)
    frames: Vec<(usize, Vec<u8>)>,
    /// Prompts to look up: the first 64 blocks (1k tokens) of some conversations.
    prompts: Vec<Vec<u64>>,
    blocks: usize,
    pairs: usize,
}

fn generate() -> Workload {
    let mut rng = 42u64;
    let mut next = || {
        rng = splitmix(rng);
        rng
    };
    let mut convs: Vec<Conversation> = (0..CONVERSATIONS)
        .map(|i| Conversation {
            blocks: Vec::new(),
            worker: i % WORKERS,
            held: [0; WORKERS],
        })
        .collect();
    let mut frames = Vec::new();
    let mut pending: Vec<Vec<Vec<u8>>> = vec![Vec::new(); WORKERS];
    let mut pairs = 0;
    for _ in 0..STEPS {
        let cv = &mut convs[(next() % CONVERSATIONS as u64) as usize];
        if next() % 100 < 14 && !cv.blocks.is_empty() {
            cv.worker = (next() % WORKERS as u64) as usize;
        }
        let w = cv.worker;
        for _ in 0..1 + next() % 48 {
            cv.blocks.push(next());
        }
        let (from, to) = (cv.held[w], cv.blocks.len());
        let mut ev = Vec::new();
        encode_stored(&mut ev, w, &cv.blocks, from, to);
        pairs += to - from;
        cv.held[w] = to;
        pending[w].push(ev);
        if pending[w].len() == EVENTS_PER_FRAME {
            frames.push((w, frame(&pending[w])));
            pending[w].clear();
        }
    }
    for (w, evs) in pending.iter().enumerate() {
        if !evs.is_empty() {
            frames.push((w, frame(evs)));
        }
    }
    let prompts = (0..QUERIES)
        .map(|_| {
            let c = &convs[(next() % CONVERSATIONS as u64) as usize];
            c.blocks.iter().take(64).copied().collect()
        })
        .collect();
    Workload {
        frames,
        prompts,
        blocks: convs.iter().map(|c| c.blocks.len()).sum(),
        pairs,
    }
}

/// Each worker names a block by its own engine hash (as vLLM processes do).
fn engine_hash(w: usize, content: u64, pos: usize) -> i64 {
    splitmix(content ^ (w as u64).wrapping_mul(0x1234_5678_9abc) ^ pos as u64) as i64
}

/// A block's token ids, from its content seed.
fn tokens(content: u64) -> [u32; BS] {
    let mut x = content;
    std::array::from_fn(|_| {
        x = splitmix(x);
        (x % 128_000) as u32
    })
}

/// A vLLM `BlockStored` of `blocks[from..to]`, parent `blocks[from - 1]`.
fn encode_stored(b: &mut Vec<u8>, w: usize, blocks: &[u64], from: usize, to: usize) {
    use rmp::encode::*;
    write_array_len(b, 7).unwrap();
    write_str(b, "BlockStored").unwrap();
    write_array_len(b, (to - from) as u32).unwrap();
    for (i, s) in blocks[from..to].iter().enumerate() {
        write_sint(b, engine_hash(w, *s, from + i)).unwrap();
    }
    if from == 0 {
        write_nil(b).unwrap();
    } else {
        write_sint(b, engine_hash(w, blocks[from - 1], from - 1)).unwrap();
    }
    write_array_len(b, ((to - from) * BS) as u32).unwrap();
    for s in &blocks[from..to] {
        for t in tokens(*s) {
            write_uint(b, t as u64).unwrap();
        }
    }
    write_uint(b, BS as u64).unwrap();
    write_nil(b).unwrap();
    write_str(b, "GPU").unwrap();
}

fn frame(events: &[Vec<u8>]) -> Vec<u8> {
    use rmp::encode::*;
    let mut b = Vec::new();
    write_array_len(&mut b, 3).unwrap();
    write_f64(&mut b, 1.7e9).unwrap();
    write_array_len(&mut b, events.len() as u32).unwrap();
    for e in events {
        b.extend_from_slice(e);
    }
    write_nil(&mut b).unwrap();
    b
}

/// Resident bytes once freed memory is given back, as the server's idle release
/// does (`kvix::heap`).
fn rss() -> usize {
    // SAFETY: releases free pages of this thread's heap and the arenas; reads no
    // caller memory.
    unsafe { libmimalloc_sys::mi_collect(true) };
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    s.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        * 4096
}

/// Stands in for the ring: the shard applies a frame's ops in ring-sized chunks.
struct VecSink(Vec<ShardOp>);

impl OpSink for VecSink {
    fn push(&mut self, op: ShardOp) {
        self.0.push(op);
    }
    fn broadcast(&mut self, op: ShardOp) {
        self.0.push(op);
    }
}

/// Today: `WorkerFeed` per worker (decode, hash, engine map), then one shard.
/// Returns seconds and RSS growth.
fn today(work: &Workload) -> (f64, usize) {
    let frames = &work.frames;
    let registry = Registry::default();
    let mut feeds = Vec::new();
    let mut index = None;
    for w in 0..WORKERS {
        let r = registry
            .register(&Registration {
                model: "m".into(),
                tenant: "default".into(),
                block_size: BS as u32,
                instance: w as InstanceId,
                dp: 0 as DpRank,
                endpoint: Endpoint {
                    endpoint: format!("tcp://127.0.0.1:{}", 1000 + w),
                    replay_endpoint: None,
                    publisher: None,
                },
                opts: Default::default(),
            })
            .unwrap();
        index = Some(r.index);
        feeds.push(WorkerFeed::new(r.index, w as InstanceId, 0, BS as u32));
    }
    let index = index.unwrap();
    let mut shard = Shard::default();
    let mut sink = VecSink(Vec::with_capacity(1 << 16));
    let mut batch = Batch::default();
    let before = rss();
    let t = Instant::now();
    for (w, p) in frames {
        wire::decode(p, &mut batch).unwrap();
        feeds[*w].apply(&batch, p, &registry, &mut sink);
        for ops in sink.0.chunks(kvix::ring::CHUNK) {
            shard.apply_all(ops);
        }
        sink.0.clear();
    }
    let secs = t.elapsed().as_secs_f64();
    let bytes = rss() - before;
    let seed = hash::block_seed(None, None);
    let prompts: Vec<Vec<SeqHash>> = work
        .prompts
        .iter()
        .map(|p| {
            let mut parent = None;
            p.iter()
                .map(|c| {
                    let seq = hash::chain(parent, hash::local_hash(&tokens(*c), seed));
                    parent = Some(seq);
                    seq
                })
                .collect()
        })
        .collect();
    let mut holders = Vec::new();
    let t = Instant::now();
    for p in &prompts {
        holders.clear();
        shard.lookup(index, p, &mut holders);
        std::hint::black_box(&holders);
    }
    report_queries(t.elapsed().as_secs_f64(), &work.prompts, holders.len());
    (secs, bytes)
}

const NONE: u32 = u32::MAX;

/// An engine hash (two halves) and the node it names: 12 bytes.
#[derive(Clone, Copy)]
struct EngineEntry([u32; 3]);

impl Keyed for EngineEntry {
    type Key = EngineHash;
    #[inline]
    fn key(&self) -> EngineHash {
        EngineHash(self.0[0] as u64 | (self.0[1] as u64) << 32)
    }
}

impl EngineEntry {
    fn new(eh: EngineHash, node: u32) -> Self {
        EngineEntry([eh.0 as u32, (eh.0 >> 32) as u32, node])
    }
}

/// One block: 24 bytes. Two holders inline (worker + 1, 0 for none), as the
/// shard's `HolderSet` keeps them; a third and later go to a side list.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Node {
    local: u64,
    first_child: u32,
    next_sibling: u32,
    holders: [u32; 2],
}

#[derive(Default)]
struct Tree {
    nodes: Vec<Node>,
    /// First blocks, by local hash.
    roots: HashTable<u32>,
    /// (node, worker) of every holder after a node's second.
    more_holders: Vec<(u32, u32)>,
    /// Holders filed after a node's first (inline or not).
    added_holders: usize,
    engine: Vec<BlockTable<EngineEntry>>,
}

fn spread(local: u64) -> u64 {
    local.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Tree {
    fn child(&self, parent: u32, local: u64) -> Option<u32> {
        let nodes = &self.nodes;
        if parent == NONE {
            return self
                .roots
                .find(spread(local), |&id| { nodes[id as usize].local } == local)
                .copied();
        }
        let mut c = nodes[parent as usize].first_child;
        while c != NONE {
            let n = nodes[c as usize];
            if { n.local } == local {
                return Some(c);
            }
            c = n.next_sibling;
        }
        None
    }

    fn store(&mut self, w: usize, parent: Option<EngineHash>, blocks: &[(EngineHash, u64)]) {
        let mut p = match parent {
            None => NONE,
            Some(eh) => match self.engine[w].get(&eh) {
                Some(e) => e.0[2],
                None => return,
            },
        };
        for &(eh, local) in blocks {
            let id = match self.child(p, local) {
                Some(id) => {
                    let h = w as u32 + 1;
                    let n = &mut self.nodes[id as usize];
                    let mut hs = n.holders;
                    if hs[0] != h && hs[1] != h {
                        self.added_holders += 1;
                        if hs[1] == 0 {
                            hs[1] = h;
                            n.holders = hs;
                        } else {
                            self.more_holders.push((id, h));
                        }
                    }
                    id
                }
                None => {
                    let id = self.nodes.len() as u32;
                    let sibling = if p == NONE {
                        NONE
                    } else {
                        self.nodes[p as usize].first_child
                    };
                    self.nodes.push(Node {
                        local,
                        first_child: NONE,
                        next_sibling: sibling,
                        holders: [w as u32 + 1, 0],
                    });
                    if p == NONE {
                        let nodes = &self.nodes;
                        self.roots
                            .insert_unique(spread(local), id, |&x| spread(nodes[x as usize].local));
                    } else {
                        self.nodes[p as usize].first_child = id;
                    }
                    id
                }
            };
            *self.engine[w].get_or_insert_with(eh, || EngineEntry::new(eh, id)) =
                EngineEntry::new(eh, id);
            p = id;
        }
    }
}

/// Proposed: decode and hash as the feed does, then the tree.
fn proposed(frames: &[(usize, Vec<u8>)], work: &Workload) -> (f64, usize) {
    let mut tree = Tree::default();
    tree.engine.resize_with(WORKERS, BlockTable::default);
    let mut batch = Batch::default();
    let seed = hash::block_seed(None, None);
    let mut blocks = Vec::new();
    let before = rss();
    let t = Instant::now();
    for (w, p) in frames {
        wire::decode(p, &mut batch).unwrap();
        for ev in batch.events(p) {
            blocks.clear();
            for (eh, chunk) in ev.hashes.iter().zip(ev.tokens.chunks_exact(BS)) {
                blocks.push((*eh, hash::local_hash(chunk, seed).0));
            }
            tree.store(*w, ev.parent, &blocks);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(tree.nodes.len(), work.blocks, "a block filed twice or lost");
    assert_eq!(tree.added_holders, work.pairs - work.blocks);
    let bytes = rss() - before;
    // Queries: local hashes computed beforehand (both sides hash the same way).
    let prompts: Vec<Vec<u64>> = work
        .prompts
        .iter()
        .map(|p| {
            p.iter()
                .map(|c| hash::local_hash(&tokens(*c), seed).0)
                .collect()
        })
        .collect();
    let mut holders = Vec::new();
    let t = Instant::now();
    for p in &prompts {
        tree.lookup(p, &mut holders);
        std::hint::black_box(&holders);
    }
    report_queries(t.elapsed().as_secs_f64(), &work.prompts, holders.len());
    (secs, bytes)
}

impl Tree {
    /// Holders of the prompt's blocks in prefix order, up to the first block
    /// nobody holds: `[n, holder..]` per block.
    fn lookup(&self, locals: &[u64], out: &mut Vec<u32>) {
        out.clear();
        let mut p = NONE;
        for &local in locals {
            let Some(id) = self.child(p, local) else {
                out.push(0);
                return;
            };
            let hs = self.nodes[id as usize].holders;
            let n = 1 + (hs[1] != 0) as u32;
            out.push(n);
            out.extend_from_slice(&hs[..n as usize]);
            p = id;
        }
    }
}

fn report_queries(secs: f64, prompts: &[Vec<u64>], last_len: usize) {
    let blocks: usize = prompts.iter().map(|p| p.len()).sum();
    eprintln!(
        "  {} lookups of {:.1} blocks on average: {:.0} ns a lookup (last answer {} words)",
        prompts.len(),
        blocks as f64 / prompts.len() as f64,
        secs * 1e9 / prompts.len() as f64,
        last_len
    );
}

fn main() {
    // As the server runs: small pages only, freed memory purged after 10 ms
    // (see its main.rs; option 15 is mimalloc's purge delay).
    // SAFETY: sets a flag on this process's memory map and an integer option of
    // the allocator; reads no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        libmimalloc_sys::mi_option_set(15, 10);
    }
    let which = std::env::args().nth(1).unwrap_or_default();
    let work = generate();
    let (secs, bytes) = match which.as_str() {
        "a" => today(&work),
        "b" => proposed(&work.frames, &work),
        _ => {
            eprintln!("usage: executor-tree-study a|b");
            std::process::exit(2);
        }
    };
    println!(
        "{which}: {} blocks, {} pairs ({:.2} a block): {:.1} ns and {:.1} B per pair",
        work.blocks,
        work.pairs,
        work.pairs as f64 / work.blocks as f64,
        secs * 1e9 / work.pairs as f64,
        bytes as f64 / work.pairs as f64
    );
}
