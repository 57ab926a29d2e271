//! Plots from `--json` reports: query latency percentiles vs offered load,
//! applied blocks/s vs shard count, and how each figure grows with the index
//! (`perf/compare.py scale-series`). Reads reports, writes SVG; measures nothing.

use plotters::coord::ranged1d::ValueFormatter;
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
        let first = &r["queries"][0]["target"];
        let mut pts: Vec<(f64, f64, f64, f64)> = r["queries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|q| {
                // An interleaved report holds a second server's phases too: only
                // those of its --url (whose phase comes first) are this series.
                let own = q.get("target").is_none_or(|t| t == first);
                own && q["endpoint"] == endpoint
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
    let styles = [("p50", 0usize), ("p99", 1), ("p99.9", 2)];
    let mut lines = Vec::new();
    for (si, (label, pts)) in series.iter().enumerate() {
        for (name, k) in styles {
            lines.push(Series {
                label: format!("{label} {name}"),
                color: si * 3 + k,
                points: pts
                    .iter()
                    .map(|p| (p.0, [p.1, p.2, p.3][k].max(10.0)))
                    .collect(),
            });
        }
    }
    let axes = ("offered load (requests/s)", "latency (µs, log scale)");
    draw_lines(&mut chart, axes, &lines, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(|e| e.to_string())
}

/// One line of a chart: its legend label, its palette colour and its points.
struct Series {
    label: String,
    color: usize,
    points: Vec<(f64, f64)>,
}

/// Axes described as `(x, y)`, then each series as a line with a dot on each
/// point, then the legend at `legend`.
fn draw_lines<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    legend: SeriesLabelPosition,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for s in series {
        let color = Palette99::pick(s.color).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(legend)
        .draw()
        .map_err(|e| e.to_string())
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

/// The systems of a scale series, as `perf/compare.py` names them, with their labels.
const SCALE_SYSTEMS: [(&str, &str); 2] = [("kvix", "kvix"), ("dynamo", "Dynamo 1.6.1")];

/// One panel of the scale plot: a metric of `perf/compare.py`, what it is, a unit
/// divisor and whether its axis is logarithmic.
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    /// (metric key, series suffix) drawn in this panel.
    metrics: &'static [(&'static str, &'static str)],
    scale: f64,
    log: bool,
}

const SCALE_PANELS: [Panel; 4] = [
    Panel {
        title: "events: blocks applied per second",
        y_desc: "million blocks / s",
        metrics: &[("applied", "")],
        scale: 1e6,
        log: false,
    },
    Panel {
        title: "/query, 1k-token prompts, 16 connections",
        y_desc: "thousand requests / s",
        metrics: &[("q16_rps", "")],
        scale: 1e3,
        log: false,
    },
    Panel {
        title: "/query latency: p50 at 1 connection, p99 at 16",
        y_desc: "µs (log scale)",
        metrics: &[("q1_p50", " p50 1c"), ("q16_p99", " p99 16c")],
        scale: 1.0,
        log: true,
    },
    Panel {
        title: "settled RSS per live (block, worker) pair",
        y_desc: "bytes",
        metrics: &[("bpp", "")],
        scale: 1.0,
        log: false,
    },
];

/// What a series of points is plotted against: each point's `key`, divided by
/// `divisor`, on a log scale.
pub struct XAxis {
    key: &'static str,
    divisor: f64,
    desc: &'static str,
}

/// `perf/compare.py scale-series`: the index size.
pub const BY_INDEX_SIZE: XAxis = XAxis {
    key: "live_pairs",
    divisor: 1e6,
    desc: "live (block, worker) pairs, millions (log scale)",
};

/// `perf/fleet_table.py`: the engines registered.
pub const BY_ENGINES: XAxis = XAxis {
    key: "workers",
    divisor: 1.0,
    desc: "engines registered (log scale)",
};

/// The figures of a series (`perf/compare.py scale-series`, `perf/fleet_table.py`),
/// kvix and Dynamo in each of four panels (events/s, 16-connection req/s, latency,
/// bytes per pair), against `axis`. A system's point without a figure (it failed
/// at that size) is left out of its line.
pub fn scale_svg(path: &str, axis: &XAxis, out: &Path) -> Result<(), String> {
    let r = read(path)?;
    let points = r["points"].as_array().cloned().unwrap_or_default();
    let sizes: Vec<f64> = points
        .iter()
        .map(|p| f(&p[axis.key]) / axis.divisor)
        .collect();
    if sizes.is_empty() || sizes.iter().any(|&x| x <= 0.0) {
        return Err(format!("{path}: no points with `{}`", axis.key));
    }
    let (xmin, xmax) = sizes
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let root = SVGBackend::new(out, (1200, 840)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(
            &format!(
                "How cost grows with the {} ({} workload)",
                if axis.key == BY_ENGINES.key {
                    "fleet"
                } else {
                    "index"
                },
                r["workload"].as_str().unwrap_or("?")
            ),
            ("sans-serif", 24),
        )
        .map_err(|e| e.to_string())?;
    for (panel, area) in SCALE_PANELS.iter().zip(root.split_evenly((2, 2))) {
        // Per (system, metric): the points that have the figure.
        let mut series = Vec::new();
        for (si, (key, label)) in SCALE_SYSTEMS.iter().enumerate() {
            for (mi, (metric, suffix)) in panel.metrics.iter().enumerate() {
                let line: Vec<(f64, f64)> = points
                    .iter()
                    .zip(&sizes)
                    .filter_map(|(p, &x)| p[*key][*metric].as_f64().map(|y| (x, y / panel.scale)))
                    .collect();
                series.push(Series {
                    label: format!("{label}{suffix}"),
                    color: si * 2 + mi,
                    points: line,
                });
            }
        }
        let ymax = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(1.0, f64::max);
        let ymin = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(ymax, f64::min);
        let mut chart = ChartBuilder::on(&area);
        chart
            .caption(panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64);
        let x = (xmin / 1.5..xmax * 1.5).log_scale();
        let axes = (axis.desc, panel.y_desc);
        let legend = SeriesLabelPosition::UpperRight;
        if panel.log {
            // Headroom above the lines for the legend.
            let y = (ymin / 2.0..ymax * 6.0).log_scale();
            let mut chart = chart.build_cartesian_2d(x, y).map_err(|e| e.to_string())?;
            draw_lines(&mut chart, axes, &series, legend)?;
        } else {
            let y = 0f64..ymax * 1.25;
            let mut chart = chart.build_cartesian_2d(x, y).map_err(|e| e.to_string())?;
            draw_lines(&mut chart, axes, &series, legend)?;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("scale.json");
        std::fs::write(
            &path,
            format!(r#"{{"workload": "shared-prefix", "points": [{points}]}}"#),
        )
        .unwrap();
        let path = path.to_string_lossy().into_owned();
        (dir, path)
    }

    const POINT: &str = r#"{"live_pairs": 1000000,
        "kvix": {"applied": 7e6, "q16_rps": 55000, "q16_p99": 448, "q1_p50": 39, "bpp": 69},
        "dynamo": {"applied": 3e6, "q16_rps": 17000, "q16_p99": 1799, "q1_p50": 132, "bpp": null}}"#;

    #[test]
    fn scale_plot_draws_every_panel_and_system() {
        let big = POINT.replace("1000000", "50000000");
        let (dir, path) = series(&format!("{POINT}, {big}"));
        let out = dir.path().join("scale.svg");
        scale_svg(&path, &BY_INDEX_SIZE, &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        for panel in &SCALE_PANELS {
            assert!(svg.contains(panel.title), "{}", panel.title);
        }
        for label in ["kvix p50 1c", "Dynamo 1.6.1 p99 16c", "Dynamo 1.6.1"] {
            assert!(svg.contains(label), "{label}");
        }
    }

    #[test]
    fn scale_plot_refuses_a_series_without_sizes() {
        let (dir, path) = series("");
        assert!(scale_svg(&path, &BY_INDEX_SIZE, &dir.path().join("scale.svg")).is_err());
        let (dir, path) = series(&POINT.replace("1000000", "0"));
        assert!(scale_svg(&path, &BY_INDEX_SIZE, &dir.path().join("scale.svg")).is_err());
    }

    #[test]
    fn fleet_plot_draws_each_system_where_it_ran() {
        let (dir, path) = series(&format!(
            "{}, {}",
            POINT.replace("\"live_pairs\": 1000000", "\"workers\": 16"),
            r#"{"workers": 3000, "kvix": {"applied": 4e6, "q16_rps": 1700, "q16_p99": 16000,
                "q1_p50": 800, "bpp": 55}, "dynamo": {}}"#
        ));
        let out = dir.path().join("fleet.svg");
        scale_svg(&path, &BY_ENGINES, &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.contains("How cost grows with the fleet"));
        assert!(svg.contains(BY_ENGINES.desc));
        // By the index size, these points have none.
        assert!(scale_svg(&path, &BY_INDEX_SIZE, &out).is_err());
    }
}
