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
//! spin ends, and never parks. The keeper also yields the core at each step, and
//! stops polling (until the next query) as soon as a yield hands the core to another
//! thread: a thread that needs this core (an ingest thread, a client or a kernel
//! thread on the same machine) must not wait behind the polling, and the scheduler,
//! left to itself, makes it wait tens of µs at each of its wake-ups. While requests
//! come (queries, peers' requests, any HTTP request; and for at least
//! [`SLICE_HOLD`] after the last) the executor's thread also asks the kernel for a
//! short time slice ([`super::slice`]), so that a thread sharing its core hands it
//! back soon when a request waits; an executor that only applies events runs on the
//! kernel's default slice. Owned by one executor, made and used on its thread;
//! never shared.

use super::slice;
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// glommio's spin before each park: short, so that an executor fed an event flood
/// gives its core back soon after each chunk it drains; longer than [`TICK`], so
/// that the keeper's timer always falls due within it.
const IDLE_SPIN: Duration = Duration::from_micros(10);
/// The keeper's timer while queries come.
const TICK: Duration = Duration::from_micros(5);
/// A yield that returns this late ran another thread: the core is wanted.
/// A yield with nobody waiting is one syscall, well under it. Reading the clock
/// around it assumes a vDSO clock; where each read is a syscall too, or the VM
/// steals the core, yields look late and the executor only parks sooner.
const CONTENDED: Duration = Duration::from_micros(3);

/// How long after the last request an executor keeps its short time slice, at least.
pub const SLICE_HOLD: Duration = Duration::from_secs(1);

/// glommio's spin before park for an executor that polls for `window` after each
/// query: none if it never polls.
pub fn idle_spin(window: Duration) -> Duration {
    IDLE_SPIN.min(window)
}

/// One executor's polling and time slice, driven by [`KeepAwake::note`] on each
/// request and [`KeepAwake::relax`] now and then.
pub struct KeepAwake {
    window: Duration,
    tick: Duration,
    /// When a query (or a peer's request) last arrived; none while quiet.
    last: Cell<Option<Instant>>,
    /// How many times polling stopped because another thread wanted the core.
    stops: Cell<u64>,
    /// The keeper's waker while it is dormant.
    dormant: RefCell<Option<Waker>>,
    /// The time slice to ask for while queries come; none: the kernel's default
    /// always (also once the kernel refused it).
    slice: Cell<Option<Duration>>,
    /// Whether the thread has the short slice now.
    short: Cell<bool>,
    /// Requests noted so far, and the count and time [`Self::relax`] last saw change.
    noted: Cell<u64>,
    seen: Cell<(u64, Instant)>,
}

impl KeepAwake {
    /// Poll for `window` after each [`Self::note`] (the executor's spin before
    /// park must be [`idle_spin`] of the same window), and run on `slice` while
    /// queries come. Made on the executor's own thread, the one whose slice it sets.
    pub fn new(window: Duration, slice: Option<Duration>) -> Rc<Self> {
        Rc::new(KeepAwake {
            window,
            tick: TICK.min(idle_spin(window) / 2),
            last: Cell::new(None),
            stops: Cell::new(0),
            dormant: RefCell::new(None),
            slice: Cell::new(slice.filter(|s| !s.is_zero())),
            short: Cell::new(false),
            noted: Cell::new(0),
            seen: Cell::new((0, Instant::now())),
        })
    }

    /// Quiet from now: no polling until the next [`Self::note`].
    fn quiet(&self) {
        self.last.set(None);
    }

    /// A query or a peer's request arrived: keep polling for `window` from now.
    #[inline]
    pub fn note(&self) {
        self.noted.set(self.noted.get() + 1);
        if !self.short.get() && self.slice.get().is_some() {
            self.shorten();
        }
        if self.window.is_zero() {
            return;
        }
        self.last.set(Some(Instant::now()));
        if let Some(w) = self.dormant.borrow_mut().take() {
            w.wake();
        }
    }

    /// How many times polling stopped because another thread wanted the core.
    pub(super) fn stops(&self) -> u64 {
        self.stops.get()
    }

