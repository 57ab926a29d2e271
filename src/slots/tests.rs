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

fn register(
    s: &mut SlotShard,
    k: &TrackerKey,
    w: WorkerId,
    bs: u32,
    start: u32,
    size: u32,
) -> Result<(), SlotError> {
    match s.answer(
        SlotReq::Register {
            key: k.clone(),
            worker: w,
            block_size: bs,
            dp_start: start,
            dp_size: size,
        },
        Instant::now(),
    ) {
        SlotRep::Done(r) => r,
        r => panic!("{r:?}"),
    }
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
    match s.answer(req, now) {
        SlotRep::Done(r) => r,
        r => panic!("{r:?}"),
    }
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
    let done = |s: &mut SlotShard, id: &str| match s.answer(
        SlotReq::PrefillComplete {
            key: k.clone(),
            request_id: id.into(),
        },
        now,
    ) {
        SlotRep::Done(r) => r,
        r => panic!("{r:?}"),
    };
    assert_eq!(done(&mut s, "a"), Ok(()));
    assert_eq!(done(&mut s, "a"), Ok(()));
    assert_eq!(
        done(&mut s, "x"),
        Err(SlotError::RequestNotFound("x".into()))
    );
    assert_eq!(loads(&mut s)[0].active_prefill_tokens, 0);
    // Unregistering the last worker drops the tracker and its requests.
    assert!(matches!(
        s.answer(
            SlotReq::Unregister {
                key: k.clone(),
                worker: 1
            },
            now
        ),
        SlotRep::Done(Ok(()))
    ));
    assert!(loads(&mut s).is_empty());
    register(&mut s, &k, 1, 16, 0, 1).unwrap();
    add(&mut s, &k, "a", rank(1, 0), &[1], 0, now).unwrap();
}

#[test]
fn requests_expire_after_the_ttl_and_are_counted() {
    let mut s = SlotShard::new(Duration::from_secs(10), None);
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
