//! Families gathered for one scrape, and their encoding as Prometheus text.
//!
//! Owns the one-shot `prometheus-client` collector: samples are gathered into
//! [`Gathered`] first, then encoded in one pass. Must never read a figure itself:
//! the family builders hand it values.

use super::stats::{BUCKETS, Hist, ShardStats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

type Labels = Vec<(String, String)>;

pub(super) enum Value {
    Counter(u64),
    Gauge(i64),
    Hist(Hist),
}

pub(super) struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// Everything one scrape shows, gathered before encoding.
#[derive(Default)]
pub(super) struct Gathered {
    families: Vec<Family>,
}

impl std::fmt::Debug for Gathered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gathered({} families)", self.families.len())
    }
}

impl Gathered {
    pub(super) fn add(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: MetricType,
    ) -> &mut Family {
        self.families.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }
}

impl Family {
    /// One sample per shard, labelled with the shard's number.
    pub(super) fn per_shard(
        &mut self,
        shards: &[ShardStats],
        value: impl Fn(&ShardStats) -> Value,
    ) {
        for s in shards {
            self.with(&[("shard", s.shard.to_string())], value(s));
        }
    }

    pub(super) fn with(&mut self, labels: &[(&str, String)], v: Value) -> &mut Self {
        self.samples.push((
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            v,
        ));
        self
    }
}

impl Collector for Gathered {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let mut me = enc.encode_descriptor(f.name, f.help, None, f.kind)?;
            // A single unlabelled sample is written bare (`name 1`, not `name{} 1`).
            if let [(labels, v)] = f.samples.as_slice()
                && labels.is_empty()
            {
                encode_value(v, me)?;
                continue;
            }
            for (labels, v) in &f.samples {
                encode_value(v, me.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

fn encode_value(
    v: &Value,
    mut enc: prometheus_client::encoding::MetricEncoder,
) -> Result<(), std::fmt::Error> {
    match v {
        Value::Counter(n) => ConstCounter::new(*n).encode(enc),
        Value::Gauge(n) => ConstGauge::new(*n).encode(enc),
        Value::Hist(h) => {
            let buckets: Vec<(f64, u64)> = BUCKETS
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .zip(h.counts.iter().copied())
                .collect();
            enc.encode_histogram::<Vec<(String, String)>>(h.sum, h.count, &buckets, None)
        }
    }
}

pub(super) fn encode(g: Gathered) -> String {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(g));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        tracing::error!("cannot encode metrics: {e}");
    }
    out
}
