//! Engine payloads: msgspec fixtures and hand-built vLLM event batches.

use super::*;

/// Engine payloads generated with msgspec by `scripts/gen_vllm_fixtures.py`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/wire_fixtures.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let hex = all[name]
        .as_str()
        .unwrap_or_else(|| panic!("no fixture {name}"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// The start of a vLLM positional `KVEventBatch` (timestamp, then an array of one
/// event): the event's encoding goes next.
fn batch_of_one() -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_array_len(&mut b, 2).unwrap();
    rmp::encode::write_f64(&mut b, 1.5).unwrap();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    b
}

/// Fixture `name` with the first `from` in it replaced by `to` (as long): a
/// frame that is well-formed msgpack but not a valid event.
pub fn fixture_with(name: &str, from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut b = fixture(name);
    let at = b
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{name} has no {from:?}"));
    b[at..at + to.len()].copy_from_slice(to);
    b
}

/// vLLM positional `KVEventBatch` with one `BlockStored` (device tier).
pub fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], block_size: u32) -> Vec<u8> {
    stored_on(hashes, parent, tokens, block_size, None)
}

/// [`stored`] on `medium` (`None`: the device).
pub fn stored_on(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
    medium: Option<&str>,
) -> Vec<u8> {
    let mut b = batch_of_one();
    event_of_hashes(&mut b, "BlockStored", 7, hashes);
    match parent {
        Some(h) => {
            rmp::encode::write_uint(&mut b, h).unwrap();
        }
        None => rmp::encode::write_nil(&mut b).unwrap(),
    }
    let tokens: Vec<u64> = tokens.iter().map(|&t| t as u64).collect();
    write_uints(&mut b, &tokens);
    rmp::encode::write_uint(&mut b, block_size as u64).unwrap();
    rmp::encode::write_nil(&mut b).unwrap();
    match medium {
        Some(m) => rmp::encode::write_str(&mut b, m).unwrap(),
        None => rmp::encode::write_nil(&mut b).unwrap(),
    }
    b
}

/// vLLM positional `KVEventBatch` with one `AllBlocksCleared`.
pub fn all_cleared() -> Vec<u8> {
    let mut b = batch_of_one();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    rmp::encode::write_str(&mut b, "AllBlocksCleared").unwrap();
    b
}

/// A `KVEventBatch` with one `AllBlocksCleared` of `medium` only, as current vLLM
/// encodes events (a tagged map).
pub fn cleared_on(medium: &str) -> Vec<u8> {
    let mut b = batch_of_one();
    rmp::encode::write_map_len(&mut b, 2).unwrap();
    rmp::encode::write_str(&mut b, "type").unwrap();
    rmp::encode::write_str(&mut b, "AllBlocksCleared").unwrap();
    rmp::encode::write_str(&mut b, "medium").unwrap();
    rmp::encode::write_str(&mut b, medium).unwrap();
    b
}

/// vLLM positional `KVEventBatch` with one `BlockRemoved`.
pub fn removed(hashes: &[u64]) -> Vec<u8> {
    let mut b = batch_of_one();
    event_of_hashes(&mut b, "BlockRemoved", 3, hashes);
    rmp::encode::write_nil(&mut b).unwrap();
    b
}

/// The head of a positional event of `fields` fields: its tag, then `hashes`.
fn event_of_hashes(b: &mut Vec<u8>, tag: &str, fields: u32, hashes: &[u64]) {
    rmp::encode::write_array_len(b, fields).unwrap();
    rmp::encode::write_str(b, tag).unwrap();
    write_uints(b, hashes);
}

/// A msgpack array of unsigned integers.
pub fn write_uints(b: &mut Vec<u8>, values: &[u64]) {
    rmp::encode::write_array_len(b, values.len() as u32).unwrap();
    for v in values {
        rmp::encode::write_uint(b, *v).unwrap();
    }
}
