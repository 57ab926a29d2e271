//! Handing freed memory back to the OS once a burst is over.
//!
//! Owns the calls that return freed heap to the OS: libzmq's frames live on the
//! C heap (glibc), everything of kvix's on mimalloc's. During a burst freed
//! memory stays with the allocator for a short delay ([`configure_allocator`]), so a
//! growing table reuses the pages the last growth freed instead of faulting and
//! zeroing fresh ones; a thread that has worked and then had nothing to do for
//! [`QUIET`] releases the rest ([`Release`]), so an idle indexer does not keep
//! what the burst freed. Never called per event; a light steady stream releases
//! at most once per [`RELEASE_EVERY`].

use std::time::{Duration, Instant};

/// The process's memory settings, before any thread allocates: freed memory goes
/// back promptly and pages stay small (see the two settings below).
pub fn configure_allocator() {
    small_pages_only();
    return_freed_memory_promptly();
}

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`, v2 and v3 alike); the -sys
/// crate does not name it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the OS after [`PURGE_DELAY_MS`] (arena memory after ten
/// times that, mimalloc's `arena_purge_mult`) instead of mimalloc's 1 s, checked on
/// a later allocator call. Not at once: a table that grows reuses the pages its last
/// growth freed instead of faulting in and zeroing fresh ones. A thread that goes
/// quiet after work releases the rest ([`Release`]), so an idle indexer does not
/// keep what a burst or an unregister freed. Purges are whole 2 MiB spans, so
/// small-object churn does not pay for them. `MIMALLOC_PURGE_DELAY` still wins
/// when set.
fn return_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide integer option; mimalloc reads options with
        // relaxed atomics, so changing one while threads allocate is allowed.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// Milliseconds freed memory stays with mimalloc before it is purged.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set
/// (mimalloc's own switch, read before `main`; unset, mimalloc advises huge pages
/// for its arenas). The trees' arenas and engine-hash maps are written at random
/// positions, so a 2 MiB huge page is faulted in, zeroed and kept resident whole
/// wherever one entry lands; with 4 KiB pages only what is written is resident.
fn small_pages_only() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map,
        // checked at page-fault time; it reads no pointers.
        let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if r != 0 {
            eprintln!(
                "kvix: transparent huge pages stay on (prctl: {})",
                std::io::Error::last_os_error()
            );
        }
    }
}

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

    /// Guards the option's number against a renumbering upstream: mimalloc v3's
    /// default purge delay is 1000 ms, which no neighbouring option has.
    #[test]
    fn purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads a process-wide integer option (see above).
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(before, 1000);
        return_freed_memory_promptly();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(after, PURGE_DELAY_MS);
    }

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
