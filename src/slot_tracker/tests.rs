//! The slot shard's examples: registration checks, shared-prefix decode blocks,
//! potential loads, request lifecycle errors and expiry, each as Dynamo answers them.

use super::*;

fn key(group: &str) -> TrackerKey {
    TrackerKey {
        model_name: "model".into(),
        routing_group: group.into(),
    }
}

fn rank(worker_id: WorkerId, dp_rank: u32) -> Rank {
    Rank { worker_id, dp_rank }
}

/// The answer to a request that answers `Done`.
fn done(s: &mut SlotShard, req: SlotReq, now: Instant) -> Result<(), SlotError> {
    match s.answer(req, now) {
        SlotRep::Done(r) => r,
        r => panic!("{r:?}"),
    }
}

fn register(
    s: &mut SlotShard,
    k: &TrackerKey,
    w: WorkerId,
    bs: u32,
    start: u32,
    size: u32,
) -> Result<(), SlotError> {
    let req = SlotReq::Register {
        key: k.clone(),
        worker: w,
        block_size: bs,
        dp_start: start,
        dp_size: size,
    };
    done(s, req, Instant::now())
}

fn add(
    s: &mut SlotShard,
    k: &TrackerKey,
    id: &str,
    r: Rank,
    path: &[u64],
    tokens: usize,
    now: Instant,
) -> Result<(), SlotError> {
    let req = SlotReq::Add {
        key: k.clone(),
        request_id: id.into(),
        rank: r,
        path: path.iter().map(|&h| SeqHash(h)).collect(),
        new_tokens: tokens,
    };
    done(s, req, now)
}

fn unregister(
    s: &mut SlotShard,
    k: &TrackerKey,
    w: WorkerId,
    now: Instant,
) -> Result<(), SlotError> {
    let req = SlotReq::Unregister {
        key: k.clone(),
        worker: w,
    };
    done(s, req, now)
}

fn potential(s: &mut SlotShard, k: &TrackerKey, path: &[u64], tokens: usize) -> Vec<PotentialLoad> {
    let req = SlotReq::Potential {
        key: k.clone(),
        path: path.iter().map(|&h| SeqHash(h)).collect(),
        new_tokens: tokens,
    };
    match s.answer(req, Instant::now()) {
        SlotRep::Potential(Ok(p)) => p,
        r => panic!("{r:?}"),
    }
}

fn loads(s: &mut SlotShard) -> Vec<LoadInfo> {
    match s.answer(SlotReq::Loads(Filter::default()), Instant::now()) {
        SlotRep::Loads(l) => l,
        r => panic!("{r:?}"),
    }
}

#[test]
fn register_checks_in_dynamos_order() {
    let mut s = SlotShard::default();
    let k = key("default");
    assert_eq!(
        register(&mut s, &k, 1, 0, 0, 0),
        Err(SlotError::InvalidBlockSize)
    );
    assert_eq!(
        register(&mut s, &k, 1, 16, 0, 0),
        Err(SlotError::InvalidDpSize)
    );
    assert!(matches!(
        register(&mut s, &k, 1, 16, u32::MAX, 1),
        Err(SlotError::InvalidDpRange { .. })
    ));
    assert!(matches!(
        register(&mut s, &k, 1, 16, 0, MAX_DP_RANKS + 1),
        Err(SlotError::DpSizeTooLarge { .. })
    ));
    register(&mut s, &k, 1, 16, 2, 2).unwrap();
    assert_eq!(
        loads(&mut s).iter().map(|l| l.dp_rank).collect::<Vec<_>>(),
        [2, 3]
    );
    assert!(matches!(
        register(&mut s, &k, 1, 16, 0, 1),
        Err(SlotError::DuplicateWorker { .. })
    ));
    assert!(matches!(
        register(&mut s, &k, 2, 32, 0, 1),
        Err(SlotError::BlockSizeMismatch { .. })
    ));
    // Trackers are per routing group: the same worker id registers in another.
    register(&mut s, &key("b"), 1, 32, 0, 1).unwrap();
}

