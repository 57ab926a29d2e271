//! What the query-shaped routes share: the scope a body names (model, tenant,
//! instance, dialect) resolved against the registry into the index to ask, and the
//! JSON forms of token ids and block hashes they accept.
//!
//! Owns no route: `query`, `speculate` and `tiered` build their requests on it.

use super::context::{Ctx, DEFAULT_TENANT};
use super::error::ApiError;
use super::token_ids;
use crate::mesh::ShardMesh;
use crate::registry::{IndexInfo, InstanceKey};
use crate::score;
use crate::types::{InstanceId, Tier};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;

/// `tenant_id` (kvix's name) or `routing_group` (Dynamo 1.6.1's) selects the index.
pub(super) fn tenant(tenant_id: Option<String>, routing_group: Option<String>) -> Option<String> {
    tenant_id.or(routing_group)
}

/// Which API's shape a query body speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Dynamo's standalone indexer: `model_name`, scores nested instance → dp rank.
    Dynamo,
    /// Mooncake conductor: `model`, tenant → instance → `longest_matched`, tiers, `DP`.
    Conductor,
}

/// An instance as a router names it, in any route of either API: Dynamo's integer
/// (the whole u64 range) or Mooncake's string; a string of digits is that integer.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
pub enum InstanceRef {
    Int(u64),
    Name(String),
}

impl InstanceRef {
    /// The instance's name, when the client named it by a string.
    pub(super) fn name(&self) -> Option<&str> {
        match self {
            InstanceRef::Int(_) => None,
            InstanceRef::Name(n) => Some(n),
        }
    }

    pub(super) fn key(&self) -> InstanceKey {
        match self {
            InstanceRef::Int(i) => InstanceKey::Id(*i),
            InstanceRef::Name(n) => InstanceKey::parse(n),
        }
    }
}

/// Fields every query route shares, in both shapes.
#[derive(Deserialize)]
pub(super) struct Scope {
    model_name: Option<String>,
    model: Option<String>,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    lora_name: Option<String>,
    lora_id: Option<i64>,
    pub(super) instance_id: Option<InstanceRef>,
    pub(super) block_size: Option<u32>,
    /// `"llm-d"` adds tier-weighted, normalized scores to a Dynamo-shaped answer.
    scoring: Option<String>,
    /// llm-d tier weights by medium name (defaults: GPU 1.0, CPU 0.8).
    tier_weights: Option<HashMap<String, f32>>,
    /// List only the workers holding some of the prefix in `tree_sizes` and
    /// `instances` (a fleet's answer otherwise lists every worker of the model).
    matched_only: Option<bool>,
}

/// A resolved query: which index, in which shape, for whom.
pub(super) struct Target {
    pub(super) ix: Arc<IndexInfo>,
    pub(super) shape: Shape,
    pub(super) tenant: String,
    pub(super) only: Option<InstanceId>,
    pub(super) weights: Option<[f32; Tier::COUNT]>,
    pub(super) lora: Option<String>,
    pub(super) matched_only: bool,
}

/// What a query's scope names without asking the registry.
pub(super) struct Named {
    pub(super) shape: Shape,
    pub(super) model: String,
    pub(super) tenant: String,
    pub(super) lora: Option<String>,
}

/// The checks of a query's scope that need no registry (they run first): which
/// shape, model, LoRA adapter and tenant. Takes those fields out of `sc`.
pub(super) fn named(sc: &mut Scope, forced: Option<Shape>) -> Result<Named, ApiError> {
    let (shape, model) = match (forced, sc.model_name.take(), sc.model.take()) {
        (Some(Shape::Conductor), m1, m2) => (Shape::Conductor, m2.or(m1)),
        (_, Some(m), _) => (Shape::Dynamo, Some(m)),
        (_, None, Some(m)) => (Shape::Conductor, Some(m)),
        (_, None, None) => (Shape::Dynamo, None),
    };
    let model = model.ok_or_else(|| ApiError::Field {
        field: if shape == Shape::Conductor {
            "model"
        } else {
            "model_name"
        }
        .into(),
        msg: "missing field (`model_name` for Dynamo's API, `model` for Mooncake's)".into(),
    })?;
    if sc.lora_name.as_deref().is_some_and(|n| !n.is_empty()) && sc.lora_id.is_some() {
        return Err(ApiError::BadRequest(
            "lora_name and lora_id must not be used together".into(),
        ));
    }
    let lora = sc
        .lora_name
        .take()
        .filter(|n| !n.is_empty())
        .or_else(|| crate::ingest::feed::lora_from_id(sc.lora_id));
    let tenant = tenant(sc.tenant_id.take(), sc.routing_group.take())
        .unwrap_or_else(|| DEFAULT_TENANT.into());
    Ok(Named {
        shape,
        model,
        tenant,
        lora,
    })
}

