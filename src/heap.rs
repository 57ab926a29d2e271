//! Handing freed memory back to the OS once a burst is over.
//!
//! Owns the calls that return freed heap to the OS: libzmq's frames live on the
//! C heap (glibc), everything of kvix's on mimalloc's. During a burst freed
//! memory stays with the allocator for a short delay (set in `main.rs`), so a
//! growing table reuses the pages the last growth freed instead of faulting and
//! zeroing fresh ones; a thread that has worked and then had nothing to do for
//! [`QUIET`] calls [`release`], so an idle indexer does not keep what the burst
//! freed. Never called per event, nor between the frames of a steady stream.

use std::time::Duration;

/// How long a thread goes without work before it releases freed memory.
pub const QUIET: Duration = Duration::from_millis(50);

/// Return what this thread's heaps hold free to the OS.
pub fn release() {
    // SAFETY: both calls only release free heap pages and read no caller memory;
    // mimalloc's collect acts on the calling thread's heap and the shared arenas,
    // which it synchronises itself; malloc_trim takes glibc's arena locks.
    unsafe {
        libmimalloc_sys::mi_collect(true);
        libc::malloc_trim(0);
    }
}
