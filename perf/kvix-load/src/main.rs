//! kvix-load: load generator for kvix or any indexer speaking Dynamo's
//! standalone-indexer HTTP API.
//!
//! Owns the command line and the order of phases: load the trace, simulate
//! workers, publish KV events over ZMQ and measure when the indexer has
//! applied them, then drive query load and report.

mod events;
mod http;
mod mux;
mod plot;
mod query;
mod report;
mod requests;
mod shared_prefix;
mod sim;
mod slots;
mod trace;

use clap::{Args, Parser, Subcommand};
use http::Target;
use query::{Endpoint, Phase};
use report::{EventReport, Report, bar, note};
use requests::Requests;
use sim::{Policy, SimConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "kvix-load",
    version,
    about = "Load generator for KV-cache indexers with Dynamo's standalone-indexer HTTP API (kvix, dynamo-kv-indexer)",
    long_about = "Load generator for KV-cache indexers with Dynamo's standalone-indexer HTTP API \
(kvix, dynamo-kv-indexer).\n\n\
Requests come from generated conversations that mostly open with a few shared system prompts \
and few-shot prefixes (--workload shared-prefix, the default: no file needed); or, given \
--trace, from a Mooncake trace: each hash id expands deterministically into 512 token ids, \
cut to input_length and split into --block-size blocks. Simulated workers (one ZMQ XPUB socket \
each, the engines' PUB wire, registered through POST /register; the publish waits for the indexer's subscription to each) keep LRU KV caches and publish vLLM KVEventBatch frames \
(BlockStored/BlockRemoved). After the last frame each worker publishes a sentinel block; the run \
polls POST /query until every sentinel is visible, giving blocks applied/s at the indexer. Query \
phases then drive /query or /query_by_hash, open-loop at --rate (latency from the intended send \
time) or closed-loop with --rate 0; an overloaded open-loop phase stops at twice --duration and \
reports the requests it never sent. With --interleave-with, each phase loads two indexers in \
turns of --slice-ms, one result each, so that both meet the same machine.\n\n\
Exit status: 0 when everything was applied and answered, 2 when the run finished but measured a \
failure (sentinels not seen before --settle-timeout, query errors, no replies), 1 on errors.\n\n\
Examples:\n  \
kvix-load bench --url http://127.0.0.1:8090           # generated shared-prefix workload\n  \
kvix-load bench --trace tests/data/mooncake_trace_head500.jsonl --pid $(pidof kvix)\n  \
kvix-load bench --requests 200 --duration 2            # CI smoke, a few seconds\n  \
kvix-load events --keep && kvix-load query --connections 1,16 --rate 0,2000\n  \
kvix-load query --url http://127.0.0.1:8090 --interleave-with http://127.0.0.1:8091 --rate 6000\n  \
kvix-load bench --json > result.json"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Whole benchmark: event load, then query phases; prints the summary table
    Bench {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        ev: EventArgs,
        #[command(flatten)]
        q: QueryArgs,
    },
    /// Event load only
    Events {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        ev: EventArgs,
    },
    /// Query load only, against an index already filled (e.g. by `events --keep`)
    Query {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        q: QueryArgs,
    },
    /// Closed-loop load on a slot tracker (kvix --slot-tracker-port, or Dynamo's):
    /// `/add` + `/free` pairs, or `/potential_loads` with --potential
    Slots {
        /// Slot tracker base URL
        #[arg(long, default_value = "http://127.0.0.1:8091")]
        url: String,
        #[arg(long, default_value = "kvix-load")]
        model_name: String,
        /// Workers registered (requests spread over them)
        #[arg(long, default_value_t = 8)]
        workers_count: u64,
        /// Blocks per request's prompt (half of them one of 8 shared prefixes)
        #[arg(long, default_value_t = 64)]
        blocks: usize,
        /// Connections (one thread each), comma-separated; one run per value
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        connections: Vec<usize>,
        /// Seconds per run
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
        /// Load /potential_loads instead of /add + /free
        #[arg(long)]
        potential: bool,
        /// Requests left booked during the run (what /potential_loads walks)
        #[arg(long, default_value_t = 0)]
        active: usize,
        /// Leave the --active requests booked at the end
        #[arg(long)]
        keep_active: bool,
    },
    /// SVG plots from `--json` reports (latency vs offered load, applied blocks/s,
    /// figures against the index size)
    Plot {
        /// Reports with open-loop query phases, as `label=path` (one series each)
        #[arg(long, value_delimiter = ',')]
        latency: Vec<String>,
        /// Event reports, as `label=path` (one bar each, e.g. `1 shard=ev1.json`)
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        /// A `perf/compare.py scale-series` file: scale.svg, each figure against the
        /// index size
        #[arg(long)]
        scale: Option<String>,
        /// A `perf/fleet_table.py` file: fleet.svg, each figure against the engines
        /// registered
        #[arg(long)]
        fleet: Option<String>,
        /// Endpoint of the latency plot
        #[arg(long, default_value = "query")]
        endpoint: String,
        /// Prompt length of the latency plot
        #[arg(long, default_value_t = 1024)]
        prompt_tokens: u64,
        /// Folder for latency.svg, events.svg, scale.svg and fleet.svg
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
    },
}

