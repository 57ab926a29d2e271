//! Plots from `--json` reports: query latency percentiles vs offered load, and
//! applied blocks/s vs shard count. Reads reports, writes SVG; measures nothing.

use plotters::prelude::*;
use serde_json::Value;
use std::path::Path;

fn read(path: &str) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// One series per input report: (label, [(offered req/s, p50, p99, p99.9)]) over its
/// open-loop phases of the given endpoint and prompt length.
pub fn latency_svg(
    inputs: &[(String, String)],
    endpoint: &str,
    prompt_tokens: u64,
    out: &Path,
) -> Result<(), String> {
    let mut series = Vec::new();
    for (label, path) in inputs {
        let r = read(path)?;
        let mut pts: Vec<(f64, f64, f64, f64)> = r["queries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|q| {
                q["endpoint"] == endpoint
                    && q["prompt_tokens"].as_u64() == Some(prompt_tokens)
                    && f(&q["rate"]) > 0.0
            })
            .map(|q| {
                (
                    f(&q["rate"]),
                    f(&q["p50_us"]),
                    f(&q["p99_us"]),
                    f(&q["p999_us"]),
                )
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !pts.is_empty() {
            series.push((label.clone(), pts));
        }
    }
    if series.is_empty() {
        return Err(format!(
            "no open-loop {endpoint} phases with {prompt_tokens}-token prompts"
        ));
    }
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.3))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("/{endpoint} latency vs offered load ({prompt_tokens}-token prompts)"),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..xmax * 1.05, (10f64..ymax * 1.5).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("offered load (requests/s)")
        .y_desc("latency (µs, log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    let styles = [("p50", 0usize), ("p99", 1), ("p99.9", 2)];
    for (si, (label, pts)) in series.iter().enumerate() {
        for (name, k) in styles {
            let color = Palette99::pick(si * 3 + k).to_rgba();
            let line: Vec<(f64, f64)> = pts
                .iter()
                .map(|p| (p.0, [p.1, p.2, p.3][k].max(10.0)))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(format!("{label} {name}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart
                .draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Applied blocks/s per report, one bar per (shards, report) given as `shards=path`.
pub fn events_svg(inputs: &[(String, String)], out: &Path) -> Result<(), String> {
    let mut bars = Vec::new();
    for (label, path) in inputs {
        let r = read(path)?;
        let v = f(&r["events"]["blocks_applied_per_sec"]);
        let workers = r["events"]["workers"].as_u64().unwrap_or(0);
        bars.push((format!("{label}, {workers} workers"), v / 1e6));
    }
    if bars.is_empty() {
        return Err("no event reports".into());
    }
    let ymax = bars.iter().map(|b| b.1).fold(0.1, f64::max);
    let root = SVGBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "blocks applied per second (ZMQ → decode → ring → shard)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0usize..n, 0f64..ymax * 1.2)
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|i| names.get(*i).cloned().unwrap_or_default())
        .y_desc("million blocks / s")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(
            bars.iter().enumerate().map(|(i, b)| {
                Rectangle::new([(i, 0.0), (i + 1, b.1)], Palette99::pick(i).filled())
            }),
        )
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// `label=path` pairs (a bare path is its own label).
pub fn labelled(args: &[String]) -> Vec<(String, String)> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((l, p)) => (l.to_string(), p.to_string()),
            None => (a.clone(), a.clone()),
        })
        .collect()
}
