//! A peer's `/workers`, read for adoption: which listeners to start here.
//!
//! Owns parsing kvix's and Dynamo's `/workers` JSON into registrations. Accepts
//! kvix's `listeners` (publisher kind and replay endpoint per listener) and falls
//! back to the `endpoints` map (dp rank → endpoint) both indexers print. Never
//! registers anything itself.

use crate::registry::{Endpoint, InstanceKey};
use crate::types::DpRank;
use serde::Deserialize;
use std::collections::BTreeMap;

/// One listener to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adopted {
    pub model: String,
    pub tenant: String,
    pub block_size: u32,
    pub instance: InstanceKey,
    pub dp: DpRank,
    pub endpoint: Endpoint,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawInstance {
    Int(u64),
    Name(String),
}

#[derive(Deserialize)]
struct RawListener {
    endpoint: String,
    #[serde(rename = "type")]
    publisher: Option<String>,
    replay_endpoint: Option<String>,
}

#[derive(Deserialize)]
struct RawWorker {
    instance_id: RawInstance,
    model_name: String,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    block_size: u32,
    #[serde(default)]
    endpoints: BTreeMap<String, String>,
    #[serde(default)]
    listeners: BTreeMap<String, Vec<RawListener>>,
}

/// Parse a `/workers` body. Every entry must name its model and block size; dp rank
/// keys must be integers.
pub fn parse(body: &[u8]) -> Result<Vec<Adopted>, String> {
    let raw: Vec<RawWorker> =
        serde_json::from_slice(body).map_err(|e| format!("malformed /workers: {e}"))?;
    let mut out = Vec::new();
    for w in raw {
        // Earlier kvix printed integer ids from 2^63 up as strings of digits: those
        // parse back as the integers they are.
        let instance = match w.instance_id {
            RawInstance::Int(i) => InstanceKey::Id(i),
            RawInstance::Name(n) => InstanceKey::parse(&n),
        };
        let tenant = w
            .tenant_id
            .or(w.routing_group)
            .unwrap_or_else(|| "default".into());
        let dp = |k: &str| {
            k.parse::<DpRank>()
                .map_err(|_| format!("malformed /workers: dp rank `{k}` is not an integer"))
        };
        let mut push = |dp: DpRank, endpoint: Endpoint| {
            out.push(Adopted {
                model: w.model_name.clone(),
                tenant: tenant.clone(),
                block_size: w.block_size,
                instance: instance.clone(),
                dp,
                endpoint,
            })
        };
        if w.listeners.is_empty() {
            for (k, ep) in &w.endpoints {
                push(dp(k)?, Endpoint::new(ep.clone(), None));
            }
        } else {
            for (k, ls) in &w.listeners {
                let d = dp(k)?;
                for l in ls {
                    push(
                        d,
                        Endpoint {
                            endpoint: l.endpoint.clone(),
                            replay_endpoint: l.replay_endpoint.clone(),
                            publisher: l.publisher.clone(),
                        },
                    );
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kvix_listeners_and_plain_endpoints() {
        let body = br#"[
          {"instance_id": 7, "model_name": "m", "tenant_id": "t", "block_size": 16,
           "endpoints": {"0": "tcp://a:1"},
           "listeners": {"0": [{"endpoint": "tcp://a:1", "type": "vLLM", "replay_endpoint": "tcp://a:2"},
                               {"endpoint": "tcp://a:3", "type": "Mooncake", "replay_endpoint": null}]}},
          {"instance_id": "vllm-1", "model_name": "m", "block_size": 4, "endpoints": {"1": "tcp://b:1"}}
        ]"#;
        let got = parse(body).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].instance, InstanceKey::Id(7));
        assert_eq!(
            got[0].endpoint.replay_endpoint.as_deref(),
            Some("tcp://a:2")
        );
        assert_eq!(got[1].endpoint.publisher.as_deref(), Some("Mooncake"));
        assert_eq!(got[2].instance, InstanceKey::Name("vllm-1".into()));
        assert_eq!((got[2].tenant.as_str(), got[2].dp), ("default", 1));
    }

    #[test]
    fn rejects_what_it_cannot_register() {
        assert!(parse(b"{}").is_err());
        assert!(parse(br#"[{"instance_id": 1, "model_name": "m"}]"#).is_err());
        assert!(
            parse(br#"[{"instance_id": 1, "model_name": "m", "block_size": 4, "endpoints": {"x": "tcp://a:1"}}]"#)
                .is_err()
        );
    }
}
