//! Today's event path against the radix index (`kvix::shard::tree`), on one
//! thread and the same frames (see README.md). A measurement, not the product.

use kvix::hash;
use kvix::ingest::feed::WorkerFeed;
use kvix::registry::{Endpoint, Registration, Registry};
use kvix::ring::OpSink;
use kvix::shard::tree::{Stored, Tree};
use kvix::shard::{Shard, ShardOp};
use kvix::types::{BlockHash, DpRank, InstanceId, SeqHash, Tier, WorkerSlot};
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

/// Proposed: decode and hash as the feed does, then the tree.
fn proposed(frames: &[(usize, Vec<u8>)], work: &Workload) -> (f64, usize) {
    let mut tree = Tree::default();
    let mut added = 0;
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
                blocks.push((*eh, hash::local_hash(chunk, seed)));
            }
            if let Stored::Filed { new_holders, .. } =
                tree.store(WorkerSlot(*w as u32), Tier::DEVICE, ev.parent, &blocks)
            {
                added += new_holders;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(tree.len(), work.blocks, "a block filed twice or lost");
    assert_eq!(added, work.pairs);
    let bytes = rss() - before;
    // Queries: local hashes computed beforehand (both sides hash the same way).
    let prompts: Vec<Vec<BlockHash>> = work
        .prompts
        .iter()
        .map(|p| {
            p.iter()
                .map(|c| hash::local_hash(&tokens(*c), seed))
                .collect()
        })
        .collect();
    let mut holders = Vec::new();
    let t = Instant::now();
    for p in &prompts {
        holders.clear();
        tree.lookup(p, &mut holders);
        std::hint::black_box(&holders);
    }
    report_queries(t.elapsed().as_secs_f64(), &work.prompts, holders.len());
    (secs, bytes)
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
