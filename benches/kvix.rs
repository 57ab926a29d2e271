//! Micro-benchmarks of each stage of both data flows, plus the index ceiling.
//!
//! Events: hashing per 1k tokens, msgpack decode per block (vLLM, SGLang),
//! shard apply per block. Queries: a 512-block prompt against 1M indexed
//! blocks (lookup + gather, and with hashing), scatter/gather cost vs shard
//! count, a 1k-token body's ids read, a 64-worker reply rendered. Cross-core:
//! an op through an SPSC ring, a round trip over the executor mesh. Ceiling:
//! raw hashbrown lookups on a 1M-entry table. Index structures: today's
//! engine-hash map plus block table against the radix tree, per stored (block,
//! worker) pair and per prompt looked up.
//! Run: `cargo bench --bench kvix` (add `-- <filter>` for one group).

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvix::hash;
use kvix::ring::{OpSink, RingSink, Rings};
use kvix::score;
use kvix::shard::{Prompt, SeqHasherBuilder, Shard, ShardOp};
use kvix::types::{BlockHash, EngineHash, IndexId, SeqHash, ShardId, Tier, WorkerSlot};
use kvix::wire::{self, Batch};
use std::hint::black_box;

const BS: usize = 16;

/// `n` when measuring (`cargo bench` passes `--bench`), a small fraction of it when
/// `cargo test` runs each bench once as a smoke test in a debug build, so the test
/// suite checks that every bench runs without building million-block indexes.
fn sized(n: usize) -> usize {
    if std::env::args().any(|a| a == "--bench") {
        n
    } else {
        (n / 256).max(64)
    }
}

/// Deterministic pseudo-random tokens (splitmix64).
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % 128_000) as u32
        })
        .collect()
}

fn bench_hash(c: &mut Criterion) {
    let t = tokens(1024, 1);
    let seed = hash::block_seed(None, None);
    let mut g = c.benchmark_group("hash");
    g.throughput(Throughput::Elements(1024));
    let mut out = Vec::new();
    g.bench_function("seq_hashes_1k_tokens_bs16", |b| {
        b.iter(|| hash::seq_hashes_for_tokens(black_box(&t), BS, seed, &mut out))
    });
    g.finish();
}

/// A vLLM positional batch with one BlockStored of `blocks` blocks; `sglang` drops the
/// medium/lora tail and adds `attn_dp_rank`.
fn stored_payload(blocks: usize, sglang: bool) -> Vec<u8> {
    stored_payload_seeded(blocks, sglang, 7)
}

fn stored_payload_seeded(blocks: usize, sglang: bool, seed: u64) -> Vec<u8> {
    use rmp::encode::*;
    let t = tokens(blocks * BS, seed);
    let mut b = Vec::new();
    write_array_len(&mut b, 3).unwrap();
    write_f64(&mut b, 1.7e9).unwrap();
    write_array_len(&mut b, 1).unwrap();
    write_array_len(&mut b, if sglang { 6 } else { 7 }).unwrap();
    write_str(&mut b, "BlockStored").unwrap();
    write_array_len(&mut b, blocks as u32).unwrap();
    for i in 0..blocks {
        write_sint(
            &mut b,
            (i as i64 + 1 + seed as i64 * 1000).wrapping_mul(-7_919_000_000_123),
        )
        .unwrap();
    }
    write_nil(&mut b).unwrap();
    write_array_len(&mut b, t.len() as u32).unwrap();
    for x in &t {
        write_uint(&mut b, *x as u64).unwrap();
    }
    write_uint(&mut b, BS as u64).unwrap();
    write_nil(&mut b).unwrap();
    if !sglang {
        write_str(&mut b, "GPU").unwrap();
    }
    write_uint(&mut b, 0).unwrap();
    b
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    for (name, sglang) in [("vllm", false), ("sglang", true)] {
        let p = stored_payload(32, sglang);
        let mut batch = Batch::default();
        g.throughput(Throughput::Elements(32));
        g.bench_function(BenchmarkId::new(name, "32_blocks_bs16"), |b| {
            b.iter(|| wire::decode(black_box(&p), &mut batch).unwrap())
        });
    }
    // An engine's frame of a long prefill: token ids of mixed widths in no
    // repeating pattern (a small payload, decoded again and again, is one the
    // branch predictor learns).
    let p = stored_payload_seeded(4096, false, 7);
    let mut batch = Batch::default();
    g.throughput(Throughput::Elements(4096));
    g.bench_function(BenchmarkId::new("vllm", "4096_blocks_bs16"), |b| {
        b.iter(|| wire::decode(black_box(&p), &mut batch).unwrap())
    });
    g.finish();
}

