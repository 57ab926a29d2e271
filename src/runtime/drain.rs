//! Each executor's drain loop: applies what the ingest rings hold to its shard, runs
//! the shard's stepped work (clears, evictions, expiries, the slot trackers'
//! releases) a step a pass with requests let in between, and parks on its ring bell
//! once idle.
//!
//! Never blocks: it yields to requests, and parks only through the executor.

use super::*;
/// The drain loop's first nap after applying ops.
const IDLE_AFTER_WORK: Duration = Duration::from_millis(1);

/// A shard that evicts says so at most this often.
const EVICTION_LOG_EVERY: Duration = Duration::from_secs(10);

/// How long [`let_requests_in`] pauses a task.
const SERVE_PAUSE: Duration = Duration::from_micros(10);

/// The longest the drain loop applies ops without letting requests in: a query
/// waits at most about this long behind an event flood, and the pauses cost the
/// flood a fraction of a percent.
const SERVE_EVERY: Duration = Duration::from_millis(2);

/// Pause the calling task so that requests that arrived meanwhile are served before
/// it goes on with a long job. A yield, conditional or not, does not get them there:
/// the connections' completions are only reaped when the executor polls its rings,
/// which it does not while a task is runnable. A timer that has not expired when
/// first polled makes the task wait, and the executor polls.
pub(super) async fn let_requests_in() {
    glommio::timer::sleep(SERVE_PAUSE).await;
}

/// An executor whose rings stayed empty this long (longer than [`crate::heap::QUIET`],
/// so what the last burst freed is released first) parks on its ring bell.
const PARK_AFTER: Duration = Duration::from_millis(100);

/// A parked drain loop still wakes this often, to release memory and log.
const PARKED_TICK: Duration = Duration::from_millis(500);

/// The read end of this core's ring bell as a glommio stream, `None` if taken.
fn bell(core: &Core) -> Option<glommio::net::UnixStream> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let rx = core.app.rings().take_bell(core.id)?;
    // SAFETY: `into_raw_fd` gives up the std stream's ownership of the descriptor,
    // which the glommio stream takes over (and closes) alone.
    Some(unsafe { glommio::net::UnixStream::from_raw_fd(rx.into_raw_fd()) })
}

/// A drain loop parks only for this long or longer (a shorter wait is a nap).
const PARK_AT_LEAST: Duration = Duration::from_millis(20);

/// Wait on `bell` for a producer's byte, or `wake`. False if the bell broke
/// (the caller goes back to napping rather than spin on an error).
async fn wait_for_bell(bell: &mut glommio::net::UnixStream, wake: Duration) -> bool {
    use futures_lite::AsyncReadExt;
    let rung = async {
        let mut bytes = [0u8; 64];
        matches!(bell.read(&mut bytes).await, Ok(n) if n > 0)
    };
    let tick = async {
        glommio::timer::sleep(wake).await;
        true
    };
    futures_lite::future::or(rung, tick).await
}

/// Ops a drain pass applies at most, and how many it applies between looks at
/// the clock: a pass also ends once it has applied ops for [`SERVE_EVERY`].
const PASS_OPS: usize = 8192;
const PASS_STEP_OPS: usize = 1024;

/// One drain pass: ops from this core's rings into its shard, up to [`PASS_OPS`]
/// or [`SERVE_EVERY`] of applying them, whichever comes first. Returns how many.
fn drain_pass(core: &Core, shard: &mut Shard) -> usize {
    let (rings, start) = (core.app.rings(), Instant::now());
    let mut n = 0;
    while n < PASS_OPS {
        let k = rings.drain(core.id, PASS_STEP_OPS, |ops| shard.apply_staged(ops));
        n += k;
        if k == 0 || start.elapsed() >= SERVE_EVERY {
            break;
        }
    }
    n
}

/// Steps other slot-tracker replicas took on this core's trackers, at most
/// [`PASS_STEP_OPS`] a pass; how many.
fn take_replica_steps(core: &Core) -> usize {
    let Some(links) = core.slot_tracker.borrow().links() else {
        return 0;
    };
    let mut slots = core.slot_tracker.borrow_mut();
    let now = Instant::now();
    let mut n = 0;
    while n < PASS_STEP_OPS {
        let Some(e) = links.next_for(core.id) else {
            break;
        };
        slots.answer(crate::slot_tracker::sync::call(e), now);
        n += 1;
    }
    n
}

