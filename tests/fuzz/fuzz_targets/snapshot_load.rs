//! `kvix::recovery::snapshot::decode` on fuzzer bytes. Random bytes stop at the
//! checksum, so most inputs are framed here with a valid header (magic, version, body
//! length, XXH3-64 of the body) and the structure decoder is what gets fuzzed; an
//! input whose first byte has its low nibble clear goes in raw, to cover the header
//! checks as well. Framed inputs are version 2 (an instance is a tag, then an id or a
//! name) unless bit 4 of the mode byte asks for version 1 (a bare integer id), which
//! is still read. A decoded State must re-encode (always as the current version) to
//! an image that decodes to it.
//!
//! Input: one mode byte, then the body (framed) or the whole image (raw).
#![no_main]

use kvix::recovery::State;
use kvix::recovery::snapshot;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use xxhash_rust::xxh3::xxh3_64;

const HEADER: usize = 8 + 4 + 8 + 8;

/// Magic and version as `encode` writes them, so a format bump cannot quietly turn
/// this target into a fuzzer of the version check.
fn magic_and_version() -> &'static [u8] {
    static PREFIX: OnceLock<Vec<u8>> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let empty = snapshot::encode(&State::default());
        assert_eq!(&empty[..8], b"KVIXSNAP");
        let prefix = empty[..12].to_vec();
        // The framing below must be what decode accepts, or nothing gets deep.
        assert_eq!(
            snapshot::decode(&frame(&prefix, &[0; 4])),
            Ok(State::default())
        );
        prefix
    })
}

fn frame(prefix: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let framed;
    let image = if mode & 0x0f == 0 {
        rest
    } else if mode & 0x10 != 0 {
        let mut v1 = magic_and_version()[..8].to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        framed = frame(&v1, rest);
        &framed[..]
    } else {
        framed = frame(magic_and_version(), rest);
        &framed[..]
    };
    if let Ok(state) = snapshot::decode(image) {
        // Bytes decode ignores (flag bits above the tier, option markers other than 1)
        // do not survive, so the round trip holds for the State, not the image.
        let again = snapshot::encode(&state);
        assert_eq!(snapshot::decode(&again).as_ref(), Ok(&state));
    }
});