fn seqs(n: usize, seed: u64) -> Vec<SeqHash> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            SeqHash(xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes()))
        })
        .collect()
}

/// A block as a shard sees it.
#[derive(Clone, Copy)]
struct Block {
    seq: SeqHash,
    parent: Option<SeqHash>,
    local: BlockHash,
}

/// One chain of `n` blocks (each the parent of the next) hashed as kvix hashes
/// engines' blocks, so the shard files them as real traffic's.
fn chain(n: usize, seed: u64) -> Vec<Block> {
    let mut parent = None;
    seqs(n, seed)
        .into_iter()
        .map(|x| {
            let local = BlockHash(x.0);
            let seq = hash::chain(parent, local);
            let b = Block { seq, parent, local };
            parent = Some(seq);
            b
        })
        .collect()
}

/// A store of `b` by `slot`, the engine naming blocks by their sequence hashes.
fn store(b: &Block, slot: u32) -> ShardOp {
    ShardOp::Store {
        index: IndexId(0),
        slot: WorkerSlot(slot),
        tier: Tier::DEVICE,
        parent: b.parent.map(|p| EngineHash(p.0)),
        block: EngineHash(b.seq.0),
        local: b.local,
        by_seq: false,
        event_start: false,
    }
}

fn remove(b: &Block, slot: u32) -> ShardOp {
    ShardOp::Remove {
        index: IndexId(0),
        slot: WorkerSlot(slot),
        block: EngineHash(b.seq.0),
        tiers: kvix::types::TierSet::ALL,
    }
}