#[test]
fn shared_prefix_blocks_count_once_and_potential_adds_the_rest() {
    let mut s = SlotShard::default();
    let k = key("default");
    let now = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "a", rank(1, 0), &[1, 2, 3], 8, now).unwrap();
    add(&mut s, &k, "b", rank(1, 0), &[1, 2, 4], 0, now).unwrap();
    let l = loads(&mut s);
    assert_eq!(
        (l[0].active_decode_blocks, l[0].active_prefill_tokens),
        (4, 8)
    );
    let p = potential(&mut s, &k, &[1, 2, 5, 6], 5);
    assert_eq!(p.len(), 1);
    assert_eq!(
        (
            p[0].potential_prefill_tokens,
            p[0].potential_decode_blocks,
            p[0].active_requests
        ),
        (13, 6, 2)
    );
    // The same hash under another parent is another block.
    add(&mut s, &k, "c", rank(1, 0), &[9, 2], 0, now).unwrap();
    assert_eq!(loads(&mut s)[0].active_decode_blocks, 6);
    assert!(matches!(
        s.answer(
            SlotReq::Free {
                key: k.clone(),
                request_id: "a".into()
            },
            now
        ),
        SlotRep::Done(Ok(()))
    ));
    let l = loads(&mut s);
    assert_eq!(
        (l[0].active_decode_blocks, l[0].active_prefill_tokens),
        (5, 0)
    );
    for id in ["b", "c", "b", "never"] {
        assert!(matches!(
            s.answer(
                SlotReq::Free {
                    key: k.clone(),
                    request_id: id.into()
                },
                now
            ),
            SlotRep::Done(Ok(()))
        ));
    }
    assert_eq!(loads(&mut s)[0].active_decode_blocks, 0);
}

#[test]
fn lifecycle_errors_are_dynamos() {
    let mut s = SlotShard::default();
    let k = key("default");
    let now = Instant::now();
    assert_eq!(
        add(&mut s, &k, "a", rank(1, 0), &[1], 0, now),
        Err(k.not_found())
    );
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    assert_eq!(
        add(&mut s, &k, "a", rank(1, 1), &[1], 0, now),
        Err(SlotError::RankNotFound(rank(1, 1)))
    );
    add(&mut s, &k, "a", rank(1, 0), &[1], 4, now).unwrap();
    let dup = add(&mut s, &k, "a", rank(1, 0), &[1], 4, now).unwrap_err();
    assert_eq!(
        dup.to_string(),
        "Request a already exists (assigned to worker WorkerWithDpRank { worker_id: 1, dp_rank: 0 })"
    );
    assert_eq!(prefill_complete(&mut s, &k, "a"), Ok(()));
    assert_eq!(prefill_complete(&mut s, &k, "a"), Ok(()));
    assert_eq!(
        prefill_complete(&mut s, &k, "x"),
        Err(SlotError::RequestNotFound("x".into()))
    );
    assert_eq!(loads(&mut s)[0].active_prefill_tokens, 0);
    // Unregistering the last worker drops the tracker and its requests.
    assert_eq!(unregister(&mut s, &k, 1, now), Ok(()));
    assert!(loads(&mut s).is_empty());
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "a", rank(1, 0), &[1], 0, now).unwrap();
}

#[test]
fn requests_expire_after_the_ttl_and_are_counted() {
    let mut s = SlotShard::new(Duration::from_secs(10), SlotLimits::default(), None);
    let k = key("default");
    let t0 = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "old", rank(1, 0), &[1, 2], 3, t0).unwrap();
    add(
        &mut s,
        &k,
        "new",
        rank(1, 0),
        &[1, 3],
        0,
        t0 + Duration::from_secs(6),
    )
    .unwrap();
    let at = t0 + Duration::from_secs(11);
    let st = s.stats(at);
    assert_eq!(st.expired, 1);
    assert_eq!(
        st.ranks[0].load,
        RankLoad {
            active_prefill_tokens: 0,
            active_decode_blocks: 2,
            active_requests: 1
        }
    );
    // The expired request is gone: its id books again.
    add(&mut s, &k, "old", rank(1, 0), &[1], 0, at).unwrap();
}

fn free(s: &mut SlotShard, k: &TrackerKey, id: &str, now: Instant) {
    let req = SlotReq::Free {
        key: k.clone(),
        request_id: id.into(),
    };
    assert!(matches!(s.answer(req, now), SlotRep::Done(Ok(()))));
}

fn prefill_complete(s: &mut SlotShard, k: &TrackerKey, id: &str) -> Result<(), SlotError> {
    let req = SlotReq::PrefillComplete {
        key: k.clone(),
        request_id: id.into(),
    };
    done(s, req, Instant::now())
}

