//! Parse a `/dump` (kvix's or Dynamo's `dynamo-kv-indexer`) into recovered [`State`],
//! streamed from a reader.
//!
//! Shape (Dynamo's standalone-indexer docs): `{"model:tenant": {"block_size": N, "events": [RouterEvent]}}`,
//! a RouterEvent being `{"worker_id", "storage_tier", "event": {"event_id", "data":
//! {"stored": {"parent_hash", "blocks": [{"block_hash", "tokens_hash"}]}}, "dp_rank"}}`.
//! `block_hash`/`parent_hash` are the worker's engine hashes, `tokens_hash` the Dynamo
//! local hash. Several blocks in one stored event chain on each other. `removed` and
//! `cleared` events are ignored (a dump describes what is held). A malformed event is
//! skipped and counted; a malformed document is an error. kvix's own additions, which
//! Dynamo's readers ignore: a stored event's `kvix_parent_seq` (the parent's sequence
//! hash) and, for a hybrid model, `kvix_groups` (the other KV-cache groups holding its
//! blocks, as bits by `group_idx`), and an index's `kvix_group_specs` (each worker's
//! groups: `dump/groups.rs`). A dump without them holds full attention alone.
//!
//! The body is never held whole: events are read one at a time into the blocks being
//! recovered, so memory follows the blocks, not the bytes. [`DumpLimits`] bounds the
//! bytes read and the blocks kept; any JSON string (a key, a name) longer than
//! [`MAX_STRING`] and nesting deeper than serde_json's 128 levels are refused, so no
//! single token can grow a buffer either. Never touches the index.
//!
//! `guard.rs` is the byte guard; `json.rs` the JSON pieces the seeds read with;
//! `event.rs` one RouterEvent; `groups.rs` an index's `kvix_group_specs`. Here:
//! the limits, the document and its indexes.

// First: its macros serve the modules declared after it.
#[macro_use]
mod json;
mod event;
mod groups;
mod guard;

use super::{IndexState, RecoveryError, State, WorkerBlocks};
use crate::ingest::feed::SeedBlock;
use crate::registry::InstanceKey;
use crate::types::{DpRank, Tier};
use event::EventSeed;
use groups::{SpecListSeed, Specs};
use guard::{Guarded, Refused};
use json::{Scalar, Skip, fields, opt_u32, worker_of};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use thiserror::Error;

/// The longest JSON string a dump may carry, in bytes as sent (names and keys are
/// short; hashes are numbers).
pub const MAX_STRING: usize = 64 * 1024;

/// What one peer's dump may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpLimits {
    /// Bytes read from the body (`--max-peer-dump-bytes`).
    pub max_bytes: u64,
    /// Blocks kept over every index (`--max-peer-dump-blocks`).
    pub max_blocks: u64,
}

impl Default for DumpLimits {
    fn default() -> Self {
        DumpLimits {
            max_bytes: 8 << 30,
            max_blocks: 50_000_000,
        }
    }
}

/// Why a dump was not taken. [`DumpError::reason`] labels it in `/metrics`.
#[derive(Debug, Error)]
pub enum DumpError {
    /// No answer, or not a 200 (a recovering peer answers 503).
    #[error("{0}")]
    Unreachable(String),
    #[error("dump larger than {0} bytes (--max-peer-dump-bytes)")]
    TooLarge(u64),
    #[error("dump holds more than {0} blocks (--max-peer-dump-blocks)")]
    TooManyBlocks(u64),
    #[error("malformed dump: {0}")]
    Malformed(String),
    #[error("dump broken off: {0}")]
    Read(String),
}

impl DumpError {
    /// A short label of the cause, one of [`crate::app::PEER_DUMP_FAILURES`].
    pub fn reason(&self) -> &'static str {
        match self {
            DumpError::Unreachable(_) => "unreachable",
            DumpError::TooLarge(_) => "too_large",
            DumpError::TooManyBlocks(_) => "too_many_blocks",
            DumpError::Malformed(_) => "malformed",
            DumpError::Read(_) => "broken_off",
        }
    }
}

fn tier(name: Option<&str>) -> Tier {
    match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("device") | Some("gpu") => Tier::DEVICE,
        Some("host_pinned") | Some("host") | Some("cpu") => Tier::HOST,
        Some("disk") => Tier::DISK,
        _ => Tier(3),
    }
}