fn bench_apply(c: &mut Criterion) {
    let n = sized(100_000);
    let s = chain(n, 3);
    let mut g = c.benchmark_group("shard_apply");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("store_new_blocks", |b| {
        b.iter_batched(
            Shard::default,
            |mut shard| {
                for q in &s {
                    shard.apply(store(q, 0));
                }
                shard
            },
            BatchSize::LargeInput,
        )
    });
    // Steady state: a warm shard, every op adds a second holder then removes it.
    let mut warm = Shard::default();
    for q in &s {
        warm.apply(store(q, 0));
    }
    g.throughput(Throughput::Elements(2 * n as u64));
    g.bench_function("add_remove_holder_warm", |b| {
        b.iter(|| {
            for q in &s {
                warm.apply(store(q, 1));
                warm.apply(remove(q, 1));
            }
        })
    });
    g.finish();

    // A table far larger than the caches, as a live index is: every store misses.
    // The ring hands the shard chunks of ops; `apply_all` loads the buckets of the
    // ops a few places ahead, `apply` one op at a time does not.
    let n = sized(2_000_000);
    let big: Vec<ShardOp> = chain(n, 3).iter().map(|q| store(q, 0)).collect();
    let mut g = c.benchmark_group("shard_apply_2m_blocks");
    g.sample_size(10);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("store_one_by_one", |b| {
        b.iter_batched(
            Shard::default,
            |mut shard| {
                for op in &big {
                    shard.apply(*op);
                }
                shard
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("store_chunks_prefetched", |b| {
        b.iter_batched(
            Shard::default,
            |mut shard| {
                for ops in big.chunks(kvix::ring::CHUNK) {
                    shard.apply_all(ops);
                }
                shard
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// What `/speculate` costs a shard: a prompt of new blocks predicted, a prediction
/// on blocks others hold confirmed by the worker's store, and expiry.
fn bench_predict(c: &mut Criterion) {
    let n = sized(100_000);
    let s = chain(n, 5);
    let locals: Vec<BlockHash> = s.iter().map(|b| b.local).collect();
    let mut g = c.benchmark_group("predict");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("predict_new_blocks", |b| {
        b.iter_batched(
            Shard::default,
            |mut shard| {
                shard.predict(IndexId(0), WorkerSlot(0), &locals, 100);
                shard
            },
            BatchSize::LargeInput,
        )
    });
    let mut warm = Shard::default();
    for q in &s {
        warm.apply(store(q, 0));
    }
    let mut now = 0u32;
    g.bench_function("predict_confirm_remove_warm", |b| {
        b.iter(|| {
            now += 1;
            warm.predict(IndexId(0), WorkerSlot(1), &locals, now);
            for q in &s {
                warm.apply(store(q, 1));
            }
            for q in s.iter().rev() {
                warm.apply(remove(q, 1));
            }
            warm.expire(now);
        })
    });
    // An hour-long prediction of every block, and an executor expiring every tick
    // for 4 s (the old wheel's lap): what long predictions cost while they wait.
    g.bench_function("wait_4s_hour_long", |b| {
        b.iter_batched(
            || {
                let mut shard = Shard::default();
                shard.predict(IndexId(0), WorkerSlot(2), &locals, 225_000);
                shard
            },
            |mut shard| {
                for now in 1..250 {
                    shard.expire(now);
                }
                shard
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("expire", |b| {
        b.iter_batched(
            || {
                let mut shard = Shard::default();
                for q in &s {
                    shard.apply(store(q, 0));
                }
                shard.predict(IndexId(0), WorkerSlot(2), &locals, 1000);
                shard
            },
            |mut shard| {
                while shard.expire(1000) {}
                assert_eq!(shard.predictions.expired, n as u64);
                shard
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// A shard bounded at 100k blocks and full, storing 100k new ones: each store evicts
/// one, against the same stores into an unbounded shard.
fn bench_evict(c: &mut Criterion) {
    let n = sized(100_000);
    let old = chain(n, 7);
    let new = chain(n, 8);
    let mut g = c.benchmark_group("evict");
    g.throughput(Throughput::Elements(n as u64));
    // One chain far past a bound of a hundredth of it: it has one leaf at a time,
    // evicted from its end in steps (a victim is never a walk of the arena).
    g.bench_function("chain_past_budget", |b| {
        b.iter_batched(
            || {
                let mut shard = Shard::default();
                shard.set_block_budget(Some(kvix::shard::BlockBudget::new(n / 100)));
                shard
            },
            |mut shard| {
                let ops: Vec<ShardOp> = new.iter().map(|q| store(q, 1)).collect();
                shard.apply_all(&ops);
                assert_eq!(shard.evicted as usize, n - n / 100);
                shard
            },
            BatchSize::LargeInput,
        )
    });
    for (name, budget) in [("store_unbounded", None), ("store_evicting", Some(n))] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut shard = Shard::default();
                    shard.set_block_budget(budget.map(kvix::shard::BlockBudget::new));
                    for q in &old {
                        shard.apply(store(q, 0));
                    }
                    shard
                },
                |mut shard| {
                    for q in &new {
                        shard.apply(store(q, 1));
                    }
                    shard
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

/// `prompts` chains of 512 blocks, prompt `i` held by slot `i % 16`, spread over `n`
/// shards by slot.
fn indexed(n: usize, prompts: usize) -> (Vec<Shard>, Vec<Vec<BlockHash>>) {
    let mut shards: Vec<Shard> = (0..n).map(|_| Shard::default()).collect();
    let mut chains = Vec::new();
    for p in 0..prompts {
        let blocks = chain(512, 1000 + p as u64);
        let slot = WorkerSlot((p % 16) as u32);
        let owner = kvix::partition::Partition::spread_over(n)
            .shard_of(IndexId(0), slot)
            .0;
        let ops: Vec<ShardOp> = blocks.iter().map(|q| store(q, slot.0)).collect();
        shards[owner].apply_all(&ops);
        chains.push(blocks.iter().map(|q| q.local).collect());
    }
    (shards, chains)
}

/// A `/query` body's token ids as JSON text, read into ids (the largest kvix-side
/// cost of a token-id query before hashing).
fn bench_token_ids(c: &mut Criterion) {
    let ids = tokens(1024, 5);
    let text = format!(
        "[{}]",
        ids.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut g = c.benchmark_group("token_ids");
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("json_array_1k", |b| {
        b.iter(|| kvix::http::token_ids::plain_u32_array(black_box(text.as_bytes())).unwrap())
    });
    g.finish();
}

/// A score reply rendered for 64 live workers (one dp rank each) whose matched
/// prefixes differ, much like the JSON a shared-prefix query gets back (~5.6 KB).
fn bench_render(c: &mut Criterion) {
    use kvix::registry::{IndexInfo, SlotInfo, Snapshot};
    use std::sync::Arc;
    let workers = 64u32;
    let ix = Arc::new(IndexInfo {
        id: IndexId(0),
        model: "m".into(),
        tenant: "t".into(),
        block_size: BS as u32,
        slots: (0..workers)
            .map(|w| SlotInfo {
                instance: 1000 + w as kvix::types::InstanceId,
                dp: 0,
                live: true,
            })
            .collect(),
        slot_of: Default::default(),
        endpoints: Default::default(),
        live_predictions: Default::default(),
    });
    let snap = Snapshot::default();
    let ov = score::Overlap {
        matched: (0..workers)
            .map(|w| {
                let m = 40 + (w * 7) % 24;
                [m, m, m]
            })
            .collect(),
        frequencies: (0..64).map(|d| workers - d / 2).collect(),
        tree_sizes: (0..workers).map(|w| 20_000 + w * 13).collect(),
        effective: (0..workers).map(|w| 40 + (w * 7) % 24).collect(),
    };
    let live = |_| true;
    let mut g = c.benchmark_group("render");
    g.bench_function("scores_64_workers", |b| {
        b.iter(|| kvix::http::json::scores(&snap, &ix, black_box(&ov), None, &live))
    });
    g.finish();
}

fn bench_query(c: &mut Criterion) {
    let mut g = c.benchmark_group("query_512_blocks_1M_indexed");
    for n in [1usize, 2, 4] {
        let (mut shards, chains) = indexed(n, sized(2048));
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("answer_merge_gather", n), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 7) % chains.len();
                let q = Prompt::Locals(&chains[i]);
                let replies: Vec<_> = shards
                    .iter_mut()
                    .map(|sh| kvix::shard::answer(sh, IndexId(0), q))
                    .collect();
                black_box(score::gather(&score::merge(replies), 16, |_| true))
            })
        });
        if n == 1 {
            let prompt = tokens(512 * BS, 99);
            let seed = hash::block_seed(None, None);
            let mut hs = Vec::new();
            g.bench_function("hash_then_lookup_gather_1_shard", |b| {
                b.iter(|| {
                    hs.clear();
                    hs.extend(
                        black_box(&prompt)
                            .chunks_exact(BS)
                            .map(|c| hash::local_hash(c, seed)),
                    );
                    let r = kvix::shard::answer(&mut shards[0], IndexId(0), Prompt::Locals(&hs));
                    black_box(score::gather(&score::merge(vec![r]), 16, |_| true))
                })
            });
        }
    }
    g.finish();
}

/// Applies ops straight into in-process shards (the rings' consumer side, inline).
struct InlineShards(Vec<Shard>);

impl kvix::ring::OpSink for InlineShards {
    fn push(&mut self, op: ShardOp) {
        let Some(slot) = op.slot() else {
            return self.broadcast(op);
        };
        let n = self.0.len();
        self.0[kvix::partition::Partition::spread_over(n)
            .shard_of(op.index(), slot)
            .0]
            .apply(op);
    }
    fn broadcast(&mut self, op: ShardOp) {
        for s in &mut self.0 {
            s.apply(op);
        }
    }
}

/// Decode each payload and feed it to `feed`, staging its ops into ring chunks and
/// emptying the ring in place (no shard work); returns the ops staged.
fn feed_ring(
    feed: &mut kvix::ingest::feed::WorkerFeed,
    sink: &mut RingSink,
    rings: &Rings,
    payloads: &[Vec<u8>],
    registry: &kvix::registry::Registry,
) -> usize {
    let mut batch = Batch::default();
    let mut ops = 0;
    for p in payloads {
        wire::decode(p, &mut batch).unwrap();
        feed.apply(&batch, p, registry, sink);
        sink.flush();
        ops += rings.drain(ShardId(0), usize::MAX, |chunk| {
            black_box(chunk);
        });
    }
    ops
}

/// The whole event path on one thread: decode → engine-hash map → kvix hashes →
/// shard apply, for 64 batches of 32 fresh blocks (2048 blocks per iteration).
fn bench_ingest(c: &mut Criterion) {
    use kvix::ingest::feed::WorkerFeed;
    use kvix::registry::{Endpoint, Registration, Registry};
    let registry = Registry::default();
    let index = registry
        .register(&Registration {
            model: "m".into(),
            tenant: "default".into(),
            block_size: BS as u32,
            instance: 1,
            dp: 0,
            endpoint: Endpoint {
                endpoint: "tcp://127.0.0.1:1".into(),
                replay_endpoint: None,
                publisher: None,
            },
            opts: Default::default(),
        })
        .unwrap()
        .index;
    let payloads: Vec<Vec<u8>> = (0..64u64)
        .map(|i| stored_payload_seeded(32, false, 100 + i))
        .collect();
    let mut g = c.benchmark_group("ingest_path");
    g.throughput(Throughput::Elements(64 * 32));
    g.bench_function("decode_feed_apply_2_shards", |b| {
        b.iter_batched(
            || {
                (
                    WorkerFeed::new(index, 1, 0, BS as u32),
                    InlineShards(vec![Shard::default(), Shard::default()]),
                )
            },
            |(mut feed, mut sink)| {
                let mut batch = Batch::default();
                for p in &payloads {
                    wire::decode(p, &mut batch).unwrap();
                    feed.apply(&batch, p, &registry, &mut sink);
                }
                (feed, sink)
            },
            BatchSize::LargeInput,
        )
    });
    // The ingest thread's own share: decode, hash, engine map and staging ops into
    // ring chunks; the ring is emptied in place after each frame (no shard work).
    let fresh = || {
        let rings = Rings::new(1, 1, 1 << 16);
        let sink = RingSink::new(rings.clone(), 0);
        (WorkerFeed::new(index, 1, 0, BS as u32), sink, rings)
    };
    g.bench_function("decode_feed_ring", |b| {
        b.iter_batched(
            fresh,
            |(mut feed, mut sink, rings)| {
                let ops = feed_ring(&mut feed, &mut sink, &rings, &payloads, &registry);
                (feed, black_box(ops))
            },
            BatchSize::LargeInput,
        )
    });
    // The same into a worker whose engine-hash map already holds 256k blocks, as a
    // busy worker's does: its inserts miss the cache as they do in service.
    let prefill: Vec<Vec<u8>> = (0..8192u64)
        .map(|i| stored_payload_seeded(32, false, 1_000_000 + i))
        .collect();
    g.bench_function("decode_feed_ring_256k_map", |b| {
        b.iter_batched(
            || {
                let (mut feed, mut sink, rings) = fresh();
                feed_ring(&mut feed, &mut sink, &rings, &prefill, &registry);
                (feed, sink, rings)
            },
            |(mut feed, mut sink, rings)| {
                let ops = feed_ring(&mut feed, &mut sink, &rings, &payloads, &registry);
                (feed, black_box(ops))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// The index ceiling: one hashbrown probe per block, nothing else.
fn bench_ceiling(c: &mut Criterion) {
    let keys = seqs(sized(1 << 20), 5);
    let mut map: hashbrown::HashMap<SeqHash, u64, SeqHasherBuilder> = Default::default();
    for (i, k) in keys.iter().enumerate() {
        map.insert(*k, i as u64);
    }
    let mut g = c.benchmark_group("ceiling");
    g.throughput(Throughput::Elements(512));
    // Each iteration probes the next 512 keys of the whole table, so the cache is as
    // cold as it is for real queries (the same 512 keys every time would stay cached).
    g.bench_function("hashbrown_1M_lookup_x512", |b| {
        let mut at = 0;
        b.iter(|| {
            at = (at + 512) % keys.len();
            let mut s = 0u64;
            for k in &keys[at..at + 512] {
                s = s.wrapping_add(*map.get(k).unwrap_or(&0));
            }
            black_box(s)
        })
    });
    g.finish();
}

/// The two hops between threads, alone: an event op's trip through an SPSC ring
/// (staged in chunks, ingest thread → shard), and a query's round trip to another
/// executor's shard over glommio's channel mesh (the scatter's per-shard cost).
fn bench_cross_core(c: &mut Criterion) {
    use kvix::types::TierSet;
    let mut g = c.benchmark_group("cross_core");
    const OPS: u64 = 1 << 16;
    g.throughput(Throughput::Elements(OPS));
    g.bench_function("ring_ops_thread_to_thread", |b| {
        b.iter_custom(|iters| {
            let rings = Rings::new(1, 1, 16_384);
            let total = iters * OPS;
            let consumer = {
                let rings = rings.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while n < total {
                        let got = rings.drain(ShardId(0), usize::MAX, |ops| {
                            black_box(ops);
                        });
                        if got == 0 {
                            std::hint::spin_loop();
                        }
                        n += got as u64;
                    }
                })
            };
            let mut sink = RingSink::new(rings, 0);
            let t = std::time::Instant::now();
            for i in 0..total {
                sink.push(ShardOp::Remove {
                    index: IndexId(0),
                    slot: WorkerSlot(0),
                    block: EngineHash(i),
                    tiers: TierSet::ALL,
                });
            }
            sink.flush();
            consumer.join().unwrap();
            t.elapsed()
        })
    });
    g.throughput(Throughput::Elements(1));
    for spin_us in [0u64, 200] {
        g.bench_function(BenchmarkId::new("mesh_round_trip_spin_us", spin_us), |b| {
            b.iter_custom(|iters| mesh_round_trips(iters, spin_us))
        });
    }
    // The floor a polled hop could reach: two threads spinning on a request and a
    // reply queue, nobody ever parked.
    g.bench_function("polled_queue_round_trip", |b| {
        b.iter_custom(|iters| {
            use crossbeam_queue::ArrayQueue;
            use std::sync::Arc;
            let (req, rep) = (Arc::new(ArrayQueue::new(64)), Arc::new(ArrayQueue::new(64)));
            let server = {
                let (req, rep) = (req.clone(), rep.clone());
                std::thread::spawn(move || {
                    loop {
                        match req.pop() {
                            Some(u64::MAX) => break,
                            Some(v) => while rep.push(v).is_err() {},
                            None => std::hint::spin_loop(),
                        }
                    }
                })
            };
            let t = std::time::Instant::now();
            for i in 0..iters {
                while req.push(i).is_err() {}
                while rep.pop().is_none() {
                    std::hint::spin_loop();
                }
            }
            let took = t.elapsed();
            while req.push(u64::MAX).is_err() {}
            server.join().unwrap();
            took
        })
    });
    g.finish();
}

/// `iters` request/reply round trips from executor 0 to executor 1 over a
/// glommio channel mesh, timed on executor 0 (start-up excluded); idle executors
/// spin `spin_us` before parking, as kvix's `--spin-us`.
fn mesh_round_trips(iters: u64, spin_us: u64) -> std::time::Duration {
    use glommio::channels::channel_mesh::MeshBuilder;
    use glommio::{LocalExecutorPoolBuilder, PoolPlacement};
    let mesh = MeshBuilder::<u64, _>::full(2, 64);
    let handles = LocalExecutorPoolBuilder::new(PoolPlacement::MaxSpread(2, None))
        .spin_before_park(std::time::Duration::from_micros(spin_us))
        .on_all_shards(move || async move {
            let (tx, mut rx) = mesh.join().await.unwrap();
            let me = tx.peer_id();
            let other = 1 - me;
            let (_, mut from) = rx.streams().into_iter().find(|(p, _)| *p == other).unwrap();
            if me == 0 {
                let t = std::time::Instant::now();
                for i in 0..iters {
                    tx.send_to(other, i).await.unwrap();
                    futures_lite::StreamExt::next(&mut from).await.unwrap();
                }
                tx.send_to(other, u64::MAX).await.unwrap();
                Some(t.elapsed())
            } else {
                while let Some(v) = futures_lite::StreamExt::next(&mut from).await {
                    if v == u64::MAX {
                        break;
                    }
                    tx.send_to(other, v).await.unwrap();
                }
                None
            }
        })
        .unwrap();
    handles
        .join_all()
        .into_iter()
        .filter_map(|r| r.ok().flatten())
        .next()
        .unwrap()
}

/// One stored event: the slot's parent engine hash and its blocks (engine hash,
/// local hash).
struct Run {
    parent: Option<EngineHash>,
    blocks: Vec<(EngineHash, BlockHash)>,
}

/// `convs` conversations of `len` blocks on one worker, stored in events of 16
/// blocks taken round-robin across conversations (so a chain's blocks are not
/// filed side by side, as in service).
fn conversations(convs: usize, len: usize) -> Vec<Run> {
    let chains: Vec<Vec<Block>> = (0..convs).map(|c| chain(len, 1_000 + c as u64)).collect();
    let eh = |c: usize, i: usize| {
        EngineHash(xxhash_rust::xxh3::xxh3_64(
            &((c << 20 | i) as u64).to_le_bytes(),
        ))
    };
    let mut runs = Vec::new();
    for from in (0..len).step_by(16) {
        for (c, blocks) in chains.iter().enumerate() {
            let to = (from + 16).min(len);
            runs.push(Run {
                parent: (from > 0).then(|| eh(c, from - 1)),
                blocks: (from..to).map(|i| (eh(c, i), blocks[i].local)).collect(),
            });
        }
    }
    runs
}

/// Today's structure (the ingest's engine-hash map, engine hash → sequence hash,
/// then a shard's block table fed in ring chunks) against the radix tree (engine
/// hash → node, nodes found from their parent), both on one thread, for 2M
/// stored pairs; then 64-block prompts looked up in each.
fn bench_index(c: &mut Criterion) {
    use kvix::shard::tree::Tree;
    let (convs, len) = (sized(32_768), 64);
    let runs = conversations(convs, len);
    let pairs = (convs * len) as u64;
    let today = |runs: &[Run]| {
        let mut shard = Shard::default();
        let mut ops = Vec::with_capacity(kvix::ring::CHUNK);
        for r in runs {
            let mut parent = r.parent;
            for &(block, local) in &r.blocks {
                ops.push(ShardOp::Store {
                    index: IndexId(0),
                    slot: WorkerSlot(0),
                    tier: Tier::DEVICE,
                    parent,
                    block,
                    local,
                    by_seq: false,
                    event_start: parent == r.parent,
                });
                parent = Some(block);
                if ops.len() == kvix::ring::CHUNK {
                    shard.apply_all(&ops);
                    ops.clear();
                }
            }
        }
        shard.apply_all(&ops);
        shard
    };
    let tree = |runs: &[Run]| {
        let mut t = Tree::default();
        for r in runs {
            t.store(WorkerSlot(0), Tier::DEVICE, r.parent, &r.blocks);
        }
        t
    };
    let mut g = c.benchmark_group("index_2m_pairs");
    g.sample_size(10);
    g.throughput(Throughput::Elements(pairs));
    g.bench_function("shard_in_ring_chunks", |b| {
        b.iter_batched(|| (), |_| today(&runs), BatchSize::PerIteration)
    });
    g.bench_function("radix_tree", |b| {
        b.iter_batched(|| (), |_| tree(&runs), BatchSize::PerIteration)
    });
    g.finish();

    let mut shard = today(&runs);
    let mut t = tree(&runs);
    let per_pair = |bytes: usize| bytes as f64 / pairs as f64;
    eprintln!(
        "index_2m_pairs heap bytes per pair ({pairs} pairs): shard {:.1}, radix tree {:.1}",
        per_pair(shard.heap_bytes()),
        per_pair(t.heap_bytes())
    );
    let prompts: Vec<(Vec<SeqHash>, Vec<BlockHash>)> = (0..1024)
        .map(|i| {
            let blocks = chain(len, 1_000 + (i * 31 % convs) as u64);
            (
                blocks.iter().map(|b| b.seq).collect(),
                blocks.iter().map(|b| b.local).collect(),
            )
        })
        .collect();
    let mut g = c.benchmark_group("index_2m_pairs_lookup_64_blocks");
    g.throughput(Throughput::Elements(prompts.len() as u64));
    let mut out = Vec::new();
    g.bench_function("shard_by_seq", |b| {
        b.iter(|| {
            for (seqs, _) in &prompts {
                out.clear();
                shard.lookup(IndexId(0), Prompt::Seqs(seqs), &mut out);
            }
            black_box(out.len())
        })
    });
    g.bench_function("radix_tree_by_local", |b| {
        b.iter(|| {
            for (_, locals) in &prompts {
                out.clear();
                t.lookup(Prompt::Locals(locals), &mut out);
            }
            black_box(out.len())
        })
    });
    g.finish();

    // What one step of the walks that run between queries costs on this index:
    // the longest the executor is away from its queries for them.
    let mut g = c.benchmark_group("index_2m_pairs_steps");
    g.sample_size(10);
    let mut dumped = Vec::new();
    g.bench_function("dump_step_16k_blocks", |b| {
        b.iter(|| {
            dumped.clear();
            let mut walk = kvix::shard::tree::ExportWalk::default();
            t.export_step(&mut walk, 16 * 1024, &mut dumped);
            black_box(dumped.len())
        })
    });
    g.bench_function("clear_step_16k_buckets", |b| {
        b.iter_batched(
            || tree(&runs),
            |mut t| {
                let mut at = kvix::shard::tree::NamesAt::default();
                t.clear_step(WorkerSlot(0), kvix::types::TierSet::ALL, &mut at, 16 * 1024);
                t
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_index,
    bench_predict,
    bench_evict,
    bench_cross_core,
    bench_hash,
    bench_decode,
    bench_apply,
    bench_ingest,
    bench_query,
    bench_token_ids,
    bench_render,
    bench_ceiling
);
criterion_main!(benches);
