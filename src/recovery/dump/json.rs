//! The pieces of JSON a dump is read with: a map key matched against known
//! names without keeping it, a value skipped, a scalar (a string one no longer
//! than the guard lets through), a worker's name and rank; and the visitor cases
//! the seeds share (`read_through!`, `seed_of_any!`).
//!
//! Owns how loosely a field may be written. Must never read a nested value into
//! memory: what no field reads is skipped as it passes.

use crate::registry::InstanceKey;
use crate::types::DpRank;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Which of `names` a map key is (`None`: a key nobody reads), without keeping it.
pub(super) struct KeyOf(pub(super) &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyOf {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyOf {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|n| *n == v))
    }
}

/// Read an object's fields: `read(i, map)` reads the value of `names[i]`; the values
/// of other keys are read through.
pub(super) fn fields<'de, A: MapAccess<'de>>(
    map: &mut A,
    names: &'static [&'static str],
    mut read: impl FnMut(usize, &mut A) -> Result<(), A::Error>,
) -> Result<(), A::Error> {
    while let Some(field) = map.next_key_seed(KeyOf(names))? {
        match field {
            Some(i) => read(i, map)?,
            None => {
                map.next_value::<Skip>()?;
            }
        }
    }
    Ok(())
}

/// Any JSON value, read and dropped (nesting within serde_json's recursion limit).
pub(super) struct Skip;

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(Scalar::Absent).map(|_| Skip)
    }
}

/// A JSON value where a scalar is expected: anything else is read through and kept
/// as [`Scalar::Other`], so a wrong type marks its event malformed rather than
/// failing the document.
#[derive(Debug, Default)]
pub(super) enum Scalar {
    #[default]
    Absent,
    Null,
    U64(u64),
    I64(i64),
    Str(String),
    Other,
}

impl Scalar {
    /// A 64-bit hash: any integer (negative ones are two's-complement bits).
    pub(super) fn hash(&self) -> Option<u64> {
        match *self {
            Scalar::U64(v) => Some(v),
            Scalar::I64(v) => Some(v as u64),
            _ => None,
        }
    }

    pub(super) fn u64(&self) -> Option<u64> {
        match *self {
            Scalar::U64(v) => Some(v),
            _ => None,
        }
    }

    pub(super) fn is_null(&self) -> bool {
        matches!(self, Scalar::Absent | Scalar::Null)
    }
}

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(Scalar::Absent)
    }
}

/// Reads any value as a [`Scalar`] (the visitor is a `Scalar` only to have a type).
impl<'de> Visitor<'de> for Scalar {
    type Value = Scalar;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::I64(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::U64(v))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(Scalar::Absent)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_key::<Skip>()?.is_some() {
            map.next_value::<Skip>()?;
        }
        Ok(Scalar::Other)
    }
}

/// The worker an event or a group description names: Dynamo's integer, or the
/// name kvix prints for a Mooncake instance, and its dp rank. An absent (or
/// null) rank is 0, a worker without data parallelism; anything else must be an
/// integer that fits a rank. A wider one is malformed, never cut down to its low
/// bits (that would be another worker's rank).
pub(super) fn worker_of(worker_id: &Scalar, dp_rank: &Scalar) -> Option<(InstanceKey, DpRank)> {
    let worker = match worker_id {
        Scalar::U64(n) => InstanceKey::Id(*n),
        Scalar::Str(s) => InstanceKey::parse(s),
        _ => return None,
    };
    let dp = match dp_rank {
        s if s.is_null() => 0,
        s => s.u64().and_then(|d| DpRank::try_from(d).ok())?,
    };
    Some((worker, dp))
}

/// An optional `u32`: `Some(None)` when absent or null, `None` when it is no
/// `u32`.
pub(super) fn opt_u32(v: &Scalar) -> Option<Option<u32>> {
    match v {
        s if s.is_null() => Some(None),
        s => s.u64().and_then(|n| u32::try_from(n).ok()).map(Some),
    }
}

/// The cases of a visitor that expects an object (or, with `seq: false`, an array)
/// other than the one it expects: the value is read through and `$other` returned.
macro_rules! read_through {
    ($other:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
    ($other:expr, seq) => {
        read_through!($other);
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<Skip>()?.is_some() {}
            Ok($other)
        }
    };
    ($other:expr, map) => {
        read_through!($other);
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_key::<Skip>()?.is_some() {
                map.next_value::<Skip>()?;
            }
            Ok($other)
        }
    };
}

/// Implements `DeserializeSeed` for a visitor that reads any value.
macro_rules! seed_of_any {
    ($t:ident) => {
        impl<'de> DeserializeSeed<'de> for $t {
            type Value = <$t as Visitor<'de>>::Value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
    ($t:ident<'a>) => {
        impl<'de, 'a> DeserializeSeed<'de> for $t<'a> {
            type Value = <$t<'a> as Visitor<'de>>::Value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}