#[test]
fn token_counts_saturate_and_give_back_exactly() {
    let mut s = SlotShard::default();
    let k = key("default");
    let now = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "huge", rank(1, 0), &[1], usize::MAX, now).unwrap();
    add(&mut s, &k, "small", rank(1, 0), &[2], 5, now).unwrap();
    assert_eq!(loads(&mut s)[0].active_prefill_tokens, usize::MAX);
    assert_eq!(
        potential(&mut s, &k, &[], 7)[0].potential_prefill_tokens,
        usize::MAX
    );
    prefill_complete(&mut s, &k, "huge").unwrap();
    assert_eq!(loads(&mut s)[0].active_prefill_tokens, 5);
    add(&mut s, &k, "again", rank(1, 0), &[3], usize::MAX, now).unwrap();
    free(&mut s, &k, "again", now);
    assert_eq!(loads(&mut s)[0].active_prefill_tokens, 5);
}

#[test]
fn bounds_refuse_and_count() {
    let limits = SlotLimits {
        max_booking_blocks: 3,
        max_rank_blocks: 4,
        max_bookings: 3,
        max_tracker_blocks: 8,
        metrics_max_ranks: 1,
    };
    let mut s = SlotShard::new(DEFAULT_TTL, limits, None);
    let k = key("default");
    let now = Instant::now();
    register(&mut s, &k, 1, 16, 0, 2).unwrap();
    assert_eq!(
        add(&mut s, &k, "a", rank(1, 0), &[1, 2, 3, 4], 0, now),
        Err(SlotError::BookingTooLarge { blocks: 4, max: 3 })
    );
    add(&mut s, &k, "a", rank(1, 0), &[1, 2, 3], 0, now).unwrap();
    // Shared blocks count once: two more fit, a third does not.
    add(&mut s, &k, "b", rank(1, 0), &[1, 2, 5], 0, now).unwrap();
    assert!(matches!(
        add(&mut s, &k, "c", rank(1, 0), &[1, 6], 0, now),
        Err(SlotError::RankFull {
            blocks: 5,
            max: 4,
            ..
        })
    ));
    add(&mut s, &k, "c", rank(1, 1), &[1, 6], 0, now).unwrap();
    assert_eq!(
        add(&mut s, &k, "d", rank(1, 1), &[], 0, now),
        Err(SlotError::TooManyBookings { max: 3 })
    );
    free(&mut s, &k, "c", now);
    add(&mut s, &k, "d", rank(1, 1), &[], 0, now).unwrap();
    // Every booking's path counts, shared or not, until it is given back: once
    // the frees' steps ran, 3 + 3 + 3 > 8.
    free(&mut s, &k, "d", now);
    while s.step(now) {}
    assert_eq!(
        add(&mut s, &k, "e", rank(1, 1), &[1, 2, 3], 0, now),
        Err(SlotError::TrackerFull { blocks: 9, max: 8 })
    );
    free(&mut s, &k, "b", now);
    while s.step(now) {}
    add(&mut s, &k, "e", rank(1, 1), &[1, 2, 3], 0, now).unwrap();
    let st = s.stats(now);
    assert_eq!(
        st.refused,
        Refused {
            booking_blocks: 1,
            rank_blocks: 1,
            bookings: 1,
            tracker_blocks: 1
        }
    );
    // Two ranks, over the metrics' bound of one: per tracker only.
    assert!(st.ranks.is_empty());
    assert_eq!(st.trackers.len(), 1);
    assert_eq!(st.trackers[0].ranks, 2);
    // "a" on rank 0, "e" on rank 1: three blocks each.
    assert_eq!(st.trackers[0].load.active_decode_blocks, 6);
    assert_eq!(st.trackers[0].load.active_requests, 2);
}

#[test]
fn expiry_and_large_frees_go_in_bounded_steps() {
    let ttl = Duration::from_secs(10);
    let mut s = SlotShard::new(ttl, SlotLimits::default(), None);
    let k = key("default");
    let t0 = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    let n = 3 * STEP_BLOCKS as u64;
    for i in 0..n {
        add(&mut s, &k, &format!("r{i}"), rank(1, 0), &[i, i + n], 1, t0).unwrap();
    }
    let big: Vec<u64> = (0..3 * STEP_BLOCKS as u64).map(|h| h + 10 * n).collect();
    add(&mut s, &k, "big", rank(1, 0), &big, 0, t0 + ttl).unwrap();
    free(&mut s, &k, "big", t0 + ttl);
    // The big booking's blocks go back in steps: its request is gone at once.
    let l = loads(&mut s)[0].clone();
    assert_eq!(l.active_prefill_tokens, n as usize);
    assert!(l.active_decode_blocks > 2 * n as usize);
    let mut steps = 0;
    while s.step(t0 + ttl) {
        steps += 1;
    }
    assert!(steps >= 1, "{steps}");
    assert_eq!(loads(&mut s)[0].active_decode_blocks, 2 * n as usize);
    // Past the TTL, each step expires a bounded share.
    let late = t0 + ttl + Duration::from_secs(1);
    let mut steps = 0;
    while s.step(late) {
        steps += 1;
        assert!(steps < 100);
    }
    assert!(steps >= 3, "{steps}");
    let st = s.stats(late);
    assert_eq!(st.expired, n);
    assert_eq!(
        st.ranks[0].load,
        RankLoad {
            active_prefill_tokens: 0,
            active_decode_blocks: 0,
            active_requests: 0
        }
    );
}