/// Drain this core's rings into its shard forever, walk one step of a slot's clear
/// and of an eviction per pass, and end the predictions that are due (the wheel
/// slots whose turn came, see [`crate::shard::predict`]). Requests get in between
/// the steps of a clear or an eviction and at least every [`SERVE_EVERY`] of
/// applying ops.
///
/// When the rings are empty it naps 1–2 ms: every park costs glommio a membarrier IPI
/// to all cores, so shorter naps cost an event flood more than they save. A ring
/// holds 16k ops, 8 ms of one producer at 2M ops/s, so a nap does not make a
/// producer wait (`kvix_ring_full_stalls_total` counts when it does); events become
/// visible at most one nap after they arrive. Empty for [`PARK_AFTER`], it parks
/// until a producer rings its bell (or the next prediction is due) instead, so an
/// idle indexer spends no CPU polling and the next event is applied as it arrives.
/// Clears, evictions past the block budget, mass expiries and the slot trackers'
/// expiries and large frees run a step a pass, requests getting in between the
/// steps; while a step left blocks to evict, the loop takes no ops, so stores
/// never outrun eviction.
pub(super) async fn drain_loop(core: Rc<Core>) {
    let mut idle = IDLE_AFTER_WORK;
    // Gives back what applying ops freed once the shard is quiet (never the C heap:
    // trimming it takes locks).
    let mut release = crate::heap::Release::new(crate::heap::Heaps::Own);
    // Evictions as of the last warning, and when it was logged.
    let mut warned: (u64, Option<Instant>) = (0, None);
    // When the loop last let requests in, and last applied anything.
    let mut served = Instant::now();
    let mut worked = Instant::now();
    let mut bell = bell(&core);
    loop {
        // This loop wakes at least every PARKED_TICK: the slice follows the requests
        // within that.
        core.awake.relax();
        let (n, clearing, evicted) = {
            let mut shard = core.shard.borrow_mut();
            // While what it stored past the block budget is evicted, it takes no more.
            let n = if shard.evicting() {
                0
            } else {
                drain_pass(&core, &mut shard)
            };
            // The slot trackers are a cell of their own, apart from the shard.
            let n = n + take_replica_steps(&core);
            let clearing = shard.step_clears()
                | shard.step_budget()
                | shard.expire(crate::shard::predict::now_tick())
                | core.slot_tracker.borrow_mut().step_if_any();
            shard.sync_budget();
            (n, clearing, shard.evicted)
        };
        if evicted > warned.0 && warned.1.is_none_or(|t| t.elapsed() >= EVICTION_LOG_EVERY) {
            tracing::warn!(
                shard = core.id.0,
                evicted = evicted - warned.0,
                budget = core.app.block_budget().map(|b| b.max),
                "index at --max-blocks: evicting the blocks least recently stored or matched"
            );
            warned = (evicted, Some(Instant::now()));
        }
        if n == 0 && !clearing {
            release.idle();
            let rings = core.app.rings();
            // With predictions waiting, it parks only until the next is due.
            let wake = core
                .shard
                .borrow()
                .next_prediction_due()
                .map_or(PARKED_TICK, |t| {
                    crate::shard::predict::until(t).min(PARKED_TICK)
                });
            match bell.as_mut() {
                Some(b)
                    if worked.elapsed() >= PARK_AFTER
                        && wake >= PARK_AT_LEAST
                        && rings.try_park(core.id) =>
                {
                    if !wait_for_bell(b, wake).await {
                        tracing::warn!(shard = core.id.0, "ring bell broken: polling instead");
                        bell = None;
                    }
                    rings.unpark(core.id);
                }
                _ => {
                    glommio::timer::sleep(idle).await;
                    idle = (idle * 2).min(Duration::from_millis(2));
                }
            }
            served = Instant::now();
        } else {
            worked = Instant::now();
            idle = IDLE_AFTER_WORK;
            release.worked();
            // Requests that arrived meanwhile run before the next pass: at once
            // during a clear (its steps are what they would wait behind), else once
            // the passes since the last pause have run for SERVE_EVERY.
            if clearing || served.elapsed() >= SERVE_EVERY {
                let_requests_in().await;
                served = Instant::now();
            } else {
                glommio::yield_if_needed().await;
            }
        }
    }
}
