//! The control routes: `/register` and `/unregister`, in Dynamo's shape and
//! Mooncake's conductor shape, their names checked at the door and their endpoints
//! against the allow list, carried out on the control plane off the executor.

use super::Reply;
use super::context::{Ctx, DEFAULT_TENANT};
use super::error::{ApiError, parse};
use super::json;
use super::scope::{InstanceRef, Shape, tenant};
use crate::app::{ControlError, registration};
use crate::ingest::ListenError;
use crate::mesh::ShardMesh;
use crate::registry::{Endpoint, ListenerOpts, MAX_NAME_BYTES};
use hyper::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Registry(r) => r.into(),
            ControlError::Listen(e @ ListenError::Budget { .. }) => ApiError::NoRoom(e.to_string()),
            ControlError::Endpoint(m) => ApiError::BadRequest(m),
            ControlError::Listen(e) => ApiError::BadRequest(e.to_string()),
        }
    }
}

/// Which API a control body speaks: Mooncake's names its model `modelname`.
fn control_shape(body: &[u8], forced: Option<Shape>) -> Shape {
    if let Some(s) = forced {
        return s;
    }
    #[derive(Deserialize)]
    struct Probe {
        modelname: Option<serde::de::IgnoredAny>,
        model_name: Option<serde::de::IgnoredAny>,
    }
    match serde_json::from_slice::<Probe>(body) {
        Ok(Probe {
            modelname: Some(_),
            model_name: None,
        }) => Shape::Conductor,
        _ => Shape::Dynamo,
    }
}

#[derive(Deserialize)]
struct RegisterReq {
    instance_id: InstanceRef,
    endpoint: String,
    model_name: String,
    block_size: u32,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    dp_rank: Option<u32>,
    replay_endpoint: Option<String>,
    #[serde(flatten)]
    hybrid: HybridReq,
}

/// A hybrid model's settings that vLLM's events do not carry (see
/// [`ListenerOpts`]); the command line's per-model ones apply where a
/// registration gives none.
#[derive(Deserialize, Default, Clone, Copy)]
struct HybridReq {
    attention_chunk_size: Option<u32>,
    hybrid_align_tokens: Option<u32>,
}

impl HybridReq {
    /// `opts` with these settings, or the model's from the command line.
    fn apply(
        self,
        model: &str,
        registry: &crate::registry::Registry,
        opts: ListenerOpts,
    ) -> ListenerOpts {
        let d = registry.hybrid_defaults(model);
        ListenerOpts {
            attention_chunk_size: self.attention_chunk_size.or(d.attention_chunk_size),
            hybrid_align_tokens: self.hybrid_align_tokens.or(d.hybrid_align_tokens),
            ..opts
        }
    }
}

/// Mooncake conductor `/register` (RFC #1403).
#[derive(Deserialize)]
struct ConductorRegisterReq {
    endpoint: String,
    replay_endpoint: Option<String>,
    #[serde(rename = "type")]
    publisher: String,
    modelname: String,
    lora_name: Option<String>,
    tenant_id: Option<String>,
    instance_id: InstanceRef,
    block_size: u32,
    dp_rank: u32,
    additionalsalt: Option<String>,
    #[serde(flatten)]
    hybrid: HybridReq,
}

/// Refuse endpoints outside `--allow-endpoints` (403 naming the field). The check may
/// resolve a host name, so it runs off the executor.
async fn check_allowed<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    endpoint: &str,
    replay: Option<&str>,
) -> Result<(), ApiError> {
    let access = &cx.opts.access;
    if access.allow.is_none() {
        return Ok(());
    }
    let (access, endpoint, replay) = (
        access.clone(),
        endpoint.to_string(),
        replay.map(String::from),
    );
    cx.mesh
        .offload(move || {
            let allow = access.allow.as_ref()?;
            let refused = |field: &str, msg| ApiError::Forbidden {
                field: field.into(),
                msg,
            };
            if let Err(m) = allow.check(&endpoint) {
                return Some(refused("endpoint", m));
            }
            let r = replay.as_deref()?;
            allow.check(r).err().map(|m| refused("replay_endpoint", m))
        })
        .await
        .map_or(Ok(()), Err)
}

/// A control body in either API's shape.
enum Shaped<D, C> {
    Dynamo(D),
    Conductor(C),
}

/// `body` read in the shape [`control_shape`] tells.
fn parse_shaped<D: DeserializeOwned, C: DeserializeOwned>(
    body: &[u8],
    forced: Option<Shape>,
) -> Result<Shaped<D, C>, ApiError> {
    Ok(match control_shape(body, forced) {
        Shape::Conductor => Shaped::Conductor(parse(body)?),
        Shape::Dynamo => Shaped::Dynamo(parse(body)?),
    })
}

/// A name a registration gives kvix to keep (model, tenant, instance): refused with
/// a 422 naming `field` when it is empty, over [`MAX_NAME_BYTES`] or holds a control
/// character. `None`: not given.
fn check_name(field: &str, value: Option<&str>) -> Result<(), ApiError> {
    match value {
        Some(v) if !crate::registry::name_ok(v) => Err(ApiError::Field {
            field: field.into(),
            msg: format!(
                "must be 1 to {MAX_NAME_BYTES} bytes with no control characters ({} given)",
                v.len()
            ),
        }),
        _ => Ok(()),
    }
}

