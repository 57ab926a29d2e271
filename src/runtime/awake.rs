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
//! spin ends, and never parks. Owned by one executor; never shared.

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
    /// The keeper's waker while it is dormant.
    dormant: RefCell<Option<Waker>>,
}

impl KeepAwake {
    /// Poll for `window` after each [`Self::note`] (the executor's spin before
    /// park must be [`idle_spin`] of the same window).
    pub(super) fn new(window: Duration) -> Rc<Self> {
        Rc::new(KeepAwake {
            window,
            tick: TICK,
            last: Cell::new(Instant::now() - window),
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
                glommio::timer::sleep(self.tick).await;
            }
        }
    }
}
