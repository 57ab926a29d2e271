//! An index's `kvix_group_specs` in a dump: per worker, its KV-cache groups other
//! than full attention, as their stores described them (kvix's addition; a dump
//! without it holds full attention alone).
//!
//! Shape: `[{"worker_id", "dp_rank", "align", "groups": [{"group_idx", "kind",
//! "block_size", "sliding_window" | "attention_chunk_size"}]}]`. Every group read
//! counts against the dump's block budget, so a dump cannot grow memory here past
//! its limits either. A malformed worker entry is skipped and counted; never
//! touches the index.

use super::{Budget, Scalar, Skip, fields, opt_u32, worker_of};
use crate::ingest::feed::SeedGroups;
use crate::registry::InstanceKey;
use crate::shard::hybrid::{GroupRule, GroupSpec};
use crate::shard::tree::MAX_GROUPS;
use crate::types::DpRank;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;

/// Each worker's groups, as one index of the dump describes them.
pub(super) type Specs = BTreeMap<(InstanceKey, DpRank), SeedGroups>;

/// The whole list: the workers' groups, and how many entries were malformed.
pub(super) struct SpecListSeed<'a>(pub(super) &'a Budget);
seed_of_any!(SpecListSeed<'a>);

impl<'de> Visitor<'de> for SpecListSeed<'_> {
    type Value = (Specs, usize);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of workers' KV-cache groups")
    }
    read_through!((Specs::new(), 1), map);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut specs, mut bad) = (Specs::new(), 0);
        while let Some(entry) = seq.next_element_seed(WorkerSeed(self.0))? {
            match entry {
                Some((key, groups)) => {
                    specs.insert(key, groups);
                }
                None => bad += 1,
            }
        }
        Ok((specs, bad))
    }
}

/// One worker's entry; `None` if malformed.
struct WorkerSeed<'a>(&'a Budget);
seed_of_any!(WorkerSeed<'a>);

impl<'de> Visitor<'de> for WorkerSeed<'_> {
    type Value = Option<((InstanceKey, DpRank), SeedGroups)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a worker's KV-cache groups")
    }
    read_through!(None, seq);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut worker, mut dp, mut align) = (Scalar::Absent, Scalar::Absent, Scalar::Absent);
        let mut groups = None;
        let names = &["worker_id", "dp_rank", "align", "groups"];
        fields(&mut map, names, |field, map| {
            match field {
                0 => worker = map.next_value()?,
                1 => dp = map.next_value()?,
                2 => align = map.next_value()?,
                _ => groups = map.next_value_seed(GroupsSeed(self.0))?,
            }
            Ok(())
        })?;
        let key = worker_of(&worker, &dp);
        Ok(key
            .zip(opt_u32(&align))
            .zip(groups)
            .map(|((key, align), mut groups)| {
                groups.sort_unstable_by_key(|g: &(u8, GroupSpec)| g.0);
                groups.dedup_by_key(|g| g.0);
                (key, SeedGroups { groups, align })
            }))
    }
}

/// A worker's groups; `None` if any is malformed (read through to the end).
struct GroupsSeed<'a>(&'a Budget);
seed_of_any!(GroupsSeed<'a>);

impl<'de> Visitor<'de> for GroupsSeed<'_> {
    type Value = Option<Vec<(u8, GroupSpec)>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of KV-cache groups")
    }
    read_through!(None, map);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut groups = Some(Vec::new());
        while let Some(g) = seq.next_element_seed(GroupSeed)? {
            self.0.take()?;
            match (g, groups.as_mut()) {
                (Some(g), Some(all)) => all.push(g),
                _ => groups = None,
            }
        }
        Ok(groups)
    }
}

/// One group: `{"group_idx", "kind", "block_size", ...}`; `None` if malformed or
/// of a kind with no rule here.
struct GroupSeed;
seed_of_any!(GroupSeed);

impl<'de> Visitor<'de> for GroupSeed {
    type Value = Option<(u8, GroupSpec)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a KV-cache group")
    }
    read_through!(None, seq);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut v: [Scalar; 5] = Default::default();
        let names = &[
            "group_idx",
            "kind",
            "block_size",
            "sliding_window",
            "attention_chunk_size",
        ];
        fields(&mut map, names, |field, map| {
            v[field] = map.next_value()?;
            Ok(())
        })?;
        let [idx, kind, block_size, window, chunk] = &v;
        let group = idx
            .u64()
            .filter(|&g| g < MAX_GROUPS as u64)
            .map(|g| g as u8);
        let block_size = opt_u32(block_size).flatten().filter(|&b| b > 0);
        let param = |s: &Scalar| opt_u32(s).map(|p| p.unwrap_or(0));
        let rule = match kind {
            Scalar::Str(k) if k == "sliding_window" => param(window).map(GroupRule::SlidingWindow),
            Scalar::Str(k) if k == "chunked_local_attention" => {
                param(chunk).map(GroupRule::ChunkedLocal)
            }
            Scalar::Str(k) if k == "mamba" => Some(GroupRule::Mamba),
            _ => None,
        };
        Ok(group
            .zip(block_size)
            .zip(rule)
            .map(|((g, block_size), rule)| (g, GroupSpec { rule, block_size })))
    }
}
