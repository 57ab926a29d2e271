//! `kvix::cli::parse_workers` and `parse_peers` on arbitrary text (bytes converted
//! lossily): Ok or Err, never a panic. What they accept must survive being written
//! back in canonical form and parsed again.
#![no_main]

use kvix::cli;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Ok(specs) = cli::parse_workers(&s) {
        for w in &specs {
            assert!(kvix::ingest::endpoint::validate(&w.endpoint).is_ok(), "{w:?}");
            assert_eq!(w.endpoint.trim(), w.endpoint);
        }
        // Endpoints cannot hold ',' (the separator) and the first '=' ends the id, so
        // the canonical form reads back as the same specs.
        let canonical = specs
            .iter()
            .map(|w| format!("{}:{}={}", w.instance, w.dp, w.endpoint))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(cli::parse_workers(&canonical).as_ref(), Ok(&specs));
    }
    let peers = cli::parse_peers(&s);
    for p in &peers {
        assert!(!p.is_empty() && !p.contains(',') && p.trim() == p, "{p:?}");
    }
    assert_eq!(cli::parse_peers(&peers.join(",")), peers);
});
