//! Names as they arrive from the network: which are acceptable, and how an
//! instance's name (an integer or a string) is read.
//!
//! Owns the bounds on names and [`InstanceKey`]. Must never give an id: the
//! registry interns names when it registers them.

use crate::types::InstanceId;

/// First id given to an instance registered by a non-integer name: above every u64.
pub const NAMED_BASE: InstanceId = 1 << 64;

/// Longest model, tenant or worker name kvix takes from the network: names are
/// kept, listed (`/workers`, `/dump`, `/metrics`) and logged, so their size is
/// bounded where they arrive.
pub const MAX_NAME_BYTES: usize = 256;

/// A name given over HTTP (`/register`): 1 to [`MAX_NAME_BYTES`] bytes with no
/// control character.
pub fn name_ok(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len()) && !name.chars().any(char::is_control)
}

/// A pod identity or model name in a bound socket's topic: 1 to [`MAX_NAME_BYTES`]
/// bytes of visible ASCII (no spaces or control characters), which covers host:port
/// pairs, pod names and Hugging Face model ids.
pub fn topic_name_ok(name: &[u8]) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len()) && name.iter().all(|c| c.is_ascii_graphic())
}

/// An instance as routers name it: an integer (Dynamo; any u64) or a string
/// (Mooncake). A string that is the canonical decimal form of a u64 is that integer,
/// so what `/workers` prints is accepted back in either form.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InstanceKey {
    Id(u64),
    Name(String),
}

impl InstanceKey {
    pub fn parse(s: &str) -> InstanceKey {
        match s.parse::<u64>() {
            // "007" or "+7" stay names: they would not print back as themselves.
            Ok(i) if i.to_string() == s => InstanceKey::Id(i),
            _ => InstanceKey::Name(s.to_string()),
        }
    }

    /// As JSON: a number for an integer id, a string for a name.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            InstanceKey::Id(i) => (*i).into(),
            InstanceKey::Name(n) => n.clone().into(),
        }
    }
}

impl std::fmt::Display for InstanceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstanceKey::Id(i) => write!(f, "{i}"),
            InstanceKey::Name(n) => f.write_str(n),
        }
    }
}
