//! The kernel time slice an executor thread asks for while it serves queries.
//!
//! Linux's fair scheduler (EEVDF, 6.12 and later) lets a thread ask for a shorter
//! slice than the default (`sched_setattr`, `sched_runtime` of a `SCHED_OTHER`
//! thread, clamped by the kernel to 0.1–100 ms). A shorter slice gives the thread an
//! earlier deadline: when it wakes, or has a request waiting, it gets its core back
//! from a thread sharing it (a load client, an ingest thread) sooner, and gives it up
//! sooner in turn. Only the calling thread's slice changes; its policy and nice
//! value stay. Older kernels take the call and ignore the slice. Never blocks.

use std::time::Duration;

/// `struct sched_attr` (`include/uapi/linux/sched/types.h`), the first version of
/// its layout: the kernel reads `size` bytes of it.
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Ask for `slice` as the calling thread's time slice; `None`: the kernel's default.
/// The thread stays `SCHED_OTHER` at nice 0, which is how kvix's threads run.
pub fn set(slice: Option<Duration>) -> std::io::Result<()> {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 0,
        priority: 0,
        runtime: slice.map_or(0, |s| s.as_nanos().min(u64::MAX as u128) as u64),
        deadline: 0,
        period: 0,
    };
    // SAFETY: `attr` is a fully initialised `sched_attr` whose `size` field names its
    // own size; the kernel only reads it, during the call. Pid 0 is the calling
    // thread, and flags 0 asks for nothing else.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's slice in ns as `/proc` shows it, where the kernel shows it.
    fn shown() -> Option<u64> {
        std::fs::read_to_string("/proc/thread-self/sched")
            .ok()?
            .lines()
            .find_map(|l| {
                l.strip_prefix("se.slice")?
                    .split(':')
                    .nth(1)?
                    .trim()
                    .parse()
                    .ok()
            })
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_the_default_back() {
        std::thread::spawn(|| {
            let Some(default) = shown() else {
                eprintln!("this kernel does not show se.slice: nothing to check");
                return;
            };
            set(Some(Duration::from_micros(150))).expect("sched_setattr");
            assert_eq!(shown(), Some(150_000));
            set(None).expect("sched_setattr");
            assert_eq!(shown(), Some(default));
        })
        .join()
        .unwrap();
    }
}