#[derive(Args, Clone)]
struct Common {
    /// Indexer base URL
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    url: String,
    /// Model name to register workers under and to query
    #[arg(long, default_value = "kvix-load")]
    model_name: String,
    /// Indexer KV block size in tokens (only complete blocks are used)
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Mooncake trace (JSONL: timestamp, input_length, output_length, hash_ids);
    /// giving one selects the trace workload
    #[arg(long)]
    trace: Option<String>,
    /// Where requests come from: the Mooncake trace (--trace), or generated
    /// conversations opening with a few shared system prompts and few-shot prefixes.
    /// Default: trace when --trace is given, shared-prefix otherwise (needs no file)
    #[arg(long, value_enum)]
    workload: Option<Workload>,
    /// Use the first N requests of the trace (or generate N)
    #[arg(long, default_value_t = 6000)]
    requests: usize,
    /// shared-prefix: distinct system prompts
    #[arg(long, default_value_t = shared_prefix::Shape::default().system_prompts)]
    system_prompts: usize,
    /// shared-prefix: distinct few-shot prefixes (each follows one system prompt)
    #[arg(long, default_value_t = shared_prefix::Shape::default().few_shots)]
    few_shots: usize,
    /// Indexer process id: report its RSS (VmRSS) before and after
    #[arg(long)]
    pid: Option<u32>,
    /// Print JSON on stdout instead of the table
    #[arg(long)]
    json: bool,
    /// No progress bars or notes on stderr
    #[arg(long, short)]
    quiet: bool,
    /// Seed for routing, engine-hash salts and the shared-prefix workload
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

impl Common {
    /// The workload asked for: `--workload`, else the trace when `--trace` names one,
    /// else the generated one, so that a fresh clone runs with no file at hand.
    fn workload(&self) -> Workload {
        self.workload.unwrap_or(if self.trace.is_some() {
            Workload::Trace
        } else {
            Workload::SharedPrefix
        })
    }
}

/// Source of the request list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// The first --requests requests of the Mooncake trace.
    #[default]
    Trace,
    /// Generated: shared system prompts and few-shot prefixes, per-conversation turns.
    SharedPrefix,
}