/// Parse a whole dump document held in memory (no limit beyond its length).
pub fn parse(body: &[u8]) -> Result<State, RecoveryError> {
    parse_counted(body).map(|(state, _)| state)
}

/// [`parse`], and how many malformed events it skipped.
fn parse_counted(body: &[u8]) -> Result<(State, usize), RecoveryError> {
    let limits = DumpLimits {
        max_bytes: body.len() as u64,
        max_blocks: u64::MAX,
    };
    Ok(read(body, limits)?)
}

/// Read a dump from `r` within `limits`: the state, and how many malformed events
/// were skipped. Reads up to the end of the document and checks that only
/// whitespace follows it.
pub fn read<R: Read>(r: R, limits: DumpLimits) -> Result<(State, usize), DumpError> {
    let budget = Budget {
        blocks: Cell::new(0),
        max: limits.max_blocks,
    };
    let reader = std::io::BufReader::with_capacity(64 * 1024, Guarded::new(r, limits.max_bytes));
    let mut de = serde_json::Deserializer::from_reader(reader);
    let doc = DocSeed(&budget)
        .deserialize(&mut de)
        .and_then(|doc| de.end().map(|()| doc));
    match doc {
        Ok(doc) => Ok(doc.into_state()),
        Err(_) if budget.blocks.get() > budget.max => Err(DumpError::TooManyBlocks(budget.max)),
        Err(e) if e.is_io() => {
            let io = std::io::Error::from(e);
            Err(
                match io.get_ref().and_then(|e| e.downcast_ref::<Refused>()) {
                    Some(Refused::Bytes) => DumpError::TooLarge(limits.max_bytes),
                    Some(r @ Refused::LongString) => DumpError::Malformed(r.to_string()),
                    None => DumpError::Read(io.to_string()),
                },
            )
        }
        Err(e) => Err(DumpError::Malformed(e.to_string())),
    }
}

/// Blocks kept so far, against the limit.
struct Budget {
    blocks: Cell<u64>,
    max: u64,
}

impl Budget {
    /// Count one more block (or group description) kept; an error past the limit.
    fn take<E: de::Error>(&self) -> Result<(), E> {
        let n = self.blocks.get() + 1;
        self.blocks.set(n);
        if n > self.max {
            return Err(E::custom("too many blocks"));
        }
        Ok(())
    }
}

/// A worker's blocks as one index of the dump collects them.
type Workers = BTreeMap<(InstanceKey, DpRank), Vec<SeedBlock>>;

/// The indexes read so far (a key given twice: the later one stands, as a map reads).
#[derive(Default)]
struct Doc {
    indexes: BTreeMap<String, IndexState>,
    skipped: usize,
}

impl Doc {
    fn into_state(self) -> (State, usize) {
        let state = State {
            indexes: self.indexes.into_values().collect(),
        };
        (state, self.skipped)
    }
}

/// The whole document: an object of indexes.
struct DocSeed<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for DocSeed<'_> {
    type Value = Doc;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Doc, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DocSeed<'_> {
    type Value = Doc;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of \"model:tenant\" indexes")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let mut doc = Doc::default();
        while let Some(key) = map.next_key::<String>()? {
            let (ix, bad) = map.next_value_seed(IndexSeed {
                key: &key,
                budget: self.0,
            })?;
            if bad > 0 {
                tracing::warn!(index = key, bad, "malformed dump events skipped");
            }
            doc.skipped += bad;
            doc.indexes.insert(key, ix);
        }
        Ok(doc)
    }
}

/// One index: `{"block_size": N, "events": [...]}`; the index and its malformed events.
struct IndexSeed<'a> {
    key: &'a str,
    budget: &'a Budget,
}

