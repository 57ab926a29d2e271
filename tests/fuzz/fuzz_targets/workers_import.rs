//! `kvix::recovery::workers::parse` (the importer of a peer's `/workers`, used to
//! adopt its listeners) on arbitrary bytes: Ok or Err, never a panic. What it accepts
//! must read back the same when written as kvix's own `/workers` prints it (one entry
//! per listener, its instance as `InstanceKey::to_json`). Adopts nothing.
#![no_main]

use kvix::recovery::workers;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Ok(adopted) = workers::parse(data) else {
        return;
    };
    let printed: Vec<serde_json::Value> = adopted
        .iter()
        .map(|a| {
            let listener = json!({
                "endpoint": a.endpoint.endpoint,
                "type": a.endpoint.publisher,
                "replay_endpoint": a.endpoint.replay_endpoint,
            });
            json!({
                "instance_id": a.instance.to_json(),
                "model_name": a.model,
                "tenant_id": a.tenant,
                "block_size": a.block_size,
                "endpoints": {a.dp.to_string(): a.endpoint.endpoint},
                "listeners": {a.dp.to_string(): [listener]},
            })
        })
        .collect();
    let again = workers::parse(&serde_json::to_vec(&printed).unwrap());
    assert_eq!(again.as_ref(), Ok(&adopted));
});