#[test]
fn a_request_past_its_ttl_is_gone_before_the_steps_reach_it() {
    let ttl = Duration::from_secs(10);
    let mut s = SlotShard::new(ttl, SlotLimits::default(), None);
    let k = key("default");
    let t0 = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    // More than one step's worth, all older than the last one.
    for i in 0..2 * STEP_BLOCKS as u64 {
        add(&mut s, &k, &format!("r{i}"), rank(1, 0), &[i], 0, t0).unwrap();
    }
    add(&mut s, &k, "last", rank(1, 0), &[1], 0, t0).unwrap();
    let late = t0 + ttl + Duration::from_secs(1);
    add(&mut s, &k, "last", rank(1, 0), &[1], 0, late).unwrap();
}

#[test]
fn unregistering_gives_the_trie_back_and_rebooks() {
    let mut s = SlotShard::default();
    let k = key("default");
    let now = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    register(&mut s, &k, 2, 16, 0, 1).unwrap();
    add(&mut s, &k, "a", rank(1, 0), &[1, 2], 0, now).unwrap();
    add(&mut s, &k, "b", rank(2, 0), &[1, 3], 0, now).unwrap();
    assert_eq!(unregister(&mut s, &k, 1, now), Ok(()));
    while s.step(now) {}
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "a", rank(1, 0), &[1, 2], 0, now).unwrap();
    let p = potential(&mut s, &k, &[1, 2, 4], 0);
    assert_eq!(p[0].potential_decode_blocks, 3);
    assert_eq!(p[1].potential_decode_blocks, 2 + 2);
}

/// While a large free is given back in steps, the rank's held blocks stay a prefix
/// of the path (deepest given back first), so a potential load of the same path
/// counts every block once: held ones as held, the rest as new.
#[test]
fn a_path_given_back_in_steps_keeps_potential_loads_exact() {
    let mut s = SlotShard::default();
    let k = key("default");
    let now = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    let path: Vec<u64> = (1..=3 * STEP_BLOCKS as u64).collect();
    add(&mut s, &k, "big", rank(1, 0), &path, 0, now).unwrap();
    free(&mut s, &k, "big", now);
    let mut held = Vec::new();
    loop {
        let p = potential(&mut s, &k, &path, 0);
        assert_eq!(p[0].potential_decode_blocks, path.len());
        held.push(loads(&mut s)[0].active_decode_blocks);
        if !s.step(now) {
            break;
        }
    }
    // (Every call takes a step too.) Some answer came from a partial release.
    assert!(held.iter().any(|&h| h > 0 && h < path.len()), "{held:?}");
    assert_eq!(loads(&mut s)[0].active_decode_blocks, 0);
}

/// A worker unregistered while its bookings are given back, and registered again,
/// keeps what it books anew: the old releases no longer touch its ranks.
#[test]
fn releases_of_an_unregistered_worker_leave_its_new_bookings_alone() {
    let mut s = SlotShard::default();
    let k = key("default");
    let now = Instant::now();
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    register(&mut s, &k, 2, 16, 0, 1).unwrap();
    let path: Vec<u64> = (1..=3 * STEP_BLOCKS as u64).collect();
    add(&mut s, &k, "old", rank(1, 0), &path, 0, now).unwrap();
    assert_eq!(unregister(&mut s, &k, 1, now), Ok(()));
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "new", rank(1, 0), &path[..10], 0, now).unwrap();
    while s.step(now) {}
    let l = loads(&mut s);
    let w1 = l.iter().find(|l| l.worker_id == 1).unwrap();
    assert_eq!(w1.active_decode_blocks, 10);
    free(&mut s, &k, "new", now);
    while s.step(now) {}
    assert_eq!(
        loads(&mut s)
            .iter()
            .map(|l| l.active_decode_blocks)
            .sum::<usize>(),
        0
    );
}