pub async fn register<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    body: bytes::Bytes,
    forced: Option<Shape>,
) -> Result<Reply, ApiError> {
    let r = match parse_shaped::<RegisterReq, ConductorRegisterReq>(&body, forced)? {
        Shaped::Dynamo(r) => r,
        Shaped::Conductor(r) => {
            check_name("modelname", Some(&r.modelname))?;
            check_name("tenant_id", r.tenant_id.as_deref())?;
            check_name(
                "lora_name",
                r.lora_name.as_deref().filter(|s| !s.is_empty()),
            )?;
            check_name("instance_id", r.instance_id.name())?;
            check_allowed(cx, &r.endpoint, r.replay_endpoint.as_deref()).await?;
            let key = r.instance_id.key();
            let opts = ListenerOpts {
                salt: r.additionalsalt.filter(|s| !s.is_empty()),
                lora_name: r.lora_name.filter(|s| !s.is_empty()),
                publisher: Some(r.publisher),
                ..ListenerOpts::default()
            };
            let reply_name = key.to_string();
            cx.control(move |c| {
                let id = c.registry().intern(&key);
                let opts = r.hybrid.apply(&r.modelname, c.registry(), opts);
                c.register(registration(
                    r.modelname,
                    r.tenant_id.unwrap_or_else(|| DEFAULT_TENANT.into()),
                    r.block_size,
                    id,
                    r.dp_rank,
                    Endpoint::new(r.endpoint, r.replay_endpoint),
                    opts,
                ))
            })
            .await?;
            let out =
                serde_json::json!({"status": "registered successfully", "instance_id": reply_name});
            return Ok(json::bytes(StatusCode::OK, out.to_string().into_bytes()));
        }
    };
    check_name("model_name", Some(&r.model_name))?;
    check_name("tenant_id", r.tenant_id.as_deref())?;
    check_name("routing_group", r.routing_group.as_deref())?;
    check_name("instance_id", r.instance_id.name())?;
    check_allowed(cx, &r.endpoint, r.replay_endpoint.as_deref()).await?;
    let tenant = tenant(r.tenant_id, r.routing_group).unwrap_or_else(|| DEFAULT_TENANT.into());
    let key = r.instance_id.key();
    cx.control(move |c| {
        let opts = r
            .hybrid
            .apply(&r.model_name, c.registry(), ListenerOpts::default());
        c.register(registration(
            r.model_name,
            tenant,
            r.block_size,
            c.registry().intern(&key),
            r.dp_rank.unwrap_or(0),
            Endpoint::new(r.endpoint, r.replay_endpoint),
            opts,
        ))
    })
    .await?;
    Ok(json::ok(StatusCode::CREATED))
}

#[derive(Deserialize)]
struct UnregisterReq {
    instance_id: InstanceRef,
    model_name: String,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    dp_rank: Option<u32>,
}

/// Mooncake conductor `/unregister`: one subscription (instance, tenant, dp rank).
#[derive(Deserialize)]
struct ConductorUnregisterReq {
    modelname: String,
    instance_id: InstanceRef,
    tenant_id: Option<String>,
    dp_rank: Option<u32>,
}

pub async fn unregister<M: ShardMesh>(
    cx: &Ctx<'_, M>,
    body: bytes::Bytes,
    forced: Option<Shape>,
) -> Result<Reply, ApiError> {
    let r = match parse_shaped::<UnregisterReq, ConductorUnregisterReq>(&body, forced)? {
        Shaped::Dynamo(r) => r,
        Shaped::Conductor(r) => {
            let name = r.instance_id.key().to_string();
            let tenant = r.tenant_id.unwrap_or_else(|| DEFAULT_TENANT.into());
            let id = cx.instance(&r.instance_id.key())?;
            let t = tenant.clone();
            let dps = cx
                .control(move |c| c.unregister(&r.modelname, Some(&t), id, r.dp_rank))
                .await?;
            let removed: Vec<String> = dps
                .into_iter()
                .map(|dp| format!("{name}|{tenant}|{dp}"))
                .collect();
            let out = serde_json::json!({"status": "unregistered successfully", "removed_instances": removed});
            return Ok(json::bytes(StatusCode::OK, out.to_string().into_bytes()));
        }
    };
    let tenant = tenant(r.tenant_id, r.routing_group);
    let id = cx.instance(&r.instance_id.key())?;
    cx.control(move |c| c.unregister(&r.model_name, tenant.as_deref(), id, r.dp_rank))
        .await?;
    Ok(json::ok(StatusCode::OK))
}

/// A `/register` body checked as its handler checks it, and nothing done (for
/// [`super::routes::check_body`]).
pub(super) fn check_register(body: &[u8], forced: Option<Shape>) -> Result<(), ApiError> {
    parse_shaped::<RegisterReq, ConductorRegisterReq>(body, forced).map(drop)
}

/// A `/unregister` body checked as its handler checks it, and nothing done.
pub(super) fn check_unregister(body: &[u8], forced: Option<Shape>) -> Result<(), ApiError> {
    parse_shaped::<UnregisterReq, ConductorUnregisterReq>(body, forced).map(drop)
}
