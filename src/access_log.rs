//! The access log (`--access-log`): one JSON line per HTTP request, as Dynamo 1.6
//! writes it (`ts`, `trace_id`, `method`, `path`, `model`, `status`, `duration_ms`).
//!
//! Owns the bounded queue of finished requests, the thread that formats and writes
//! them, and the file (reopened on request, for logrotate). An executor only pushes
//! onto the lock-free queue and never waits: when the writer is behind by
//! [`QUEUE_LINES`] lines the line is dropped and counted. Everything costly (the
//! timestamp, the model out of the body, JSON, the write) happens on the writer
//! thread. Never touches the index.

use bytes::Bytes;
use crossbeam_queue::ArrayQueue;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

/// Lines that may wait for the writer; one more is dropped (counted).
pub const QUEUE_LINES: usize = 16 * 1024;
/// Request bodies the waiting lines may hold (for their `model`); past it a line
/// keeps its request's figures but not the body, and logs its model as `-`.
pub const QUEUE_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Longest model name logged, in bytes; a longer one is cut (at a character).
const MAX_MODEL: usize = crate::registry::MAX_NAME_BYTES;

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Longest trace id logged, in bytes; a longer one is cut.
const MAX_TRACE_ID: usize = 256;
/// How long the writer sleeps with nothing to write before it looks again (a push
/// onto an empty queue wakes it at once).
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// One finished request, as the executor hands it over.
pub struct Request {
    pub at: SystemTime,
    /// The trace header's value, if the request had one.
    pub trace_id: Option<hyper::header::HeaderValue>,
    pub method: hyper::Method,
    /// The route matched (with its `/conductor` prefix); `None`: no route.
    pub route: Option<(&'static str, bool)>,
    /// The request body (a reference to the bytes read, not a copy), for `model`.
    pub body: Bytes,
    pub status: u16,
    pub duration: Duration,
}

/// How to open the log.
#[derive(Clone, Debug)]
pub struct Settings {
    pub path: PathBuf,
    /// Request header whose value is the line's `trace_id` (`--trace-id-header`).
    pub trace_header: hyper::header::HeaderName,
    /// Timestamps in local time with its offset instead of UTC (`--access-log-local-time`).
    pub local_time: bool,
}

/// The log: its queue, counters and file.
pub struct AccessLog {
    settings: Settings,
    queue: ArrayQueue<Request>,
    /// Body bytes held by the queued lines.
    held: AtomicUsize,
    written: AtomicU64,
    dropped: AtomicU64,
    file: Mutex<std::fs::File>,
    writer: OnceLock<std::thread::Thread>,
    /// Joined at shutdown, so that every queued line is written before the process ends.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: AtomicBool,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("settings", &self.settings)
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

/// The body fields that name a model (Dynamo's, Mooncake's, llm-d's).
#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    model_name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    modelname: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct Line<'a> {
    ts: String,
    trace_id: &'a str,
    method: &'a str,
    path: Cow<'a, str>,
    model: &'a str,
    status: u16,
    duration_ms: f64,
}

/// The file, appended to. Unbuffered: the writer hands it whole batches.
fn open(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl AccessLog {
    /// Open (append to) the file and start the writer thread.
    pub fn start(settings: Settings) -> Result<Arc<AccessLog>, String> {
        let file = open(&settings.path)
            .map_err(|e| format!("--access-log {}: {e}", settings.path.display()))?;
        let log = Arc::new(AccessLog {
            settings,
            queue: ArrayQueue::new(QUEUE_LINES),
            held: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            file: Mutex::new(file),
            writer: OnceLock::new(),
            thread: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let me = log.clone();
        let t = std::thread::Builder::new()
            .name("kvix-access-log".into())
            .spawn(move || me.run())
            .map_err(|e| format!("access log thread: {e}"))?;
        let _ = log.writer.set(t.thread().clone());
        *log.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        Ok(log)
    }

    pub fn trace_header(&self) -> &hyper::header::HeaderName {
        &self.settings.trace_header
    }

    /// Hand a finished request to the writer; never waits. A full queue drops it.
    pub fn push(&self, mut r: Request) {
        let len = r.body.len();
        if self.held.fetch_add(len, Ordering::Relaxed) + len > QUEUE_BODY_BYTES {
            self.held.fetch_sub(len, Ordering::Relaxed);
            r.body = Bytes::new();
        }
        let len = r.body.len();
        match self.queue.push(r) {
            Ok(()) => {
                // The writer drains the queue before it sleeps: only a push onto an
                // empty queue may find it asleep (a missed wake-up costs IDLE_WAIT).
                if self.queue.len() == 1
                    && let Some(w) = self.writer.get()
                {
                    w.unpark();
                }
            }
            Err(_) => {
                self.held.fetch_sub(len, Ordering::Relaxed);
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Lines written and dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.written.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    /// Close the file and open its path again (after logrotate moved it): what is
    /// written from now on goes to a file at the path. Blocks on the file; call it
    /// off the executors.
    pub fn reopen(&self) -> Result<(), String> {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        *f = open(&self.settings.path)
            .map_err(|e| format!("cannot reopen {}: {e}", self.settings.path.display()))?;
        Ok(())
    }

    /// Write what is queued, then stop the writer and wait for it (at shutdown).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.writer.get() {
            w.unpark();
        }
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    fn run(&self) {
        let mut text = Vec::with_capacity(64 * 1024);
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            // Lines in `text`, counted written or dropped once their write ends.
            let mut n = 0u64;
            while let Some(r) = self.queue.pop() {
                self.held.fetch_sub(r.body.len(), Ordering::Relaxed);
                self.format(&r, &mut text);
                n += 1;
                if text.len() >= 64 * 1024 {
                    self.write(&mut text, n);
                    n = 0;
                }
            }
            if n > 0 {
                self.write(&mut text, n);
            }
            if stopping {
                return;
            }
            std::thread::park_timeout(IDLE_WAIT);
        }
    }

    /// Write `text` (its `lines` lines) and count them written, or dropped when the
    /// write fails (a full or failing disk): lost lines are never counted written.
    /// The file has no buffer of its own, so nothing of a failed write stays
    /// behind to be written (and counted) later.
    fn write(&self, text: &mut Vec<u8>, lines: u64) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        match f.write_all(text) {
            Ok(()) => self.written.fetch_add(lines, Ordering::Relaxed),
            Err(e) => {
                crate::warn_throttled!(
                    path = %self.settings.path.display(),
                    lines,
                    "access log write failed, lines dropped: {e}"
                );
                self.dropped.fetch_add(lines, Ordering::Relaxed)
            }
        };
        text.clear();
    }

    /// Append `r`'s line to `out`.
    fn format(&self, r: &Request, out: &mut Vec<u8>) {
        // As Dynamo's: a value that is not visible ASCII is no trace id.
        let trace = r
            .trace_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(|t| &t[..t.len().min(MAX_TRACE_ID)]);
        let named = serde_json::from_slice::<Named<'_>>(&r.body).ok();
        let model = named.as_ref().and_then(|n| {
            n.model_name
                .as_ref()
                .or(n.model.as_ref())
                .or(n.modelname.as_ref())
        });
        let path = match r.route {
            Some((p, true)) => Cow::Owned(format!("/conductor{p}")),
            Some((p, false)) => Cow::Borrowed(p),
            None => Cow::Borrowed("unknown"),
        };
        let line = Line {
            ts: timestamp(r.at, self.settings.local_time),
            trace_id: trace.unwrap_or("-"),
            method: r.method.as_str(),
            path,
            model: model.map_or("-", |m| cut(m, MAX_MODEL)),
            status: r.status,
            duration_ms: (r.duration.as_secs_f64() * 1e6).round() / 1e3,
        };
        // Serializing plain fields into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &line);
        out.push(b'\n');
    }
}

/// RFC 3339 with milliseconds: UTC as `Z`, local time with its offset.
fn timestamp(at: SystemTime, local: bool) -> String {
    use chrono::SecondsFormat::Millis;
    if local {
        chrono::DateTime::<chrono::Local>::from(at).to_rfc3339_opts(Millis, false)
    } else {
        chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(Millis, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &str, trace: Option<&str>) -> Request {
        Request {
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_252_849_123),
            trace_id: trace.map(|t| t.parse().unwrap()),
            method: hyper::Method::POST,
            route: Some(("/query", false)),
            body: Bytes::copy_from_slice(body.as_bytes()),
            status: 200,
            duration: Duration::from_micros(1234),
        }
    }

    /// A log in a folder of its own (kept while the log is used).
    fn started(local_time: bool) -> (tempfile::TempDir, Arc<AccessLog>) {
        let dir = tempfile::tempdir().unwrap();
        let log = AccessLog::start(Settings {
            path: dir.path().join("a.log"),
            trace_header: "x-trace-id".parse().unwrap(),
            local_time,
        })
        .unwrap();
        (dir, log)
    }

    fn line(log: &AccessLog, r: &Request) -> serde_json::Value {
        let mut out = Vec::new();
        log.format(r, &mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn lines_carry_dynamos_fields() {
        let (_dir, log) = started(false);
        let v = line(
            &log,
            &request(r#"{"token_ids": [1, 2], "model_name": "m"}"#, Some("t-1")),
        );
        assert_eq!(
            v,
            serde_json::json!({"ts": "2025-11-27T14:14:09.123Z", "trace_id": "t-1",
                "method": "POST", "path": "/query", "model": "m", "status": 200,
                "duration_ms": 1.234})
        );
        let mut r = request(r#"{"modelname": "c"}"#, None);
        r.route = Some(("/query", true));
        let v = line(&log, &r);
        assert_eq!((&v["model"], &v["trace_id"]), (&"c".into(), &"-".into()));
        assert_eq!(v["path"], "/conductor/query");
        // No body, a body that is not JSON: no model; no route: unknown.
        for body in ["", "{not json"] {
            let mut r = request(body, None);
            r.route = None;
            let v = line(&log, &r);
            assert_eq!((&v["model"], &v["path"]), (&"-".into(), &"unknown".into()));
        }
        log.shutdown();
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (_dir, log) = started(true);
        // Stop the writer first so that nothing is taken off the queue.
        log.shutdown();
        for _ in 0..QUEUE_LINES + 3 {
            log.push(request("{}", None));
        }
        assert_eq!(log.counts().1, 3);
        let ts = timestamp(SystemTime::now(), true);
        assert!(chrono::DateTime::parse_from_rfc3339(&ts).is_ok(), "{ts}");
        assert_eq!(ts.len(), "2025-11-27T14:14:09.123+00:00".len(), "{ts}");
    }

    #[test]
    fn a_long_model_is_cut_at_a_character() {
        let (_dir, log) = started(false);
        let model = format!("{}é", "m".repeat(MAX_MODEL - 1));
        let body = serde_json::json!({"model_name": model}).to_string();
        let v = line(&log, &request(&body, None));
        assert_eq!(v["model"], "m".repeat(MAX_MODEL - 1));
    }

    /// Lines whose write fails (a full disk: `/dev/full`) are dropped, never
    /// counted written.
    #[test]
    fn lines_a_failed_write_lost_are_counted_dropped() {
        let log = AccessLog::start(Settings {
            path: "/dev/full".into(),
            trace_header: "x-trace-id".parse().unwrap(),
            local_time: false,
        })
        .unwrap();
        for _ in 0..3 {
            log.push(request("{}", None));
        }
        log.shutdown();
        assert_eq!(log.counts(), (0, 3));
    }
}