    fn shorten(&self) {
        /// Every executor meets the same refusal: one line says it.
        static WARNED: AtomicBool = AtomicBool::new(false);
        match slice::set(self.slice.get()) {
            Ok(()) => self.short.set(true),
            Err(e) => {
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "cannot shorten the executors' time slice: {e}; they run on the kernel's default"
                    );
                }
                self.slice.set(None);
            }
        }
    }

    /// Back to the kernel's default slice once no request came for [`SLICE_HOLD`]
    /// (as seen by two calls that far apart): called now and then (kvix's drain loop,
    /// `kvix-hello`'s timer), never per request.
    pub fn relax(&self) {
        if !self.short.get() {
            return;
        }
        let (seen, since) = self.seen.get();
        let noted = self.noted.get();
        if noted != seen {
            self.seen.set((noted, Instant::now()));
        } else if since.elapsed() >= SLICE_HOLD && slice::set(None).is_ok() {
            self.short.set(false);
        }
    }

    /// Whether the thread runs on the short slice now.
    #[cfg(test)]
    fn shortened(&self) -> bool {
        self.short.get()
    }

    fn busy(&self) -> bool {
        self.last.get().is_some_and(|t| t.elapsed() < self.window)
    }

    /// The keeper task: dormant until a [`Self::note`], then a timer every `tick`
    /// until `window` passes without one.
    pub async fn run(self: Rc<Self>) {
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
                // A thread that needs this core (an ingest thread, a client or a
                // kernel thread on the same machine) would wait for the scheduler's
                // tick, milliseconds, behind a polling executor, even with another
                // core to spare when that core is busy too. Yielding each turn hands
                // the core over; with nobody waiting it costs a syscall. Yet a
                // thread woken while the executor polls still waits tens of µs for
                // the core at each wake-up: so once a yield did hand the core over,
                // the executor stops polling and parks when idle until the next
                // query.
                let t = Instant::now();
                std::thread::yield_now();
                if t.elapsed() >= CONTENDED {
                    self.stops.set(self.stops.get() + 1);
                    self.quiet();
                    break;
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
                let k = KeepAwake::new(window, None);
                glommio::spawn_local(k.clone().run()).detach();
                glommio::timer::sleep(Duration::from_millis(5)).await;
                assert!(k.dormant.borrow().is_some(), "dormant before any query");
                k.note();
                assert!(k.dormant.borrow().is_none(), "woken by the note");
                glommio::timer::sleep(Duration::from_millis(20)).await;
                // A busy thread on this core (another test's) may end the polling.
                assert!(
                    k.dormant.borrow().is_none() || k.stops() > 0,
                    "polling within the window"
                );
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
    fn a_query_shortens_the_slice_and_a_quiet_second_gives_the_default_back() {
        std::thread::spawn(|| {
            if let Err(e) = slice::set(None) {
                eprintln!("sched_setattr refused here ({e}): nothing to check");
                return;
            }
            let k = KeepAwake::new(Duration::ZERO, Some(Duration::from_micros(150)));
            assert!(!k.shortened(), "the default slice before any query");
            k.note();
            assert!(k.shortened(), "the short slice once a query came");
            k.relax();
            assert!(k.shortened(), "kept right after a query");
            std::thread::sleep(SLICE_HOLD / 2);
            k.note();
            k.relax();
            std::thread::sleep(SLICE_HOLD / 2 + Duration::from_millis(100));
            k.relax();
            assert!(k.shortened(), "kept: a query came less than a hold ago");
            std::thread::sleep(SLICE_HOLD / 2);
            k.relax();
            assert!(!k.shortened(), "the default again after a quiet hold");
            k.note();
            assert!(k.shortened(), "short again with the next query");
        })
        .join()
        .unwrap();
    }

    /// The first CPU this process may run on, and pin the calling thread there.
    fn pin_to_first_cpu() -> usize {
        // SAFETY: `set` is a plain bit set (all zeroes is a valid, empty one) that
        // sched_getaffinity/sched_setaffinity read or write within its size; the
        // CPU_* macros index it below CPU_SETSIZE; pid 0 is the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            let cpu = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &set))
                .expect("some CPU is allowed");
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, size, &set), 0);
            cpu
        }
    }

    #[test]
    fn a_keeper_stops_polling_once_another_thread_wants_its_core() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, mpsc};
        let window = Duration::from_secs(10);
        let stop = Arc::new(AtomicBool::new(false));
        let (cpu_tx, cpu_rx) = mpsc::channel();
        let hog = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                cpu_tx.send(pin_to_first_cpu()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        // Stops the hog however the test ends, so that it never spins on in the
        // test process.
        struct StopOnDrop(Arc<AtomicBool>);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stop_hog = StopOnDrop(stop.clone());
        let cpu = cpu_rx.recv().unwrap();
        let parked = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(cpu))
            .spin_before_park(idle_spin(window))
            .spawn(move || async move {
                let k = KeepAwake::new(window, None);
                glommio::spawn_local(k.clone().run()).detach();
                glommio::timer::sleep(Duration::from_millis(5)).await;
                k.note();
                assert!(k.dormant.borrow().is_none(), "woken by the note");
                glommio::timer::sleep(Duration::from_millis(300)).await;
                k.dormant.borrow().is_some() && k.stops() > 0
            })
            .unwrap()
            .join()
            .unwrap();
        drop(stop_hog);
        hog.join().unwrap();
        assert!(
            parked,
            "a keeper sharing its core with a busy thread still polls, long before its window ends"
        );
    }

    #[test]
    fn its_timer_always_falls_due_within_the_spin() {
        for us in [1, 5, 10, 20, 200, 1_000_000] {
            let window = Duration::from_micros(us);
            let k = KeepAwake::new(window, None);
            assert!(!k.tick.is_zero() && k.tick < idle_spin(window), "{us} µs");
        }
        assert!(idle_spin(Duration::ZERO).is_zero());
    }
}