impl<'de> DeserializeSeed<'de> for IndexSeed<'_> {
    type Value = (IndexState, usize);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexSeed<'_> {
    type Value = (IndexState, usize);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "index {}: an object with block_size and events",
            self.key
        )
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut block_size, mut events, mut specs) = (None, None, (Specs::new(), 0));
        let names = &["block_size", "events", "kvix_group_specs"];
        fields(&mut map, names, |field, map| {
            match field {
                0 => block_size = map.next_value::<Scalar>()?.u64(),
                1 => events = Some(map.next_value_seed(EventsSeed(self.budget))?),
                _ => specs = map.next_value_seed(SpecListSeed(self.budget))?,
            }
            Ok(())
        })?;
        let key = self.key;
        let block_size = block_size
            .filter(|b| *b > 0 && *b <= u32::MAX as u64)
            .ok_or_else(|| de::Error::custom(format!("{key}: no block_size")))?
            as u32;
        let (workers, bad) =
            events.ok_or_else(|| de::Error::custom(format!("{key}: no events")))?;
        let (mut specs, bad_specs) = specs;
        // Model names may contain ':'; tenants (Dynamo routing groups) do not.
        let (model, tenant) = key
            .rsplit_once(':')
            .map(|(m, t)| (m.to_string(), t.to_string()))
            .unwrap_or((key.to_string(), "default".to_string()));
        let ix = IndexState {
            model,
            tenant,
            block_size,
            listeners: Vec::new(),
            workers: workers
                .into_iter()
                .map(|(worker, blocks)| WorkerBlocks {
                    // A worker without blocks has nothing its groups could hold.
                    groups: specs.remove(&worker).unwrap_or_default(),
                    instance: worker.0,
                    dp: worker.1,
                    blocks,
                })
                .collect(),
        };
        Ok((ix, bad + bad_specs))
    }
}

