//! What kvix writes to stderr: the log's format, and the two guards every line that
//! carries network input goes through.
//!
//! - Escaping: in the text format, every field value and message is written with its
//!   control characters escaped (`\n`, `\x1b`, line separators, bidi overrides), so a
//!   topic, a pod name or an error that quotes a publisher's bytes can neither start
//!   a line of its own (a forged `ERROR`) nor drive the terminal. The JSON format
//!   escapes by itself.
//! - Throttling: a warning a frame or an event can cause is written at most once per
//!   [`THROTTLE_INTERVAL`] at each call site ([`warn_throttled!`]), with the count of
//!   those left out since, so a flood of bad frames costs a few lines, not one each.
//!
//! Never on the hot path's normal case: only code that is already logging pays.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing_subscriber::field::MakeExt;

/// At most one line per call site of [`warn_throttled!`] in this long.
pub const THROTTLE_INTERVAL: Duration = Duration::from_secs(10);

/// Install the process's subscriber: `json`, or text with escaped values (ANSI colours
/// when stderr is a terminal). `RUST_LOG` filters, `info` by default.
pub fn init(format: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        logs.json().init();
        return;
    }
    let fields = tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let name = field.name();
        if name.starts_with("log.") {
            // Where a `log` record came from: the formatter prints its target.
            return Ok(());
        }
        let raw = format!("{value:?}");
        let text = escape(&raw);
        if name == "message" {
            w.write_str(&text)
        } else {
            write!(w, "{}={text}", name.trim_start_matches("r#"))
        }
    })
    .delimited(" ");
    logs.fmt_fields(fields)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// `s` with every character that could end a log line or steer a terminal written
/// as an escape: `\n`, `\r`, `\t`, other control characters as `\xNN` (C1 ones
/// included), line and paragraph separators and bidirectional overrides as `\u{..}`.
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    let risky = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}')
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    if !s.chars().any(risky) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if risky(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if risky(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// One call site's right to log: lock-free, shared by every thread that reaches it.
pub struct Throttle {
    /// Milliseconds since [`epoch`] before which the site stays quiet (0: never logged).
    quiet_until: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Throttle {
        Throttle {
            quiet_until: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(left out since the last line)` when this call may log, else `None` (and
    /// the call is counted as left out).
    pub fn admit(&self) -> Option<u64> {
        let now = epoch().elapsed().as_millis() as u64;
        let until = self.quiet_until.load(Ordering::Relaxed);
        let next = now.saturating_add(THROTTLE_INTERVAL.as_millis() as u64);
        if now >= until
            && self
                .quiet_until
                .compare_exchange(until, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// The process's clock origin for [`Throttle`]s.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `tracing::warn!` at most once per [`THROTTLE_INTERVAL`] from this call site, with a
/// `suppressed` field counting the calls left out since its last line.
#[macro_export]
macro_rules! warn_throttled {
    ($($arg:tt)+) => {{
        static THROTTLE: $crate::logs::Throttle = $crate::logs::Throttle::new();
        if let Some(suppressed) = THROTTLE.admit() {
            tracing::warn!(suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_line_breakers_are_escaped() {
        assert_eq!(escape("kv@pod@model"), "kv@pod@model");
        assert_eq!(
            escape("a\nERROR forged\r\t\u{1b}[31m\u{7f}\u{85}"),
            "a\\nERROR forged\\r\\t\\x1b[31m\\x7f\\x85"
        );
        assert_eq!(escape("x\u{2028}y\u{202e}z"), "x\\u{2028}y\\u{202e}z");
        assert_eq!(escape("日本語"), "日本語");
    }

    #[test]
    fn a_throttle_admits_once_per_interval_and_counts_the_rest() {
        let t = Throttle::new();
        assert_eq!(t.admit(), Some(0));
        for _ in 0..5 {
            assert_eq!(t.admit(), None);
        }
        // Time the interval out as if it had passed.
        t.quiet_until.store(0, Ordering::Relaxed);
        assert_eq!(t.admit(), Some(5));
        assert_eq!(t.admit(), None);
    }
}
