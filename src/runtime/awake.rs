//! Keeps an executor polling while it serves queries, and lets it park at once
//! otherwise.
//!
//! A parked executor needs a kernel wake-up (tens of µs on a VM) before it sees a
//! request or a peer's scatter, so an executor that serves queries should poll
//! between them. glommio only offers a spin of fixed length before every park,
//! fixed when the executor starts: long enough for queries, it also spins after
//! every chunk of events an event flood hands over, on a core the ingest threads
//! need. So glommio's own spin stays short ([`idle_spin`]), and while queries
//! come (for `window` after the last one) a keeper task sleeps in steps shorter
//! than that spin: the executor's idle loop then always has a timer due before its
//! spin ends, and never parks. With an executor on every core, the keeper also
//! yields the core at each step, so that no other thread waits behind the polling.
//! Owned by one executor; never shared.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// glommio's spin before each park: short, so that an executor fed an event flood
/// gives its core back soon after each chunk it drains; longer than [`TICK`], so
/// that the keeper's timer always falls due within it.
const IDLE_SPIN: Duration = Duration::from_micros(10);
/// The keeper's timer while queries come.
const TICK: Duration = Duration::from_micros(5);

/// glommio's spin before park for an executor that polls for `window` after each
/// query: none if it never polls.
pub(super) fn idle_spin(window: Duration) -> Duration {
    IDLE_SPIN.min(window)
}

pub(super) struct KeepAwake {
    window: Duration,
    tick: Duration,
    /// When a query (or a peer's request) last arrived.
    last: Cell<Instant>,
    /// Executors occupy every core: yield the core at each turn of polling.
    polite: bool,
    /// The keeper's waker while it is dormant.
    dormant: RefCell<Option<Waker>>,
}

impl KeepAwake {
    /// Poll for `window` after each [`Self::note`] (the executor's spin before
    /// park must be [`idle_spin`] of the same window); `polite` when executors
    /// occupy every core.
    pub(super) fn new(window: Duration, polite: bool) -> Rc<Self> {
        let now = Instant::now();
        Rc::new(KeepAwake {
            window,
            tick: TICK.min(idle_spin(window) / 2),
            // Quiet from the start (or busy for one window, so early after boot
            // that the clock cannot go back that far: harmless).
            last: Cell::new(now.checked_sub(window).unwrap_or(now)),
            polite,
            dormant: RefCell::new(None),
        })
    }

    /// A query or a peer's request arrived: keep polling for `window` from now.
    #[inline]
    pub(super) fn note(&self) {
        if self.window.is_zero() {
            return;
        }
        self.last.set(Instant::now());
        if let Some(w) = self.dormant.borrow_mut().take() {
            w.wake();
        }
    }

    fn busy(&self) -> bool {
        self.last.get().elapsed() < self.window
    }

    /// The keeper task: dormant until a [`Self::note`], then a timer every `tick`
    /// until `window` passes without one.
    pub(super) async fn run(self: Rc<Self>) {
        if self.window.is_zero() {
            return;
        }
        loop {
            poll_fn(|cx| {
                if self.busy() {
                    Poll::Ready(())
                } else {
                    *self.dormant.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            while self.busy() {
                // With an executor on every core, a thread that needs a core (an
                // ingest thread, a client on the same machine) would wait for the
                // scheduler's tick, milliseconds, behind a polling executor.
                // Yielding each turn hands the core over at once; with nobody
                // waiting it costs a syscall. With a core to spare, the scheduler
                // puts such threads there and yielding only delays this executor.
                if self.polite {
                    std::thread::yield_now();
                }
                glommio::timer::sleep(self.tick).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_wakes_on_a_note_and_goes_dormant_a_window_later() {
        let window = Duration::from_millis(200);
        glommio::LocalExecutorBuilder::default()
            .spin_before_park(idle_spin(window))
            .spawn(move || async move {
                let k = KeepAwake::new(window, false);
                glommio::spawn_local(k.clone().run()).detach();
                glommio::timer::sleep(Duration::from_millis(5)).await;
                assert!(k.dormant.borrow().is_some(), "dormant before any query");
                k.note();
                assert!(k.dormant.borrow().is_none(), "woken by the note");
                glommio::timer::sleep(Duration::from_millis(20)).await;
                assert!(k.dormant.borrow().is_none(), "polling within the window");
                glommio::timer::sleep(window * 2).await;
                assert!(
                    k.dormant.borrow().is_some(),
                    "dormant once the window passed"
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn its_timer_always_falls_due_within_the_spin() {
        for us in [1, 5, 10, 20, 200, 1_000_000] {
            let window = Duration::from_micros(us);
            let k = KeepAwake::new(window, false);
            assert!(!k.tick.is_zero() && k.tick < idle_spin(window), "{us} µs");
        }
        assert!(idle_spin(Duration::ZERO).is_zero());
    }
}
