//! Handing freed memory back to the OS once a burst is over.
//!
//! Owns the calls that return freed heap to the OS: libzmq's frames live on the
//! C heap (glibc), everything of kvix's on mimalloc's. During a burst freed
//! memory stays with the allocator for a short delay (set in `main.rs`), so a
//! growing table reuses the pages the last growth freed instead of faulting and
//! zeroing fresh ones; a thread that has worked and then had nothing to do for
//! [`QUIET`] releases the rest ([`Release`]), so an idle indexer does not keep
//! what the burst freed. Never called per event; a light steady stream releases
//! at most once per [`RELEASE_EVERY`].

use std::time::{Duration, Instant};

/// How long a thread goes without work before it releases freed memory.
pub const QUIET: Duration = Duration::from_millis(50);
/// A thread releases at most this often: a release walks the thread's heap.
pub const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// Which heaps a thread gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heaps {
    /// mimalloc's only: what an executor may do, since glibc's `malloc_trim` takes
    /// arena locks another thread (libzmq's) may hold, and an executor never waits
    /// on a lock.
    Own,
    /// mimalloc's and the C heap, where libzmq keeps its frames (ingest threads).
    OwnAndC,
}

/// When one thread last worked and last released; it calls [`Release::worked`]
/// after work and [`Release::idle`] whenever it has nothing to do.
#[derive(Debug)]
pub struct Release {
    heaps: Heaps,
    worked_at: Option<Instant>,
    released_at: Option<Instant>,
}

impl Release {
    pub fn new(heaps: Heaps) -> Self {
        Release {
            heaps,
            worked_at: None,
            released_at: None,
        }
    }

    pub fn worked(&mut self) {
        self.worked_at = Some(Instant::now());
    }

    /// Release if this thread worked, has been quiet for [`QUIET`] since, and has not
    /// released within [`RELEASE_EVERY`]. Returns whether it released.
    pub fn idle(&mut self) -> bool {
        self.idle_then(|| {})
    }

    /// [`Self::idle`], first calling `trim` (which frees what the thread keeps for
    /// its next burst) when it is time to release, so the release returns that too.
    pub fn idle_then(&mut self, trim: impl FnOnce()) -> bool {
        let due = self.worked_at.is_some_and(|t| t.elapsed() >= QUIET)
            && self
                .released_at
                .is_none_or(|t| t.elapsed() >= RELEASE_EVERY);
        if due {
            trim();
            release(self.heaps);
            self.worked_at = None;
            self.released_at = Some(Instant::now());
        }
        due
    }
}

/// Frees `v` if it has grown past `keep_bytes` (scratch a rare large input grew),
/// keeping a smaller one for the inputs to come.
pub fn trim<T>(v: &mut Vec<T>, keep_bytes: usize) {
    if v.capacity() * std::mem::size_of::<T>() > keep_bytes {
        *v = Vec::new();
    }
}

/// Return what `heaps` hold free to the OS.
fn release(heaps: Heaps) {
    // SAFETY: mi_collect only releases free pages of the calling thread's heap and
    // the shared arenas (synchronised by mimalloc with atomics); it reads no caller
    // memory.
    unsafe { libmimalloc_sys::mi_collect(true) };
    if heaps == Heaps::OwnAndC {
        // SAFETY: malloc_trim only releases free C-heap pages, under glibc's own
        // arena locks; it reads no caller memory.
        unsafe { libc::malloc_trim(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_frees_only_what_grew_past_the_bound() {
        let mut big: Vec<u32> = Vec::with_capacity(1024);
        let mut small: Vec<u32> = Vec::with_capacity(16);
        trim(&mut big, 1024);
        trim(&mut small, 1024);
        assert_eq!(big.capacity(), 0);
        assert_eq!(small.capacity(), 16);
    }

    #[test]
    fn releases_once_quiet_after_work_and_not_too_often() {
        let mut r = Release::new(Heaps::Own);
        assert!(!r.idle(), "nothing was done");
        r.worked();
        assert!(!r.idle(), "not quiet yet");
        std::thread::sleep(QUIET);
        assert!(r.idle());
        assert!(!r.idle(), "nothing done since");
        r.worked();
        std::thread::sleep(QUIET);
        assert!(!r.idle(), "released within RELEASE_EVERY");
    }
}
