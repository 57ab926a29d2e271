//! One RouterEvent of a dump: its fields as read, in any order, and the blocks
//! a stored event files for its worker.
//!
//! Owns what makes an event malformed (skipped and counted). Must never refuse
//! the document for one event: only the limits and a malformed document do.

use super::json::{Scalar, Skip, fields, opt_u32, worker_of};
use super::{Budget, Workers, tier};
use crate::ingest::feed::SeedBlock;
use crate::types::{BlockHash, EngineHash, SeqHash};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One event's fields, as read (each checked only when the event is filed, as the
/// fields may come in any order).
#[derive(Default)]
pub(super) struct Event {
    /// Not an object at all.
    shapeless: bool,
    worker_id: Scalar,
    storage_tier: Scalar,
    dp_rank: Scalar,
    stored: Option<Stored>,
}

#[derive(Default)]
pub(super) struct Stored {
    /// Not an object at all.
    shapeless: bool,
    parent_hash: Scalar,
    kvix_parent_seq: Scalar,
    kvix_groups: Scalar,
    /// `None`: not an array.
    blocks: Option<Blocks>,
}

/// A stored event's blocks up to the first malformed one, and whether there was one.
#[derive(Default)]
pub(super) struct Blocks {
    hashes: Vec<(u64, u64)>,
    bad: bool,
}

impl Event {
    /// File the event's blocks under its worker; 1 if it is malformed, else 0.
    pub(super) fn file(self, workers: &mut Workers) -> usize {
        if self.shapeless {
            return 1;
        }
        let Some((worker, dp)) = worker_of(&self.worker_id, &self.dp_rank) else {
            return 1;
        };
        let Some(stored) = self.stored else {
            return 0; // removed / cleared: nothing held
        };
        let t = match &self.storage_tier {
            Scalar::Str(s) => tier(Some(s)),
            _ => tier(None),
        };
        if stored.shapeless {
            return 1;
        }
        let mut parent = match &stored.parent_hash {
            s if s.is_null() => None,
            s => match s.hash() {
                Some(h) => Some(EngineHash(h)),
                None => return 1,
            },
        };
        // kvix peers add the parent's sequence hash: exact even for a block whose
        // parent was evicted (its engine hash no longer resolves).
        let mut parent_seq = stored.kvix_parent_seq.u64().map(SeqHash);
        let Some(groups) = opt_u32(&stored.kvix_groups) else {
            return 1;
        };
        let Some(blocks) = stored.blocks else {
            return 1;
        };
        let out = workers.entry((worker, dp)).or_default();
        for (bh, th) in blocks.hashes {
            out.push(SeedBlock {
                engine: EngineHash(bh),
                parent_engine: parent,
                parent_seq,
                local: BlockHash(th),
                tier: t,
                groups: groups.unwrap_or(0),
            });
            parent = Some(EngineHash(bh));
            parent_seq = None;
        }
        usize::from(blocks.bad)
    }
}

/// One RouterEvent.
pub(super) struct EventSeed<'a>(pub(super) &'a Budget);
seed_of_any!(EventSeed<'a>);

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = Event;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event")
    }
    read_through!(
        Event {
            shapeless: true,
            ..Event::default()
        },
        seq
    );
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        let mut ev = Event::default();
        fields(
            &mut map,
            &["worker_id", "storage_tier", "event"],
            |field, map| {
                match field {
                    0 => ev.worker_id = map.next_value()?,
                    1 => ev.storage_tier = map.next_value()?,
                    _ => {
                        // Not an object: no data and rank 0, so nothing held.
                        (ev.dp_rank, ev.stored) =
                            map.next_value_seed(InnerSeed(self.0))?.unwrap_or_default();
                    }
                }
                Ok(())
            },
        )?;
        Ok(ev)
    }
}

/// An event's `event`: `{"event_id", "data", "dp_rank"}`.
pub(super) struct InnerSeed<'a>(pub(super) &'a Budget);
seed_of_any!(InnerSeed<'a>);

impl<'de> Visitor<'de> for InnerSeed<'_> {
    type Value = Option<(Scalar, Option<Stored>)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event's `event`")
    }
    read_through!(None, seq);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut dp, mut stored) = (Scalar::Absent, None);
        fields(&mut map, &["dp_rank", "data"], |field, map| {
            match field {
                0 => dp = map.next_value()?,
                _ => stored = map.next_value_seed(DataSeed(self.0))?,
            }
            Ok(())
        })?;
        Ok(Some((dp, stored)))
    }
}

/// An event's `data`: `{"stored": ...}` holds blocks; anything else does not.
pub(super) struct DataSeed<'a>(pub(super) &'a Budget);
seed_of_any!(DataSeed<'a>);

impl<'de> Visitor<'de> for DataSeed<'_> {
    type Value = Option<Stored>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event's `data`")
    }
    read_through!(None, seq);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut stored = None;
        fields(&mut map, &["stored"], |_, map| {
            stored = Some(map.next_value_seed(StoredSeed(self.0))?);
            Ok(())
        })?;
        Ok(stored)
    }
}

/// A `stored` event: `{"parent_hash", "blocks": [...], "kvix_parent_seq"}`.
pub(super) struct StoredSeed<'a>(pub(super) &'a Budget);
seed_of_any!(StoredSeed<'a>);

impl<'de> Visitor<'de> for StoredSeed<'_> {
    type Value = Stored;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a stored event")
    }
    read_through!(
        Stored {
            shapeless: true,
            ..Stored::default()
        },
        seq
    );
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Stored, A::Error> {
        let mut st = Stored::default();
        let names = &["parent_hash", "kvix_parent_seq", "blocks", "kvix_groups"];
        fields(&mut map, names, |field, map| {
            match field {
                0 => st.parent_hash = map.next_value()?,
                1 => st.kvix_parent_seq = map.next_value()?,
                2 => st.blocks = map.next_value_seed(BlocksSeed(self.0))?,
                _ => st.kvix_groups = map.next_value()?,
            }
            Ok(())
        })?;
        Ok(st)
    }
}

/// A stored event's `blocks`: kept up to the first malformed one, each counted
/// against the dump's block budget.
pub(super) struct BlocksSeed<'a>(pub(super) &'a Budget);
seed_of_any!(BlocksSeed<'a>);

impl<'de> Visitor<'de> for BlocksSeed<'_> {
    type Value = Option<Blocks>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of blocks")
    }
    read_through!(None, map);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut blocks = Blocks::default();
        while let Some(b) = seq.next_element_seed(BlockSeed)? {
            match b {
                _ if blocks.bad => {}
                Some(h) => {
                    self.0.take()?;
                    blocks.hashes.push(h);
                }
                None => blocks.bad = true,
            }
        }
        Ok(Some(blocks))
    }
}

/// One block: `{"block_hash", "tokens_hash"}`; `None` if either is missing or no hash.
pub(super) struct BlockSeed;
seed_of_any!(BlockSeed);

impl<'de> Visitor<'de> for BlockSeed {
    type Value = Option<(u64, u64)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a block")
    }
    read_through!(None, seq);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut bh, mut th) = (Scalar::Absent, Scalar::Absent);
        fields(&mut map, &["block_hash", "tokens_hash"], |field, map| {
            match field {
                0 => bh = map.next_value()?,
                _ => th = map.next_value()?,
            }
            Ok(())
        })?;
        Ok(bh.hash().zip(th.hash()))
    }
}
