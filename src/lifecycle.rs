//! The service's lifecycle: Starting → Recovering → Ready → Draining.
//!
//! Owns the phase (one atomic, read by every request), the conditions that make the
//! service Ready (every core listening and startup recovery finished), systemd's
//! `READY=1`, and the per-core heartbeats behind `/ready` and systemd's watchdog: a
//! core whose executor has not beaten within the stall bound makes both fail. Never
//! blocks and never touches shard state.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Where the service is in its life. Data routes answer only in [`Phase::Ready`] and
/// [`Phase::Draining`]; `/ready` answers 200 only in [`Phase::Ready`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Executors are binding their listeners.
    Starting,
    /// Startup recovery (snapshot, peer dump, catch-up replay) is running; the
    /// index is incomplete.
    Recovering,
    /// Every core serves and the index is as complete as recovery could make it.
    Ready,
    /// SIGTERM/SIGINT received: load balancers are told to go away (`/ready` 503)
    /// while the final snapshot is written; answers are still correct.
    Draining,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Recovering => "recovering",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
        }
    }

    /// Whether the index may be read and changed through the API.
    pub fn serves_data(self) -> bool {
        matches!(self, Phase::Ready | Phase::Draining)
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Starting,
            1 => Phase::Recovering,
            2 => Phase::Ready,
            _ => Phase::Draining,
        }
    }
}

/// The phase and what moves it. Shared by every core, the recovery thread and the
/// signal handlers.
pub struct Lifecycle {
    phase: AtomicU8,
    cores: usize,
    listening: AtomicUsize,
    /// Startup recovery still has to finish before Ready.
    recovering: AtomicBool,
    /// Set by SIGTERM/SIGINT (signal-safe: a plain flag).
    terminate: Arc<AtomicBool>,
    /// Set by SIGHUP, which kvix ignores (logged once per signal).
    hangup: Arc<AtomicBool>,
    /// Per core, milliseconds since `epoch` of its last heartbeat.
    heartbeats: Vec<AtomicU64>,
    epoch: Instant,
    /// A core whose last heartbeat is older than this is stalled.
    stall_after: Duration,
    /// The address every core listens on, once resolved (`--port 0` included).
    addr: OnceLock<std::net::SocketAddr>,
}

impl Lifecycle {
    /// `stall_after`: how old a core's last heartbeat may be before it counts as
    /// stalled (`--stall-timeout-ms`).
    pub fn new(cores: usize, stall_after: Duration) -> Self {
        Lifecycle {
            phase: AtomicU8::new(Phase::Starting as u8),
            cores,
            listening: AtomicUsize::new(0),
            recovering: AtomicBool::new(false),
            terminate: Arc::default(),
            hangup: Arc::default(),
            heartbeats: (0..cores).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            stall_after,
            addr: OnceLock::new(),
        }
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    /// Startup recovery will run: the service stays out of Ready until
    /// [`Lifecycle::recovery_done`].
    pub fn begin_recovery(&self) {
        self.recovering.store(true, Ordering::Release);
        let _ = self.phase.compare_exchange(
            Phase::Starting as u8,
            Phase::Recovering as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub fn is_recovering(&self) -> bool {
        self.recovering.load(Ordering::Acquire)
    }

    pub fn recovery_done(&self) {
        self.recovering.store(false, Ordering::Release);
        self.try_ready();
    }

    /// One core's listener is bound on `addr`.
    pub fn core_listening(&self, addr: std::net::SocketAddr) {
        let _ = self.addr.set(addr);
        if self.listening.fetch_add(1, Ordering::AcqRel) + 1 == self.cores {
            tracing::info!("kvix listening on http://{addr} with {} shards", self.cores);
            self.try_ready();
        }
    }

    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.addr.get().copied()
    }

    /// Ready once every core listens and recovery is over; tells systemd once.
    fn try_ready(&self) {
        if self.listening.load(Ordering::Acquire) < self.cores || self.is_recovering() {
            return;
        }
        let from = self.phase.load(Ordering::Acquire);
        if from >= Phase::Ready as u8 {
            return;
        }
        if self
            .phase
            .compare_exchange(
                from,
                Phase::Ready as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            tracing::info!("ready: serving queries");
            if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
                tracing::warn!("cannot notify systemd: {e}");
            }
        }
    }

    /// Enter Draining (from any phase); returns whether this call did.
    pub fn drain(&self) -> bool {
        let prev = self.phase.swap(Phase::Draining as u8, Ordering::AcqRel);
        if prev != Phase::Draining as u8 {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
            return true;
        }
        false
    }

    /// The flag SIGTERM/SIGINT set.
    pub fn terminate_flag(&self) -> Arc<AtomicBool> {
        self.terminate.clone()
    }

    pub fn terminate_requested(&self) -> bool {
        self.terminate.load(Ordering::Acquire)
    }

    /// The flag SIGHUP sets.
    pub fn hangup_flag(&self) -> Arc<AtomicBool> {
        self.hangup.clone()
    }

    /// Whether a SIGHUP arrived since the last call.
    pub fn take_hangup(&self) -> bool {
        self.hangup.swap(false, Ordering::AcqRel)
    }

    /// Core `core` is alive (its executor ran this).
    pub fn heartbeat(&self, core: usize) {
        let now = self.epoch.elapsed().as_millis() as u64;
        if let Some(h) = self.heartbeats.get(core) {
            h.store(now.max(1), Ordering::Relaxed);
        }
    }

    /// Every core beat within `within`.
    pub fn all_cores_alive(&self, within: Duration) -> bool {
        self.stalled_cores(within).next().is_none()
    }

    /// The cores that have not beaten within `within` (or never did).
    pub fn stalled_cores(&self, within: Duration) -> impl Iterator<Item = usize> + '_ {
        let now = self.epoch.elapsed().as_millis() as u64;
        let within = within.as_millis() as u64;
        self.heartbeats
            .iter()
            .enumerate()
            .filter_map(move |(core, h)| {
                let at = h.load(Ordering::Relaxed);
                (at == 0 || now.saturating_sub(at) > within).then_some(core)
            })
    }