#[derive(Args, Clone)]
struct EventArgs {
    /// Number of simulated workers (one ZMQ XPUB socket each)
    #[arg(long, default_value_t = 64)]
    workers_count: usize,
    /// Routing of requests to workers
    #[arg(long, value_enum, default_value_t = Policy::Random)]
    policy: Policy,
    /// GPU KV capacity per worker in blocks; 0 = 2 x unique trace blocks / workers
    #[arg(long, default_value_t = 0)]
    capacity_blocks: usize,
    /// Flush a worker's batch (one ZMQ frame) once it holds this many events
    #[arg(long, default_value_t = 8)]
    batch_events: usize,
    /// Encode batches as vLLM does, `[ts, events, dp_rank]` (nil without a rank);
    /// `--batch-dp-rank false`: the two-field `[ts, events]` older publishers send,
    /// which Dynamo's decoder (dynamo-kv-router 1.6.1) cannot read
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    batch_dp_rank: bool,
    /// Give a block the same engine hash on every worker (as engines with a fixed
    /// hash seed do) instead of one per worker (as engines seeded per process do).
    /// Dynamo 1.6.1's indexer loses stores under per-worker hashes once workers
    /// share blocks, so comparisons with it use this
    #[arg(long)]
    shared_engine_hashes: bool,
    /// A hybrid model: a second KV-cache group, a sliding window of this many
    /// tokens, stores and removes the same blocks beside full attention (vLLM's
    /// `group_idx` 1, `kv_cache_spec_kind` "sliding_window"); 0: full attention only
    #[arg(long, default_value_t = 0)]
    window_tokens: u32,
    /// Add a CPU offload tier: GPU evictions are re-stored with medium "CPU"
    #[arg(long)]
    offload: bool,
    /// CPU tier capacity per worker in blocks; 0 = 2 x the GPU capacity
    #[arg(long, default_value_t = 0)]
    cpu_capacity_blocks: usize,
    /// Publisher threads (workers are spread over them)
    #[arg(long, default_value_t = 1)]
    publish_threads: usize,
    /// Time the apply by the indexer's tree sizes (one /query a poll, summed over
    /// the workers) reaching every block published, then check each worker's
    /// sentinel untimed; an indexer whose answers carry no tree sizes is timed by its
    /// sentinels. Without it the apply ends with the last sentinel seen, one /query
    /// per worker, which at fleet size (each of kvix's answers listing every worker)
    /// times the load tool as much as the indexer
    #[arg(long)]
    wait_tree_sizes: bool,
    /// instance_id of the first worker; the others follow consecutively
    #[arg(long, default_value_t = 1)]
    first_instance_id: u64,
    /// After registering, wait at most this many seconds for the indexer to
    /// subscribe to every worker (ZMQ's slow joiner: a frame sent before is lost)
    #[arg(long, default_value_t = 60.0)]
    subscribe_timeout: f64,
    /// Give up waiting for sentinels after this many seconds past the publish
    #[arg(long, default_value_t = 120.0)]
    settle_timeout: f64,
    /// Leave the workers registered (and their blocks indexed) at the end
    #[arg(long)]
    keep: bool,
}

#[derive(Args, Clone)]
struct QueryArgs {
    /// Endpoints to load, comma-separated
    #[arg(long, value_enum, value_delimiter = ',', default_value = "query")]
    endpoint: Vec<Endpoint>,
    /// Prompt lengths in tokens (trace prompts truncated or padded), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    prompt_tokens: Vec<usize>,
    /// Connection counts (all driven from one client thread), comma-separated; one phase per value
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    connections: Vec<usize>,
    /// Arrival rates in req/s over all connections, comma-separated; 0 = closed loop (max throughput)
    #[arg(long, value_delimiter = ',', default_value = "0")]
    rate: Vec<f64>,
    /// Seconds per query phase
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Distinct pre-serialized prompts, spread over the trace prefix
    #[arg(long, default_value_t = 256)]
    prompt_pool: usize,
    /// Send /query_by_hash hashes as signed i64 instead of u64
    #[arg(long)]
    signed_hashes: bool,
    /// Ask for the slot tracker's potential loads too (`"loads": true`, kvix only)
    #[arg(long)]
    loads: bool,
    /// Ask for only the workers holding some of the prefix in the answer
    /// (`"matched_only": true`, kvix only)
    #[arg(long)]
    matched_only: bool,
    /// A second indexer, already filled the same way: every phase loads `--url`
    /// and this one in turn, `--slice-ms` each, so that both meet the same
    /// machine (one result per server and phase)
    #[arg(long)]
    interleave_with: Option<String>,
    /// Milliseconds per turn with --interleave-with
    #[arg(long, default_value_t = 100)]
    slice_ms: u64,
}

fn main() {
    let cli = Cli::parse();
    match run(cli.cmd) {
        Ok(ok) => std::process::exit(if ok { 0 } else { 2 }),
        Err(e) => {
            eprintln!("kvix-load: error: {e}");
            std::process::exit(1);
        }
    }
}

