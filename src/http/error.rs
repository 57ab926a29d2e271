//! API errors and their one mapping to HTTP status codes.

use crate::registry::RegistryError;
use hyper::StatusCode;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ApiError {
    /// Not JSON at all (syntax, EOF).
    #[error("malformed JSON body: {msg}")]
    Syntax { msg: String },
    /// JSON of the wrong shape: a missing field, a wrong type.
    #[error("invalid field `{field}`: {msg}")]
    Field { field: String, msg: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// Something a field names is not known (a worker that is not registered).
    #[error("{msg}")]
    Unknown { field: String, msg: String },
    #[error("{0}")]
    Conflict(String),
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// A body over a configurable limit.
    #[error("request body larger than {limit} bytes (raise {flag})")]
    BodyLimit { limit: usize, flag: &'static str },
    /// A field holds more than a configured cap allows in one request.
    #[error("{msg}")]
    TooLong { field: String, msg: String },
    /// A configured cap is reached; the request may succeed once it is not.
    #[error("{0}")]
    AtCapacity(String),
    /// What the process was given at start (descriptors) is spent: only an operator
    /// can make room.
    #[error("{0}")]
    NoRoom(String),
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("method not allowed")]
    Method,
    #[error("{0}")]
    Internal(String),
    /// The service is not Ready (starting, recovering): retry once `/ready` answers 200.
    #[error("kvix is {0}; data routes answer once /ready answers 200")]
    NotReady(&'static str),
    /// A shard did not answer: the answer would be incomplete, so there is none.
    #[error("{0}; the answer would be incomplete")]
    Unavailable(#[from] crate::mesh::ShardUnavailable),
    #[error("request body not received within {} ms", .0.as_millis())]
    Timeout(std::time::Duration),
    /// No valid bearer token for the route (answered with `WWW-Authenticate: Bearer`).
    #[error("{0}")]
    Unauthorized(#[from] crate::access::Denied),
    /// Authenticated or not, the request asks for something the configuration refuses.
    #[error("{msg}")]
    Forbidden { field: String, msg: String },
    /// The client went away before its answer was ready; nobody reads this one.
    #[error("the client went away before the answer was ready")]
    Abandoned,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Syntax { .. } | ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Field { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) | ApiError::Unknown { .. } | ApiError::NoRoute(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) | ApiError::BodyLimit { .. } | ApiError::TooLong { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::AtCapacity(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Method => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NotReady(_) | ApiError::Unavailable(_) | ApiError::NoRoom(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            // nginx's "client closed request": counted as a 4xx, never seen by anyone.
            ApiError::Abandoned => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        }
    }

    /// `{"error": "...", "field": "..."}`; `field` only when one field is to blame.
    pub fn body(&self) -> Vec<u8> {
        let mut v = serde_json::json!({ "error": self.to_string() });
        match self {
            ApiError::Field { field, .. }
            | ApiError::Forbidden { field, .. }
            | ApiError::Unknown { field, .. }
            | ApiError::TooLong { field, .. } => {
                v["field"] = serde_json::Value::String(field.clone())
            }
            ApiError::NotReady(phase) => v["phase"] = serde_json::Value::from(*phase),
            ApiError::BodyLimit { limit, flag } => {
                v["limit"] = serde_json::Value::from(*limit);
                v["flag"] = serde_json::Value::from(*flag);
            }
            _ => {}
        }
        v.to_string().into_bytes()
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            // The issue asks for 400 on a block-size mismatch (Dynamo 1.6.1 answers 409).
            RegistryError::BlockSizeMismatch { .. } | RegistryError::ZeroBlockSize => {
                ApiError::BadRequest(e.to_string())
            }
            RegistryError::AlreadyRegistered { .. } => ApiError::Conflict(e.to_string()),
            RegistryError::UnknownInstance { .. } => ApiError::NotFound(e.to_string()),
            RegistryError::SlotsExhausted
            | RegistryError::EventLimit { .. }
            | RegistryError::WorkerLimit { .. } => ApiError::AtCapacity(e.to_string()),
        }
    }
}

/// Parse a JSON body, naming the offending field on a shape error.
/// The top-level field of the JSON object `body` that made `T` fail with `msg`:
/// the one whose removal makes that error go. serde loses the path inside a flattened
/// struct (and reports its errors at the object's end), so the field is found by
/// asking again, without a copy of the body. Only for error answers, and only for
/// small objects (at most 32 fields, 64 KiB): a hostile body costs a bounded number
/// of extra parses.
fn field_of<T: serde::de::DeserializeOwned>(body: &[u8], msg: &str) -> Option<String> {
    if body.len() > 64 << 10 {
        return None;
    }
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let keys: Vec<String> = v.as_object()?.keys().cloned().collect();
    if keys.len() > 32 {
        return None;
    }
    // serde_json adds the position to errors from text, not from values.
    let plain = msg.split(" at line ").next().unwrap_or(msg);
    keys.into_iter().find(|k| {
        let Some(taken) = v.as_object_mut().and_then(|m| m.remove(k)) else {
            return false;
        };
        // Without the culprit the error goes (or the next one shows); without any
        // other field it stays, or that field is now missing.
        let culprit = T::deserialize(&v).map_or_else(
            |e| {
                let e = e.to_string();
                e != plain && e != format!("missing field `{k}`")
            },
            |_| true,
        );
        if let Some(m) = v.as_object_mut() {
            m.insert(k.clone(), taken);
        }
        culprit
    })
}

pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // Path tracking costs per element (1k token ids per query): only a body that
    // fails is parsed again with it, to name the field.
    if let Ok(v) = serde_json::from_slice::<T>(body) {
        return Ok(v);
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(&mut *de) {
        // The first parse failed, so something follows the value: trailing data is
        // no part of a request (`end` allows whitespace only).
        Ok(v) => de
            .end()
            .map(|()| v)
            .map_err(|e| ApiError::Syntax { msg: e.to_string() }),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if matches!(inner.classify(), serde_json::error::Category::Data) {
                let msg = inner.to_string();
                // A missing field is reported at the parent; name the field itself.
                let field = match msg
                    .strip_prefix("missing field `")
                    .and_then(|r| r.split('`').next())
                {
                    Some(f) if path == "." => f.to_string(),
                    Some(f) => format!("{path}.{f}"),
                    // A flattened struct's field loses its path: name the top-level
                    // field whose value holds the error's position.
                    None if path == "." => field_of::<T>(body, &msg).unwrap_or(path),
                    None => path,
                };
                Err(ApiError::Field { field, msg })
            } else {
                Err(ApiError::Syntax {
                    msg: inner.to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct T {
        #[allow(dead_code)]
        a: u32,
    }

    #[test]
    fn trailing_data_is_a_syntax_error_and_whitespace_is_not() {
        assert!(parse::<T>(b"{\"a\":1} \n\t\r").is_ok());
        for bad in [
            &b"{\"a\":1}x"[..],
            b"{\"a\":1}{\"a\":2}",
            b"{\"a\":1} 1",
            b"{\"a\":1}\0",
        ] {
            let e = parse::<T>(bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{e}");
            assert!(matches!(e, ApiError::Syntax { .. }), "{e}");
        }
        // A shape error still names its field.
        let e = parse::<T>(b"{\"a\":\"x\"} tail").unwrap_err();
        assert!(
            matches!(e, ApiError::Field { ref field, .. } if field == "a"),
            "{e}"
        );
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Outer {
        a: u32,
        #[serde(flatten)]
        inner: Inner,
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        group: Option<String>,
        loads: Option<bool>,
    }

    /// serde loses the path inside a flattened struct; the field is still named.
    #[test]
    fn a_flattened_fields_error_names_the_field() {
        for (body, want) in [
            (&b"{\"a\":1,\"group\":5}"[..], "group"),
            (
                b"{\"a\": 1,\n \"loads\": \"yes\",\n \"group\": \"g\"}",
                "loads",
            ),
        ] {
            let e = parse::<Outer>(body).unwrap_err();
            assert!(
                matches!(e, ApiError::Field { ref field, .. } if field == want),
                "{e}"
            );
        }
    }
}
