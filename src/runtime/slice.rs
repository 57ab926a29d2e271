//! The kernel time slice an executor thread asks for while it serves requests.
//!
//! Linux's fair scheduler (EEVDF, 6.12 and later) lets a thread ask for a shorter
//! slice than the default (`sched_setattr`, `sched_runtime` of a `SCHED_OTHER`
//! thread, clamped by the kernel to 0.1–100 ms). A shorter slice gives the thread an
//! earlier deadline: when it wakes, or has a request waiting, it gets its core back
//! from a thread sharing it (a load client, an ingest thread) sooner, and gives it up
//! sooner in turn. Only the calling thread's slice changes: its policy, nice value
//! and flags are read first and written back as they were. Older kernels take the
//! call and ignore the slice. Never blocks. A thread started by a thread on a short
//! slice inherits it: nothing here may be called before an executor starts threads
//! of its own.

use std::time::Duration;

/// `struct sched_attr` (`include/uapi/linux/sched/types.h`), the first version of
/// its layout: the kernel reads `size` bytes of it.
#[repr(C)]
#[derive(Default)]
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

const ATTR_SIZE: u32 = 48;
const _: () = assert!(std::mem::size_of::<SchedAttr>() == ATTR_SIZE as usize);

/// `SCHED_FLAG_UTIL_CLAMP_MIN | SCHED_FLAG_UTIL_CLAMP_MAX`: fields past this first
/// layout, which a write of it must not ask for.
const UTIL_CLAMP: u64 = 0x20 | 0x40;

fn check(r: libc::c_long) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Ask for `slice` as the calling thread's time slice; `None`: the kernel's default.
/// A thread that does not run under the fair scheduler is left as it is.
pub fn set(slice: Option<Duration>) -> std::io::Result<()> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a `sched_attr` of `ATTR_SIZE` bytes, the size passed: the
    // kernel writes at most that many into it, during the call. Pid 0 is the
    // calling thread; flags must be 0.
    check(unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            ATTR_SIZE,
            0,
        )
    })?;
    if !matches!(attr.policy as i32, libc::SCHED_OTHER | libc::SCHED_BATCH) {
        return Ok(());
    }
    attr.size = ATTR_SIZE;
    attr.flags &= !UTIL_CLAMP;
    attr.runtime = slice.map_or(0, |s| s.as_nanos().min(u64::MAX as u128) as u64);
    // SAFETY: `attr` is the calling thread's own `sched_attr` as just read, of the
    // size its `size` field names, with only the slice changed; the kernel only reads
    // it, during the call. Pid 0 is the calling thread; flags must be 0.
    check(unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) })
}

/// A thread's time slice as the kernel shows it (`se.slice` in `<task>/sched`, e.g.
/// `/proc/<pid>/task/<tid>` or `/proc/thread-self`); none where it does not show it.
pub fn shown(task: &std::path::Path) -> Option<Duration> {
    std::fs::read_to_string(task.join("sched"))
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
        .map(Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown() -> Option<Duration> {
        super::shown(std::path::Path::new("/proc/thread-self"))
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_the_default_back() {
        std::thread::spawn(|| {
            let Some(default) = shown() else {
                eprintln!("this kernel does not show se.slice: nothing to check");
                return;
            };
            if let Err(e) = set(Some(Duration::from_micros(150))) {
                eprintln!("sched_setattr refused here ({e}): nothing to check");
                return;
            }
            assert_eq!(shown(), Some(Duration::from_micros(150)));
            set(None).expect("sched_setattr");
            assert_eq!(shown(), Some(default));
        })
        .join()
        .unwrap();
    }
}
