//! Results: the summary table on stdout, the `--json` document, and progress bars.
//!
//! Owns presentation only; every figure is computed by the phase that measured it.

use crate::events::PublishResult;
use crate::query::PhaseResult;
use crate::sim::SimStats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Everything a run measured.
#[derive(Default, serde::Serialize)]
pub struct Report {
    pub url: String,
    pub model_name: String,
    pub block_size: usize,
    pub workload: crate::Workload,
    pub requests: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<EventReport>,
    pub queries: Vec<PhaseResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_after_queries_bytes: Option<u64>,
}

#[derive(serde::Serialize)]
pub struct EventReport {
    pub workers: usize,
    pub policy: crate::sim::Policy,
    pub batch_events: usize,
    pub offload: bool,
    pub sim: SimStats,
    pub publish: PublishResult,
    /// Stored + removed blocks per second, first publish to all sentinels seen.
    pub blocks_applied_per_sec: f64,
    pub blocks_published_per_sec: f64,
    pub frames_published_per_sec: f64,
    pub rss_before_bytes: Option<u64>,
    /// RSS when the last sentinel was seen (burst buffers included).
    pub rss_applied_bytes: Option<u64>,
    /// RSS once it stopped falling after the burst.
    pub rss_after_bytes: Option<u64>,
    /// RSS growth at the last sentinel over live pairs (the burst's transient peak).
    pub bytes_per_live_pair_at_apply: Option<f64>,
    /// Settled RSS growth over live (block, worker) pairs.
    pub bytes_per_live_pair: Option<f64>,
    /// RSS growth over distinct live blocks.
    pub bytes_per_unique_block: Option<f64>,
}

/// A progress bar on stderr, hidden when quiet or not a terminal.
pub fn bar(quiet: bool, len: u64, msg: &str) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    b.set_style(
        ProgressStyle::with_template(
            "{msg:>24} [{bar:40}] {pos}/{len} {elapsed_precise} {per_sec}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    b.set_message(msg.to_string());
    b
}

/// Say something on stderr unless quiet.
pub fn note(quiet: bool, msg: &str) {
    if !quiet {
        eprintln!("kvix-load: {msg}");
    }
}

fn si(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.1}")
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

pub fn print_table(r: &Report) {
    println!(
        "kvix-load  url={} model={} block_size={} workload={:?} requests={}",
        r.url, r.model_name, r.block_size, r.workload, r.requests
    );
    if let Some(e) = &r.events {
        print_events(e);
    }
    if !r.queries.is_empty() {
        print_queries(&r.queries);
    }
    if let Some(b) = r.rss_after_queries_bytes {
        println!();
        println!("  {:<28} {}", "indexer RSS after queries", mib(b));
    }
}

/// The event phase: what was simulated and published, how fast it applied, memory.
fn print_events(e: &EventReport) {
    println!();
    println!(
        "== events: {} workers, policy {:?}, {} events/batch{} ==",
        e.workers,
        e.policy,
        e.batch_events,
        if e.offload { ", CPU offload" } else { "" }
    );
    for (k, v) in event_rows(e) {
        println!("  {k:<28} {v}");
    }
    if let (Some(b), Some(a)) = (e.rss_before_bytes, e.rss_after_bytes) {
        println!("  {:<28} {} -> {}", "indexer RSS (settled)", mib(b), mib(a));
    }
    if let Some(x) = e.bytes_per_live_pair {
        println!("  {:<28} {x:.1}", "RSS bytes / live pair");
    }
    if let Some(x) = e.bytes_per_live_pair_at_apply {
        println!("  {:<28} {x:.1}", "  same, at last sentinel");
    }
    if let Some(x) = e.bytes_per_unique_block {
        println!("  {:<28} {x:.1}", "RSS bytes / unique block");
    }
}

/// The event phase's figures, one (label, value) a row.
fn event_rows(e: &EventReport) -> Vec<(&'static str, String)> {
    let s = &e.sim;
    vec![
        ("frames / events", format!("{} / {}", s.frames, s.events)),
        ("payload bytes", mib(s.payload_bytes)),
        (
            "blocks stored / removed",
            format!("{} / {}", s.blocks_stored, s.blocks_removed),
        ),
        (
            "  of which CPU tier",
            format!("{} / {}", s.cpu_blocks_stored, s.cpu_blocks_removed),
        ),
        ("blocks reused (hits)", s.blocks_hit.to_string()),
        ("capacity blocks/worker", s.capacity_blocks.to_string()),
        ("trace unique blocks", s.trace_unique_blocks.to_string()),
        ("live (block,worker) pairs", s.live_pairs.to_string()),
        ("live unique blocks", s.live_unique_blocks.to_string()),
        ("publish time", format!("{:.3} s", e.publish.publish_secs)),
        (
            "publish rate",
            format!(
                "{} blocks/s, {} frames/s",
                si(e.blocks_published_per_sec),
                si(e.frames_published_per_sec)
            ),
        ),
        (
            "applied time",
            format!(
                "{:.3} s{}",
                e.publish.applied_secs,
                if e.publish.all_sentinels_seen {
                    ""
                } else {
                    "  (TIMED OUT: not all sentinels seen)"
                }
            ),
        ),
        ("blocks applied/s", si(e.blocks_applied_per_sec)),
        (
            "indexer tree_sizes sum",
            match e.publish.indexer_tree_sizes_sum {
                Some(n) => {
                    let want = s.live_pairs + e.workers as u64;
                    format!(
                        "{n} (expected {want}: live pairs + sentinels){}",
                        if n == want { "" } else { "  MISMATCH" }
                    )
                }
                None => "n/a".into(),
            },
        ),
    ]
}

/// One row per query phase: rate, completions, errors, hit rate, latency quantiles.
fn print_queries(queries: &[PhaseResult]) {
    println!();
    println!("== queries (latency ms; open loop measured from intended send time) ==");
    println!(
        "  {:<14} {:>6} {:>5} {:>8} {:>10} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "endpoint",
        "tokens",
        "conns",
        "rate",
        "req/s",
        "done",
        "errors",
        "hit%",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "max"
    );
    // Interleaved phases (`--interleave-with`): one row per server, each named.
    let named = queries.iter().any(|q| q.target != queries[0].target);
    for q in queries {
        let rate = if q.phase.rate > 0.0 {
            si(q.phase.rate)
        } else {
            "closed".into()
        };
        let hit = if q.completed > 0 {
            100.0 * q.hits as f64 / q.completed as f64
        } else {
            0.0
        };
        println!(
            "  {:<14} {:>6} {:>5} {:>8} {:>10.1} {:>9} {:>7} {:>7.1} {:>8} {:>8} {:>8} {:>8} {:>8}",
            q.phase.endpoint.path(),
            q.phase.prompt_tokens,
            q.phase.connections,
            rate,
            q.achieved_rps,
            q.completed,
            q.errors,
            hit,
            ms(q.p50_us),
            ms(q.p90_us),
            ms(q.p99_us),
            ms(q.p999_us),
            ms(q.max_us)
        );
        if named {
            println!("  ^ {}", q.target);
        }
        if q.unsent > 0 {
            println!(
                "  ^ {} scheduled requests never sent (overloaded past 2x --duration or 2x --slice-ms, stalled, or unreachable)",
                q.unsent
            );
        }
    }
}