pub(super) fn resolve<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    mut sc: Scope,
    forced: Option<Shape>,
) -> Result<Target, ApiError> {
    let n = named(&mut sc, forced)?;
    resolve_named(cx, n, sc)
}

/// [`resolve`] once [`named`] has run.
pub(super) fn resolve_named<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    n: Named,
    sc: Scope,
) -> Result<Target, ApiError> {
    let Named {
        shape,
        model,
        tenant,
        lora,
    } = n;
    let ix = cx.index(&model, Some(&tenant))?;
    if let Some(bs) = sc.block_size
        && bs != ix.block_size
    {
        return Err(ApiError::BadRequest(format!(
            "block_size {bs} does not match block_size {} of the indexer for {model}:{tenant}",
            ix.block_size
        )));
    }
    let only = match &sc.instance_id {
        None => None,
        Some(r) => Some(cx.instance(&r.key())?),
    };
    let weights = match (sc.scoring.as_deref(), sc.tier_weights) {
        (None, None) => None,
        (Some(s), _) if !s.eq_ignore_ascii_case("llm-d") && !s.eq_ignore_ascii_case("llmd") => {
            return Err(ApiError::Field {
                field: "scoring".into(),
                msg: format!("unknown scoring `{s}`; expected \"llm-d\""),
            });
        }
        (_, None) => Some(score::LLMD_WEIGHTS),
        (_, Some(w)) => {
            // As llm-d's configured media: the listed weights replace the defaults
            // and every medium not listed weighs 1.0.
            let mut out = [score::LLMD_UNLISTED; crate::types::Tier::COUNT];
            for (medium, weight) in w {
                if !(0.0..=1.0).contains(&weight) {
                    return Err(ApiError::Field {
                        field: format!("tier_weights.{medium}"),
                        msg: "weights must lie in [0, 1]".into(),
                    });
                }
                let t = cx
                    .snap()
                    .tier_of(Some(&medium))
                    .ok_or_else(|| ApiError::Field {
                        field: format!("tier_weights.{medium}"),
                        msg: "unknown medium".into(),
                    })?;
                out[t.0 as usize] = weight;
            }
            Some(out)
        }
    };
    Ok(Target {
        ix,
        shape,
        tenant,
        only,
        weights,
        lora,
        matched_only: sc.matched_only.unwrap_or(false),
    })
}

/// Token ids when serde_json parses the body (see [`token_ids`] for the usual path):
/// plain arrays still skip the per-element path; anything else goes through
/// serde_json, which reports the exact error.
pub(super) struct TokenIds(pub(super) Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: Box<serde_json::value::RawValue> = Deserialize::deserialize(d)?;
        if let Some(v) = token_ids::plain_u32_array(raw.get().as_bytes()) {
            return Ok(TokenIds(v));
        }
        let de = &mut serde_json::Deserializer::from_str(raw.get());
        serde_path_to_error::deserialize::<_, Vec<u32>>(de)
            .map(TokenIds)
            .map_err(|e| {
                let at = e.path().to_string();
                serde::de::Error::custom(format!("element {at}: {}", e.into_inner()))
            })
    }
}

/// A block hash as JSON: any integer (negative values are two's-complement u64
/// bits), or a decimal / `0x` hex string as Mooncake object keys write them.
pub(super) struct HashNum(pub(super) u64);

impl<'de> Deserialize<'de> for HashNum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = HashNum;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a 64-bit integer block hash")
            }
            fn visit_u64<E>(self, v: u64) -> Result<HashNum, E> {
                Ok(HashNum(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<HashNum, E> {
                Ok(HashNum(v as u64))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HashNum, E> {
                let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => v.parse(),
                };
                parsed
                    .map(HashNum)
                    .map_err(|_| E::custom(format!("`{v}` is not a 64-bit hash")))
            }
        }
        d.deserialize_any(V)
    }
}
