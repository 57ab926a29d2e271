//! The HTTP API's control bodies through `kvix::http::routes::check_body`, which runs
//! the handlers' own parsing and checks up to their first registry access:
//! `/register` and `/unregister` in Dynamo's and the conductor's shape (told from the
//! body, or forced as under `/conductor/...` for inputs of odd length: half the work
//! of parsing each input twice), `/register_peer` (URL rules included) and
//! `/deregister_peer`. Every input goes to every route.
//!
//! Properties: never a panic; a rejection is an ApiError the client is to blame for
//! (400 or 422; 413 is the body limit's). Registers nothing, starts nothing.
#![no_main]

use kvix::http::routes;
use kvix::http::scope::Shape;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let forced = (data.len() % 2 == 1).then_some(Shape::Conductor);
    let calls = [
        ("/register", forced),
        ("/unregister", forced),
        ("/register_peer", None),
        ("/deregister_peer", None),
    ];
    for (route, forced) in calls {
        match routes::check_body(route, forced, data) {
            Ok(ids) => assert!(ids.is_none(), "{route} yielded token ids"),
            Err(e) => assert!(
                matches!(e.status().as_u16(), 400 | 413 | 422),
                "{route}: {} {e}",
                e.status()
            ),
        }
    }
});
