//! The open-file limit, raised to the hard one at start, and how it is shared
//! between the process itself, HTTP connections and engines.
//!
//! Decides numbers only; the ingest threads and the listeners enforce them.

/// Descriptors a registered engine holds: its SUB socket's mailbox and connection.
pub const ENGINE_FDS: u64 = 2;

/// How the open-file limit is shared: a reserve for the process itself (executors'
/// io_uring, ingest wake-ups, ZMQ's own threads, a replay socket per ingest thread,
/// logs, snapshots), HTTP connections, and engines at [`ENGINE_FDS`] each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptors {
    /// The soft open-file limit kvix runs under.
    pub nofile: u64,
    pub http_per_core: usize,
    pub engines: usize,
}

impl Descriptors {
    /// Split `nofile`. Unset (0) flags get the defaults: an eighth of what is left
    /// after the reserve for HTTP, the rest for engines.
    pub fn plan(
        nofile: u64,
        executors: usize,
        ingest_threads: usize,
        max_connections: usize,
        max_engines: usize,
    ) -> Descriptors {
        let executors = executors.max(1);
        let reserve = 64 + 16 * (executors + ingest_threads) as u64;
        let free = nofile.saturating_sub(reserve);
        let http_per_core = match max_connections {
            0 => ((free / 8) as usize / executors).max(1),
            n => n,
        };
        let left = free.saturating_sub((http_per_core * executors) as u64);
        let fit = (left / ENGINE_FDS) as usize;
        let engines = match max_engines {
            0 => fit,
            n if n > fit => {
                tracing::warn!(
                    nofile,
                    "--max-engines {n} needs more descriptors than the open-file limit leaves; using {fit}"
                );
                fit
            }
            n => n,
        };
        Descriptors {
            nofile,
            http_per_core,
            engines,
        }
    }
}

/// Raise the soft open-file limit to the hard one (each engine and connection
/// holds descriptors), saying so; returns the limit kvix runs under.
pub fn raise_open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    // No kernel opens more than 2^20 (fs.nr_open's default); a higher hard limit
    // (infinity) would size tables for nothing.
    let want = lim.rlim_max.min(1 << 20);
    if lim.rlim_cur < want {
        let before = lim.rlim_cur;
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads only the struct we pass; a soft limit up to the hard
        // one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::info!(
                from = before,
                to = want,
                "raised the soft open-file limit to the hard one"
            );
            return want;
        }
    }
    lim.rlim_cur.min(1 << 20)
}