/// An index's events, filed by worker as they are read; and the malformed ones.
struct EventsSeed<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = (Workers, usize);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = (Workers, usize);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut workers, mut bad) = (Workers::new(), 0);
        while let Some(event) = seq.next_element_seed(EventSeed(self.0))? {
            bad += event.file(&mut workers);
        }
        Ok((workers, bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::EngineHash;

    #[test]
    fn dynamo_shaped_dump_with_chains_and_other_events() {
        let doc = br#"{"m:x:default": {"block_size": 4, "events": [
          {"worker_id": 1, "storage_tier": "device", "event": {"event_id": 0,
            "data": {"stored": {"parent_hash": null, "blocks": [
              {"block_hash": 10, "tokens_hash": 100}, {"block_hash": -2, "tokens_hash": 200}]}},
            "dp_rank": 1}},
          {"worker_id": 1, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [10]}}, "dp_rank": 1}},
          {"worker_id": 1, "event": {"event_id": 2, "data": "cleared", "dp_rank": 0}},
          {"worker_id": "vllm-1", "event": {"event_id": 3, "data": {"stored": {"parent_hash": null,
            "blocks": [{"block_hash": 5, "tokens_hash": 50}]}}, "dp_rank": 0}},
          {"worker_id": [1]}
        ]}}"#;
        let s = parse(doc).unwrap();
        assert_eq!(s.indexes.len(), 1);
        let ix = &s.indexes[0];
        assert_eq!(
            (ix.model.as_str(), ix.tenant.as_str(), ix.block_size),
            ("m:x", "default", 4)
        );
        assert_eq!(ix.workers.len(), 2);
        let w = &ix.workers[0];
        assert_eq!((&w.instance, w.dp), (&InstanceKey::Id(1), 1));
        assert_eq!(ix.workers[1].instance, InstanceKey::Name("vllm-1".into()));
        assert_eq!(w.blocks[1].parent_engine, Some(EngineHash(10)));
        assert_eq!(w.blocks[1].engine, EngineHash(u64::MAX - 1));
        assert!(parse(b"[1,2]").is_err());
        assert!(parse(b"{\"a:b\": {\"events\": []}}").is_err());
    }

    #[test]
    fn kvix_group_fields_give_each_worker_its_groups_and_each_block_its_bits() {
        use crate::ingest::feed::SeedGroups;
        use crate::shard::hybrid::{GroupRule, GroupSpec};
        let doc = br#"{"m:t": {"block_size": 4, "kvix_group_specs": [
            {"worker_id": 1, "dp_rank": 1, "align": 8, "groups": [
              {"group_idx": 2, "kind": "mamba", "block_size": 8},
              {"group_idx": 0, "kind": "sliding_window", "block_size": 4, "sliding_window": 9}]},
            {"worker_id": 2, "groups": [{"group_idx": 1, "kind": "chunked_local_attention",
              "block_size": 4, "attention_chunk_size": 16}]},
            {"worker_id": 3, "groups": [{"group_idx": 32, "kind": "mamba", "block_size": 4}]},
            {"worker_id": 3, "groups": [{"group_idx": 1, "kind": "cross_attention", "block_size": 4}]},
            {"worker_id": 9, "groups": []},
            7
          ], "events": [
          {"worker_id": 1, "event": {"data": {"stored": {"parent_hash": null, "kvix_groups": 5,
            "blocks": [{"block_hash": 10, "tokens_hash": 100}, {"block_hash": 11, "tokens_hash": 110}]}},
            "dp_rank": 1}},
          {"worker_id": 2, "event": {"data": {"stored": {"parent_hash": null,
            "blocks": [{"block_hash": 20, "tokens_hash": 200}]}}}},
          {"worker_id": 2, "event": {"data": {"stored": {"parent_hash": null, "kvix_groups": -1,
            "blocks": [{"block_hash": 21, "tokens_hash": 210}]}}}}
        ]}}"#;
        let (s, skipped) = parse_counted(doc).unwrap();
        // Worker 3's two entries (a group past 31, a kind with no rule), the bare 7
        // and the event whose bits are no u32.
        assert_eq!(skipped, 4);
        let ix = &s.indexes[0];
        let w1 = &ix.workers[0];
        assert_eq!(
            w1.groups,
            SeedGroups {
                groups: vec![
                    (
                        0,
                        GroupSpec {
                            rule: GroupRule::SlidingWindow(9),
                            block_size: 4
                        }
                    ),
                    (
                        2,
                        GroupSpec {
                            rule: GroupRule::Mamba,
                            block_size: 8
                        }
                    ),
                ],
                align: Some(8),
            }
        );
        assert_eq!(
            w1.blocks.iter().map(|b| b.groups).collect::<Vec<_>>(),
            [5, 5]
        );
        let w2 = &ix.workers[1];
        assert_eq!(w2.groups.align, None);
        assert_eq!(w2.groups.groups[0].1.rule, GroupRule::ChunkedLocal(16));
        assert_eq!(
            w2.blocks
                .iter()
                .map(|b| (b.engine.0, b.groups))
                .collect::<Vec<_>>(),
            [(20, 0)]
        );
        // Worker 9 has groups and no block: nothing to hold them.
        assert_eq!(ix.workers.len(), 2);
        // Group descriptions count against the block limit too.
        let limits = DumpLimits {
            max_bytes: doc.len() as u64,
            max_blocks: 5,
        };
        let e = read(&doc[..], limits).unwrap_err();
        assert!(matches!(e, DumpError::TooManyBlocks(5)), "{e}");
    }

    #[test]
    fn a_dp_rank_that_is_no_u32_skips_its_event_as_malformed() {
        let ev = |dp: &str, bh: u64| {
            format!(
                r#"{{"worker_id": 1, "event": {{"event_id": 0, "data": {{"stored": {{
                  "parent_hash": null, "blocks": [{{"block_hash": {bh}, "tokens_hash": 1}}]}}}}
                  {dp}}}}}"#
            )
        };
        let events = [
            // 2^32 + 1 would have been read as rank 1.
            ev(r#", "dp_rank": 4294967297"#, 10),
            ev(r#", "dp_rank": -1"#, 11),
            ev(r#", "dp_rank": "1""#, 12),
            ev(r#", "dp_rank": 1.5"#, 13),
            ev(r#", "dp_rank": 4294967295"#, 14),
            ev(r#", "dp_rank": null"#, 15),
            ev("", 16),
        ];
        let doc = format!(
            r#"{{"m:t": {{"block_size": 4, "events": [{}]}}}}"#,
            events.join(",")
        );
        let (s, skipped) = parse_counted(doc.as_bytes()).unwrap();
        assert_eq!(skipped, 4);
        let got: Vec<(DpRank, Vec<u64>)> = s.indexes[0]
            .workers
            .iter()
            .map(|w| (w.dp, w.blocks.iter().map(|b| b.engine.0).collect()))
            .collect();
        assert_eq!(got, vec![(0, vec![15, 16]), (u32::MAX, vec![14])]);
    }

    /// A reader of `n` spaces and then `tail`, made as it is read.
    struct Spaces {
        left: u64,
        tail: std::io::Cursor<Vec<u8>>,
    }

    impl Read for Spaces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.left == 0 {
                return self.tail.read(buf);
            }
            let n = buf.len().min(self.left as usize);
            buf[..n].fill(b' ');
            self.left -= n as u64;
            Ok(n)
        }
    }

    fn doc(blocks: usize) -> String {
        let blocks: Vec<String> = (0..blocks)
            .map(|i| format!(r#"{{"block_hash": {i}, "tokens_hash": {i}}}"#))
            .collect();
        format!(
            r#"{{"m:t": {{"block_size": 4, "events": [{{"worker_id": 1, "event":
               {{"data": {{"stored": {{"parent_hash": null, "blocks": [{}]}}}}}}}}]}}}}"#,
            blocks.join(",")
        )
    }

    #[test]
    fn bytes_and_blocks_past_the_limits_refuse_the_dump() {
        let d = doc(3);
        let limits = |max_bytes: usize, max_blocks| DumpLimits {
            max_bytes: max_bytes as u64,
            max_blocks,
        };
        let (s, _) = read(d.as_bytes(), limits(d.len(), 3)).unwrap();
        assert_eq!(s.blocks(), 3);
        let e = read(d.as_bytes(), limits(d.len() - 1, 3)).unwrap_err();
        assert!(matches!(e, DumpError::TooLarge(_)), "{e}");
        let e = read(d.as_bytes(), limits(d.len(), 2)).unwrap_err();
        assert!(matches!(e, DumpError::TooManyBlocks(2)), "{e}");
        assert_eq!(e.reason(), "too_many_blocks");
    }

    #[test]
    fn whitespace_streams_through_and_only_whitespace_may_follow() {
        let limits = DumpLimits {
            max_bytes: 1 << 30,
            max_blocks: 10,
        };
        let body = Spaces {
            left: 64 << 20,
            tail: std::io::Cursor::new(doc(2).into_bytes()),
        };
        let (s, skipped) = read(body, limits).unwrap();
        assert_eq!((s.blocks(), skipped), (2, 0));
        // Whitespace in strings is kept; between tokens it still separates them.
        let d = "{\"m \\\"  x\\t:t\" :\n\n {\"block_size\": 4, \"events\": [ ] } }";
        let (s, _) = read(d.as_bytes(), limits).unwrap();
        assert_eq!(s.indexes[0].model, "m \"  x\t");
        let d = r#"{"m:t": {"block_size": 4 2, "events": []}}"#;
        assert!(matches!(
            read(d.as_bytes(), limits),
            Err(DumpError::Malformed(_))
        ));
        let tail = std::io::Cursor::new(b"{} x".to_vec());
        let e = read(Spaces { left: 10, tail }, limits).unwrap_err();
        assert!(matches!(e, DumpError::Malformed(_)), "{e}");
        let tail = std::io::Cursor::new(b"{}".to_vec());
        let e = read(
            Spaces {
                left: 1 << 20,
                tail,
            },
            DumpLimits {
                max_bytes: 4096,
                ..limits
            },
        );
        assert!(matches!(e, Err(DumpError::TooLarge(4096))));
    }

    #[test]
    fn no_single_token_or_nesting_grows_a_buffer() {
        let limits = DumpLimits::default();
        // A key longer than any name: refused, wherever it is.
        let long = "k".repeat(MAX_STRING + 1);
        for d in [
            format!(r#"{{"{long}": {{"block_size": 4, "events": []}}}}"#),
            format!(r#"{{"m:t": {{"block_size": 4, "events": [], "x": "{long}"}}}}"#),
        ] {
            let e = read(d.as_bytes(), limits).unwrap_err();
            assert!(
                matches!(e, DumpError::Malformed(ref m) if m.contains("string")),
                "{e}"
            );
        }
        // Escapes count, and an escaped quote does not end the string.
        let escaped = r#"\""#.repeat(MAX_STRING / 2 + 1);
        let d = format!(r#"{{"m:t": {{"block_size": 4, "events": [], "x": "{escaped}"}}}}"#);
        assert!(read(d.as_bytes(), limits).is_err());
        let d = format!(
            r#"{{"m:t": {{"block_size": 4, "events": [], "x": "{}"}}}}"#,
            r#"\""#.repeat(100)
        );
        assert!(read(d.as_bytes(), limits).is_ok());
        // Nesting in a field nobody reads: serde_json's depth limit holds there too.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let d = format!(r#"{{"m:t": {{"block_size": 4, "events": [], "x": {deep}}}}}"#);
        let e = read(d.as_bytes(), limits).unwrap_err();
        assert!(matches!(e, DumpError::Malformed(_)), "{e}");
        // Shallow nesting there is read through.
        let d = r#"{"m:t": {"block_size": 4, "x": [[{"a": [1, "b"]}]], "events": []}}"#;
        assert_eq!(read(d.as_bytes(), limits).unwrap().0.indexes.len(), 1);
    }
}
