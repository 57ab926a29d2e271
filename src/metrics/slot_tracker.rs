//! The slot tracker's families: per tracker always, per rank only up to
//! `--slot-metrics-max-ranks` (series stay bounded), its refusals and expiries.

use super::{Gathered, ShardStats, Value};
use prometheus_client::metrics::MetricType;

/// The slot tracker's requests and blocks per tracker, and per worker rank while
/// the ranks are few enough (`--slot-metrics-max-ranks`); its expiries and
/// refusals.
pub(super) fn slot_families(g: &mut Gathered, shards: &[ShardStats]) {
    type Of = fn(&crate::slot_tracker::RankLoad) -> usize;
    // (per rank, per tracker, help of each, figure)
    let families: [(&str, &str, &str, &str, Of); 3] = [
        (
            "kvix_slot_active_requests",
            "kvix_slot_tracker_active_requests",
            "Requests booked on the slot tracker (/add, not yet freed), per worker rank; none above --slot-metrics-max-ranks ranks",
            "Requests booked on the slot tracker (/add, not yet freed), per tracker",
            |l| l.active_requests,
        ),
        (
            "kvix_slot_active_blocks",
            "kvix_slot_tracker_active_blocks",
            "Decode blocks of the slot tracker's booked requests (shared prefix blocks once), per worker rank; none above --slot-metrics-max-ranks ranks",
            "Decode blocks of the slot tracker's booked requests (shared prefix blocks once per rank), per tracker",
            |l| l.active_decode_blocks,
        ),
        (
            "kvix_slot_prefill_tokens",
            "kvix_slot_tracker_prefill_tokens",
            "Prompt tokens of booked requests whose prefill is not complete, per worker rank; none above --slot-metrics-max-ranks ranks",
            "Prompt tokens of booked requests whose prefill is not complete, per tracker",
            |l| l.active_prefill_tokens,
        ),
    ];
    let stats = || shards.iter().map(|s| &s.slots);
    let ranks: usize = stats().flat_map(|s| &s.trackers).map(|t| t.ranks).sum();
    let limit = stats().map(|s| s.metrics_max_ranks).min().unwrap_or(0);
    // A shard over the limit sent no ranks: all of them or none.
    let per_rank = ranks <= limit;
    let gauge = |n: usize| Value::Gauge(i64::try_from(n).unwrap_or(i64::MAX));
    for (name, by_tracker, help, tracker_help, of) in families {
        let f = g.add(name, help, MetricType::Gauge);
        if per_rank {
            for r in stats().flat_map(|s| &s.ranks) {
                f.with(
                    &[
                        ("model", r.key.model_name.clone()),
                        ("routing_group", r.key.routing_group.clone()),
                        ("worker_id", r.rank.worker_id.to_string()),
                        ("dp_rank", r.rank.dp_rank.to_string()),
                    ],
                    gauge(of(&r.load)),
                );
            }
        }
        let f = g.add(by_tracker, tracker_help, MetricType::Gauge);
        for t in stats().flat_map(|s| &s.trackers) {
            f.with(
                &[
                    ("model", t.key.model_name.clone()),
                    ("routing_group", t.key.routing_group.clone()),
                ],
                gauge(of(&t.load)),
            );
        }
    }
    let f = g.add(
        "kvix_slot_tracker_ranks",
        "Worker ranks registered on the slot tracker, per tracker",
        MetricType::Gauge,
    );
    for t in stats().flat_map(|s| &s.trackers) {
        f.with(
            &[
                ("model", t.key.model_name.clone()),
                ("routing_group", t.key.routing_group.clone()),
            ],
            gauge(t.ranks),
        );
    }
    let refused = stats().fold(crate::slot_tracker::Refused::default(), |a, s| {
        crate::slot_tracker::Refused {
            booking_blocks: a.booking_blocks + s.refused.booking_blocks,
            rank_blocks: a.rank_blocks + s.refused.rank_blocks,
            bookings: a.bookings + s.refused.bookings,
            tracker_blocks: a.tracker_blocks + s.refused.tracker_blocks,
        }
    });
    let bodies: u64 = shards.iter().map(|s| s.http.slot_bodies_refused).sum();
    let f = g.add(
        "kvix_slot_refused",
        "Slot-tracker calls refused by a bound, by reason: body (over --slot-max-body-bytes, 413), booking_blocks (over --slot-max-booking-blocks, 413), rank_blocks (over --slot-max-rank-blocks, 429), bookings (over --slot-max-bookings, 429), tracker_blocks (over --slot-max-tracker-blocks, 429)",
        MetricType::Counter,
    );
    for (reason, n) in [
        ("body", bodies),
        ("booking_blocks", refused.booking_blocks),
        ("rank_blocks", refused.rank_blocks),
        ("bookings", refused.bookings),
        ("tracker_blocks", refused.tracker_blocks),
    ] {
        f.with(&[("reason", reason.into())], Value::Counter(n));
    }
    g.add(
        "kvix_slot_requests_expired",
        "Slot-tracker requests never freed and dropped after --slot-request-ttl-secs",
        MetricType::Counter,
    )
    .with(
        &[],
        Value::Counter(shards.iter().map(|s| s.slots.expired).sum()),
    );
    if let Some(c) = shards.iter().find_map(|s| s.slots.sync) {
        let f = g.add(
            "kvix_slot_sync_events",
            "Slot-tracker steps shared with replicas (--slot-sync-*), by outcome: published, dropped_out (publisher queue full or send failed), received (from peers, handed to a shard), dropped_in (undecodable, or a shard's queue full)",
            MetricType::Counter,
        );
        for (outcome, n) in [
            ("published", c.published),
            ("dropped_out", c.dropped_out),
            ("received", c.received),
            ("dropped_in", c.dropped_in),
        ] {
            f.with(&[("outcome", outcome.into())], Value::Counter(n));
        }
    }
}
