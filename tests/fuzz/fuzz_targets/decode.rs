//! `kvix::wire::decode` on arbitrary frames: Ok or Err, never a panic, and an
//! Ok batch's ranges all index in bounds.
#![no_main]

use kvix::wire::{self, Batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut batch = Batch::default();
    match wire::decode(data, &mut batch) {
        Ok(()) => {
            for ev in batch.events(data) {
                let _ = (ev.hashes.len(), ev.tokens.len(), ev.replicas.iter().count());
            }
        }
        Err(_) => assert!(batch.events.is_empty()),
    }
});
