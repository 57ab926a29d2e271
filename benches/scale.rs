//! How one shard's cost grows with the index: memory per block and query latency
//! at 1M, 10M and 50M blocks (the service adds the engine-hash maps, HTTP and the
//! hop between cores on top; `perf/compare.sh` measures those end to end).
//!
//! Blocks come as chains of 64 (a 1k-token prompt at block size 16), each held by
//! one of 16 workers on the device tier, stored through `Shard::apply` as events
//! are. A query is a stored chain's 64 sequence hashes: lookup and gather on the
//! shard, timed one by one over random chains (cold caches, as in service).
//! Run: `cargo bench --bench scale` (`-- 1,10` for the smaller sizes only).

use kvix::score;
use kvix::shard::{Prompt, Shard, ShardOp};
use kvix::types::{BlockHash, EngineHash, IndexId, SeqHash, Tier, WorkerSlot};
use std::time::Instant;

const CHAIN: u64 = 64;
const WORKERS: u32 = 16;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The kvix-style hash chain of chain `c`: distinct, uniformly spread hashes.
fn chain(c: u64, out: &mut Vec<SeqHash>) {
    out.clear();
    let mut parent = xxhash_rust::xxh3::xxh3_64(&c.to_le_bytes());
    out.push(SeqHash(parent));
    for i in 1..CHAIN {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&parent.to_le_bytes());
        b[8..].copy_from_slice(&i.to_le_bytes());
        parent = xxhash_rust::xxh3::xxh3_64(&b);
        out.push(SeqHash(parent));
    }
}

fn main() {
    // As the service runs: freed memory goes back to the OS at once (kvix's main
    // sets mimalloc's purge delay, option 15, to 0), so RSS is what the shard holds.
    // SAFETY: sets a process-wide integer option before any other thread exists.
    unsafe { libmimalloc_sys::mi_option_set(15, 0) };
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary
    // without it, and then a small index only checks that it works.
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<f64> = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.split(',').filter_map(|m| m.parse().ok()).collect())
        .unwrap_or_else(|| {
            if bench {
                vec![1.0, 10.0, 50.0]
            } else {
                vec![0.05]
            }
        });
    let queries = if bench { 20_000 } else { 1_000 };
    println!("| blocks | RSS / block | query p50 | query p99 | apply ns / block |");
    println!("|---|---|---|---|---|");
    for millions in sizes {
        let chains = ((millions * 1e6) as u64 / CHAIN).max(1);
        let rss0 = rss_bytes();
        let mut shard = Shard::default();
        let mut seqs = Vec::with_capacity(CHAIN as usize);
        let t = Instant::now();
        for c in 0..chains {
            chain(c, &mut seqs);
            let mut parent = None;
            for &seq in seqs.iter() {
                let block = EngineHash(seq.0);
                shard.apply(ShardOp::Store {
                    index: IndexId(0),
                    slot: WorkerSlot((c % WORKERS as u64) as u32),
                    tier: Tier::DEVICE,
                    parent,
                    block,
                    local: BlockHash(seq.0),
                    by_seq: false,
                    event_start: parent.is_none(),
                });
                parent = Some(block);
            }
        }
        let apply_ns = t.elapsed().as_nanos() as f64 / (chains * CHAIN) as f64;
        let per_block = (rss_bytes().saturating_sub(rss0)) as f64 / (chains * CHAIN) as f64;
        let mut lat = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..queries {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chain(x % chains, &mut seqs);
            let t = Instant::now();
            let locals: Vec<BlockHash> = seqs.iter().map(|s| BlockHash(s.0)).collect();
            let r = kvix::shard::answer(&mut shard, IndexId(0), Prompt::Locals(&locals));
            let ov = score::gather(&score::merge(vec![r]), WORKERS as usize, |_| true);
            std::hint::black_box(ov);
            lat.record(t.elapsed().as_nanos() as u64).ok();
        }
        println!(
            "| {millions}M | {per_block:.1} B | {:.1} µs | {:.1} µs | {apply_ns:.0} |",
            lat.value_at_quantile(0.5) as f64 / 1000.0,
            lat.value_at_quantile(0.99) as f64 / 1000.0,
        );
        drop(shard);
    }
}
