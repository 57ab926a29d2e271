//! The HTTP API's query bodies through `kvix::http::routes::check_body`, which runs the
//! handlers' own parsing and checks up to their first registry access: `/query` (its
//! token ids by the fast path of `kvix::http::token_ids` when it applies) and
//! `/query_by_hash` and `/speculate`, each in the shape the body names or, for inputs of odd length,
//! forced to the conductor's as under `/conductor/...` (half the work of parsing each
//! input twice), and `/query_tiered_by_hash` (Dynamo's shape always).
//!
//! Properties: never a panic; a rejection is an ApiError the client is to blame for
//! (400 or 422; 413 is the body limit's); the fast path agrees with serde_json: a
//! `/query` that parses has the token ids serde_json reads from the same body, and
//! `token_ids::split` / `plain_u32_array` never return ids serde_json would not.
//! A `prompt` or `messages` body is refused with a 422: no tokenizer is loaded here.
#![no_main]

use kvix::http::routes;
use kvix::http::scope::Shape;
use kvix::http::token_ids;
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

/// The slow path: serde_json alone, every other field ignored (a duplicate
/// `token_ids` is still an error, as in the handler's own struct).
#[derive(Deserialize)]
struct Slow {
    token_ids: Vec<u32>,
}

fn client_error(route: &str, e: &kvix::http::error::ApiError) {
    assert!(
        matches!(e.status().as_u16(), 400 | 413 | 422),
        "{route}: {} {e}",
        e.status()
    );
}

fuzz_target!(|data: &[u8]| {
    let slow = serde_json::from_slice::<Slow>(data).map(|s| s.token_ids);
    let forced = (data.len() % 2 == 1).then_some(Shape::Conductor);
    match routes::check_body("/query", forced, data) {
        Ok(ids) => {
            let ids = ids.expect("/query yields its token ids");
            match &slow {
                Ok(s) => assert_eq!(&ids, s, "fast and slow paths disagree"),
                Err(e) => panic!("accepted a body serde_json rejects ({e}): {ids:?}"),
            }
        }
        Err(e) => client_error("/query", &e),
    }
    for route in ["/query_by_hash", "/speculate", "/query_tiered_by_hash"] {
        match routes::check_body(route, forced, data) {
            Ok(ids) => assert!(ids.is_none()),
            Err(e) => client_error(route, &e),
        }
    }
    // The fast path on its own: where serde_json reads the same body, it reads the
    // same ids (the handler would otherwise trust ids serde_json never saw).
    if let (Some((ids, _)), Ok(s)) = (token_ids::split(data), &slow) {
        assert_eq!(&ids, s, "split disagrees with serde_json");
    }
    if let Some(ids) = token_ids::plain_u32_array(data) {
        let s: Vec<u32> = serde_json::from_slice(data).expect("serde_json reads a plain array");
        assert_eq!(ids, s, "plain_u32_array disagrees with serde_json");
    }
});