    /// How old a heartbeat may be before its core counts as stalled.
    pub fn stall_after(&self) -> Duration {
        self.stall_after
    }

    /// How often each core beats: several times within the stall bound (and within
    /// systemd's watchdog interval, when it has one), so one late timer is no stall.
    pub fn heartbeat_every(&self) -> Duration {
        let bound = match watchdog_interval() {
            Some(w) => self.stall_after.min(w / 2),
            None => self.stall_after,
        };
        (bound / 4).max(Duration::from_millis(5))
    }
}

/// systemd's watchdog interval, when the unit sets `WatchdogSec`.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> std::net::SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    #[test]
    fn ready_needs_every_core_and_the_end_of_recovery() {
        let l = Lifecycle::new(2, Duration::from_secs(1));
        l.begin_recovery();
        assert_eq!(l.phase(), Phase::Recovering);
        l.core_listening(addr());
        l.core_listening(addr());
        assert_eq!(l.phase(), Phase::Recovering);
        l.recovery_done();
        assert_eq!(l.phase(), Phase::Ready);
        assert!(l.drain());
        assert!(!l.drain());
        assert_eq!(l.phase(), Phase::Draining);
        assert!(l.phase().serves_data());
    }

    #[test]
    fn without_recovery_ready_when_the_last_core_listens() {
        let l = Lifecycle::new(2, Duration::from_secs(1));
        l.core_listening(addr());
        assert_eq!(l.phase(), Phase::Starting);
        assert!(!l.phase().serves_data());
        l.core_listening(addr());
        assert_eq!(l.phase(), Phase::Ready);
    }

    #[test]
    fn a_core_that_stops_beating_is_noticed() {
        let l = Lifecycle::new(2, Duration::from_secs(1));
        l.heartbeat(0);
        assert!(!l.all_cores_alive(Duration::from_secs(1)));
        assert_eq!(
            l.stalled_cores(Duration::from_secs(1)).collect::<Vec<_>>(),
            [1]
        );
        l.heartbeat(1);
        assert!(l.all_cores_alive(Duration::from_secs(1)));
        std::thread::sleep(Duration::from_millis(30));
        l.heartbeat(1);
        assert_eq!(
            l.stalled_cores(Duration::from_millis(10))
                .collect::<Vec<_>>(),
            [0]
        );
    }
}