/// Run a command; Ok(false) when it completed but measured a failure
/// (sentinels not seen, query errors, no replies).
fn run(cmd: Cmd) -> Result<bool, String> {
    let (common, ev, q) = match cmd {
        Cmd::Bench { common, ev, q } => (common, Some(ev), Some(q)),
        Cmd::Events { common, ev } => (common, Some(ev), None),
        Cmd::Query { common, q } => (common, None, Some(q)),
        Cmd::Slots {
            url,
            model_name,
            workers_count,
            blocks,
            connections,
            duration,
            potential,
            active,
            keep_active,
        } => {
            for c in connections {
                let r = slots::run(&slots::SlotsArgs {
                    url: url.clone(),
                    model: model_name.clone(),
                    workers: workers_count.max(1),
                    blocks,
                    connections: c.max(1),
                    duration,
                    potential,
                    active,
                    keep_active,
                })?;
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
            }
            return Ok(true);
        }
        Cmd::Plot {
            latency,
            events,
            scale,
            fleet,
            endpoint,
            prompt_tokens,
            out,
        } => {
            plots(
                &latency,
                &events,
                scale.as_deref(),
                fleet.as_deref(),
                &endpoint,
                prompt_tokens,
                &out,
            )?;
            return Ok(true);
        }
    };
    let target = Target::parse(&common.url)?;
    // The second indexer of an interleaved query load, checked before anything is
    // registered with the first.
    let other = q
        .as_ref()
        .and_then(|q| q.interleave_with.as_deref())
        .map(Target::parse)
        .transpose()
        .map_err(|e| format!("--interleave-with: {e}"))?;
    if common.block_size == 0 {
        return Err("--block-size must be > 0".into());
    }
    let reqs = requests(&common)?;
    if reqs.is_empty() {
        return Err("no requests (--requests 0?)".into());
    }
    let mut report = Report {
        url: common.url.clone(),
        model_name: common.model_name.clone(),
        block_size: common.block_size,
        workload: common.workload(),
        requests: reqs.len(),
        ..Default::default()
    };
    let mut ok = true;
    // Sockets stay open until the end so the indexer's subscriptions stay valid.
    let mut pubs = Vec::new();
    if let Some(ev) = &ev {
        let events;
        (pubs, events) = event_phase(&common, ev, &target, &reqs)?;
        ok &= events.publish.all_sentinels_seen;
        report.events = Some(events);
    }
    if let Some(q) = &q {
        let targets: Vec<&Target> = std::iter::once(&target).chain(other.as_ref()).collect();
        ok &= query_phases(&common, q, &targets, &reqs, &mut report);
    }
    if let Some(ev) = &ev
        && !ev.keep
        && !pubs.is_empty()
    {
        let registered: Vec<u64> = pubs.iter().map(|p| p.instance).collect();
        let failed = events::unregister(&target, &registered, &common.model_name);
        if failed > 0 {
            note(
                common.quiet,
                &format!("{failed} workers failed to unregister"),
            );
        }
    }
    if common.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        report::print_table(&report);
    }
    Ok(ok)
}

/// `kvix-load plot`: each SVG asked for, into `out`.
fn plots(
    latency: &[String],
    events: &[String],
    scale: Option<&str>,
    fleet: Option<&str>,
    endpoint: &str,
    prompt_tokens: u64,
    out: &std::path::Path,
) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    if !latency.is_empty() {
        let path = out.join("latency.svg");
        plot::latency_svg(&plot::labelled(latency), endpoint, prompt_tokens, &path)?;
        println!("{}", path.display());
    }
    if !events.is_empty() {
        let path = out.join("events.svg");
        plot::events_svg(&plot::labelled(events), &path)?;
        println!("{}", path.display());
    }
    if let Some(series) = scale {
        let path = out.join("scale.svg");
        plot::scale_svg(series, &plot::BY_INDEX_SIZE, &path)?;
        println!("{}", path.display());
    }
    if let Some(series) = fleet {
        let path = out.join("fleet.svg");
        plot::scale_svg(series, &plot::BY_ENGINES, &path)?;
        println!("{}", path.display());
    }
    Ok(())
}

/// The requests of `--workload`: the trace's, or generated again for each pass.
fn requests(common: &Common) -> Result<Requests, String> {
    match common.workload() {
        Workload::Trace => {
            let path = common.trace.as_deref().ok_or(
                "--workload trace needs --trace PATH (a Mooncake JSONL trace, e.g. \
                 tests/data/mooncake_trace_head500.jsonl); without one the default is \
                 --workload shared-prefix",
            )?;
            note(
                common.quiet,
                &format!("loading {} requests from {path}", common.requests),
            );
            Ok(Requests::Held(trace::load(
                path,
                common.requests,
                common.block_size,
            )?))
        }
        Workload::SharedPrefix => {
            note(
                common.quiet,
                &format!(
                    "{} shared-prefix requests, generated again for each pass",
                    common.requests
                ),
            );
            let shape = shared_prefix::Shape {
                system_prompts: common.system_prompts,
                few_shots: common.few_shots,
                ..Default::default()
            };
            Ok(Requests::Generated {
                shape,
                count: common.requests,
                block_size: common.block_size,
                seed: common.seed,
            })
        }
    }
}

