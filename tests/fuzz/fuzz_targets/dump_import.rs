//! `kvix::recovery::dump::parse` (the importer of a peer's `/dump`) on arbitrary
//! bytes: Ok or Err, never a panic, and an accepted dump keeps the invariants the
//! seeding path relies on, its workers' dp ranks being the ones its events name.
//! Run with `dicts/dump_import.dict` to get past the JSON.
#![no_main]

use kvix::recovery::dump;
use kvix::registry::InstanceKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(state) = dump::parse(data) else {
        return;
    };
    // Every dp rank kept is one an event named (or 0, the default), never a rank
    // made up by narrowing a wider one.
    let doc: serde_json::Value = serde_json::from_slice(data).expect("parse accepted it");
    let named: Vec<u64> = doc
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(|ix| ix["events"].as_array())
        .flatten()
        .filter_map(|e| e["event"]["dp_rank"].as_u64())
        .collect();
    for ix in &state.indexes {
        for w in &ix.workers {
            assert!(w.dp == 0 || named.contains(&u64::from(w.dp)), "dp {}", w.dp);
        }
    }
    for ix in &state.indexes {
        assert!(ix.block_size > 0);
        // The key splits at its last ':', so a tenant never holds one.
        assert!(!ix.tenant.contains(':'), "{:?}", ix.tenant);
        // A dump carries blocks, not registrations.
        assert!(ix.listeners.is_empty());
        // One entry per (instance, dp rank), in order.
        assert!(
            ix.workers
                .windows(2)
                .all(|w| (&w[0].instance, w[0].dp) < (&w[1].instance, w[1].dp))
        );
        // A name is never a canonical integer (that is an id): keys read back as
        // themselves wherever they are printed and parsed again.
        for w in &ix.workers {
            assert_eq!(InstanceKey::parse(&w.instance.to_string()), w.instance);
        }
    }
});
