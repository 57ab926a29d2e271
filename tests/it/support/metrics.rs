//! Reading `/metrics`: one sample family summed, by name and labels.

use super::*;

impl Server {
    /// One scalar of `/metrics` (sum over every sample of `name` whose labels include `labels`).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (st, text) = self.call("GET", "/metrics", None);
        assert_eq!(st, 200);
        metric_in(&text, name, labels)
    }
}

/// Sum of the samples of `name` (with `labels` among theirs) in Prometheus text.
pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("metrics parse");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            _ => 0.0,
        })
        .sum()
}