/// Run `work` while `tick` runs every 100 ms on a thread of its own (to move a
/// progress bar).
fn with_ticker<R>(mut tick: impl FnMut() + Send, work: impl FnOnce() -> R) -> R {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let done = &done;
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                tick();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let r = work();
        done.store(true, Ordering::Relaxed);
        r
    })
}

/// The event phase: simulate the workers, register and publish them, and measure
/// when the indexer has applied everything and what memory it took.
fn event_phase(
    common: &Common,
    ev: &EventArgs,
    target: &Target,
    reqs: &Requests,
) -> Result<(Vec<events::Publisher>, EventReport), String> {
    if ev.workers_count == 0 {
        return Err("--workers-count must be > 0".into());
    }
    let quiet = common.quiet;
    let b = bar(quiet, reqs.len() as u64, "simulating workers");
    let cfg = SimConfig {
        workers: ev.workers_count,
        block_size: common.block_size,
        policy: ev.policy,
        capacity: ev.capacity_blocks,
        cpu_capacity: 0,
        batch_events: ev.batch_events.max(1),
        batch_dp_rank: ev.batch_dp_rank,
        shared_engine_hashes: ev.shared_engine_hashes,
        window_tokens: ev.window_tokens,
        seed: common.seed,
    };
    let survey = sim::survey(reqs);
    let cfg = resolve_capacity(cfg, survey.unique_blocks, ev);
    let frames = sim::simulate(reqs, &survey, &cfg, |n| b.set_position(n as u64));
    b.finish_and_clear();
    let sim_stats = frames.stats.clone();
    note(
        quiet,
        &format!(
            "{} frames, {} blocks stored, {} removed; publishing",
            sim_stats.frames, sim_stats.blocks_stored, sim_stats.blocks_removed
        ),
    );

    let rss_before = common.pid.and_then(events::rss_bytes);
    let ctx = zmq::Context::new();
    let pubs = events::bind(&ctx, ev.workers_count, ev.first_instance_id)?;
    events::register(target, &pubs, &common.model_name, common.block_size)?;
    events::wait_subscribed(&pubs, Duration::from_secs_f64(ev.subscribe_timeout))?;

    let total_frames = frames.order.len() as u64;
    let sent = Arc::new(AtomicU64::new(0));
    let b = bar(quiet, total_frames, "publishing frames");
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    let result = with_ticker(
        || b.set_position(sent.load(Ordering::Relaxed)),
        || {
            events::publish(
                pubs,
                frames,
                ev.publish_threads,
                target,
                &common.model_name,
                common.block_size,
                ev.batch_dp_rank,
                nonce,
                Duration::from_secs_f64(ev.settle_timeout),
                sent.clone(),
                ev.wait_tree_sizes
                    .then_some(sim_stats.live_pairs + ev.workers_count as u64),
            )
        },
    );
    b.finish_and_clear();
    let (pubs, publish) = result?;
    if !publish.all_sentinels_seen {
        note(quiet, "not every sentinel was seen before --settle-timeout");
    }
    // RSS right after the last sentinel still holds frames the indexer buffered
    // during the burst; live memory is read once RSS stops falling.
    let rss_applied = common.pid.and_then(events::rss_bytes);
    let rss_after = common.pid.and_then(events::settled_rss_bytes);
    let blocks = (sim_stats.blocks_stored + sim_stats.blocks_removed) as f64;
    let growth = |after: Option<u64>| match (rss_before, after) {
        (Some(b), Some(a)) => Some(a as f64 - b as f64),
        _ => None,
    };
    let (growth_applied, growth) = (growth(rss_applied), growth(rss_after));
    let report = EventReport {
        workers: ev.workers_count,
        policy: ev.policy,
        batch_events: cfg.batch_events,
        offload: ev.offload,
        blocks_applied_per_sec: blocks / publish.applied_secs.max(1e-9),
        blocks_published_per_sec: blocks / publish.publish_secs.max(1e-9),
        frames_published_per_sec: total_frames as f64 / publish.publish_secs.max(1e-9),
        rss_before_bytes: rss_before,
        rss_applied_bytes: rss_applied,
        rss_after_bytes: rss_after,
        bytes_per_live_pair_at_apply: growth_applied
            .map(|g| g / sim_stats.live_pairs.max(1) as f64),
        bytes_per_live_pair: growth.map(|g| g / sim_stats.live_pairs.max(1) as f64),
        bytes_per_unique_block: growth.map(|g| g / sim_stats.live_unique_blocks.max(1) as f64),
        sim: sim_stats,
        publish,
    };
    Ok((pubs, report))
}

/// Every (endpoint, prompt length, rate, connections) phase `q` asks for, in order.
fn phases(q: &QueryArgs) -> Vec<Phase> {
    let mut phases = Vec::new();
    for &endpoint in &q.endpoint {
        for &prompt_tokens in &q.prompt_tokens {
            for &rate in &q.rate {
                for &connections in &q.connections {
                    phases.push(Phase {
                        endpoint,
                        prompt_tokens,
                        connections: connections.max(1),
                        rate,
                        duration_secs: q.duration,
                    });
                }
            }
        }
    }
    phases
}

/// Run every query phase into `report`; false when one had errors or no replies.
fn query_phases(
    common: &Common,
    q: &QueryArgs,
    targets: &[&Target],
    reqs: &Requests,
    report: &mut Report,
) -> bool {
    let mut ok = true;
    // Bodies of the last (endpoint, prompt length), one set per target (each
    // request names its server), reused by consecutive phases.
    type Bodies = Vec<Arc<Vec<Vec<u8>>>>;
    let mut cache: Option<((Endpoint, usize), Bodies)> = None;
    for p in &phases(q) {
        let key = (p.endpoint, p.prompt_tokens);
        let bodies = match &cache {
            Some((k, b)) if *k == key => b.clone(),
            _ => {
                let b: Bodies = targets
                    .iter()
                    .map(|t| {
                        Arc::new(query::bodies(
                            t,
                            reqs,
                            p.endpoint,
                            p.prompt_tokens,
                            common.block_size,
                            &common.model_name,
                            q.prompt_pool,
                            q.signed_hashes,
                            q.loads,
                            q.matched_only,
                        ))
                    })
                    .collect();
                cache = Some((key, b.clone()));
                b
            }
        };
        let slice = Duration::from_millis(q.slice_ms);
        for r in query_phase(common.quiet, targets, p, bodies, slice) {
            ok &= r.errors == 0 && r.completed > 0;
            report.queries.push(r);
        }
    }
    report.rss_after_queries_bytes = common.pid.and_then(events::rss_bytes);
    ok
}

/// One query phase, with its progress bar: one result per target (several are
/// loaded in turn, `slice` at a time).
fn query_phase(
    quiet: bool,
    targets: &[&Target],
    p: &Phase,
    bodies: Vec<Arc<Vec<Vec<u8>>>>,
    slice: Duration,
) -> Vec<query::PhaseResult> {
    let label = format!(
        "{} {}t c{} {}",
        p.endpoint.path(),
        p.prompt_tokens,
        p.connections,
        if p.rate > 0.0 {
            format!("{}/s", p.rate)
        } else {
            "closed".into()
        }
    );
    let b = bar(
        quiet,
        (p.duration_secs * 10.0 * targets.len() as f64) as u64,
        &label,
    );
    b.set_style(
        indicatif::ProgressStyle::with_template("{msg:>30} [{bar:40}] {elapsed_precise} {prefix}")
            .unwrap()
            .progress_chars("=> "),
    );
    let done = Arc::new(AtomicU64::new(0));
    let t = std::time::Instant::now();
    let r = with_ticker(
        || {
            b.set_position((t.elapsed().as_secs_f64() * 10.0) as u64);
            b.set_prefix(format!("{} done", done.load(Ordering::Relaxed)));
        },
        || {
            let pairs: Vec<_> = targets.iter().copied().zip(bodies).collect();
            query::run(&pairs, p, slice, done.clone())
        },
    );
    b.finish_and_clear();
    r
}

/// Fill in the default capacities, which depend on the distinct blocks requested.
fn resolve_capacity(mut cfg: SimConfig, unique_blocks: usize, ev: &EventArgs) -> SimConfig {
    if cfg.capacity == 0 {
        cfg.capacity = (2 * unique_blocks).div_ceil(cfg.workers).max(1);
    }
    if ev.offload {
        cfg.cpu_capacity = if ev.cpu_capacity_blocks > 0 {
            ev.cpu_capacity_blocks
        } else {
            2 * cfg.capacity
        };
    }
    cfg
}
