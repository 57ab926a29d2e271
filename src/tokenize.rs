//! The tokenizing pool: a text prompt's token ids, computed on threads of its own.
//!
//! Owns a fixed set of worker threads, the bounded queue in front of them and the
//! one-shot completion a request awaits ([`Pending`]). Tokenizing is CPU work in
//! proportion to the text (README, "Text prompts"), so it runs neither on an executor
//! nor on the threads control calls (`/register`, `/metrics`, ...) run on, which a
//! flood of long prompts would otherwise hold up. The workers are not pinned to a
//! core and run at a lower CPU priority than the executors. A full queue refuses at
//! once ([`PromptError::Busy`]); a job whose requester went away before a worker took
//! it is dropped unrun, and the result of one that was running is thrown away.
//! Never blocks the submitter (an executor), never touches the index.

use crate::prompt::{Caps, Model, PromptError, Text};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use futures_channel::oneshot;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

/// How the pool is sized and what one prompt may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Worker threads (`--tokenize-threads`).
    pub threads: usize,
    /// Jobs that may wait for a worker (`--tokenize-queue`).
    pub queue: usize,
    /// `--max-prompt-chars`, `--max-prompt-tokens`.
    pub caps: Caps,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            threads: 1,
            queue: 32,
            caps: Caps {
                max_chars: 1 << 20,
                max_tokens: 1 << 18,
            },
        }
    }
}

/// What became of the jobs offered to the pool (`kvix_tokenize_jobs_total`).
#[derive(Debug, Default)]
pub struct Stats {
    /// Tokenized and answered.
    pub done: AtomicU64,
    /// Refused: the queue was full (429).
    pub busy: AtomicU64,
    /// Refused over a cap (413): a prompt's characters before it is queued, a
    /// rendered chat's characters or the token count on a worker.
    pub too_long: AtomicU64,
    /// Its requester went away before a worker took it: never run.
    pub dropped: AtomicU64,
    /// Its requester went away while it ran: the result was thrown away.
    pub discarded: AtomicU64,
}

impl Stats {
    /// `(outcome, count)` per outcome, as `/metrics` labels them.
    pub fn outcomes(&self) -> [(&'static str, u64); 5] {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("done", r(&self.done)),
            ("busy", r(&self.busy)),
            ("too_long", r(&self.too_long)),
            ("dropped", r(&self.dropped)),
            ("discarded", r(&self.discarded)),
        ]
    }
}

type Answer = Result<Vec<u32>, PromptError>;

struct Job {
    model: Arc<Model>,
    text: Text,
    done: oneshot::Sender<Answer>,
}

/// The pool. Without threads (no `--tokenizer`), every submission is refused.
pub struct Pool {
    jobs: Option<Sender<Job>>,
    limits: Limits,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Pool {
    /// Start `limits.threads` workers (none when `limits.threads` is 0).
    pub fn start(limits: Limits) -> std::io::Result<Pool> {
        let stats = Arc::new(Stats::default());
        if limits.threads == 0 {
            return Ok(Pool {
                jobs: None,
                limits,
                stats,
            });
        }
        let (tx, rx) = crossbeam_channel::bounded(limits.queue.max(1));
        for i in 0..limits.threads {
            let (rx, stats) = (rx.clone(), stats.clone());
            std::thread::Builder::new()
                .name(format!("kvix-tokenize-{i}"))
                .spawn(move || work(rx, stats, limits.caps))?;
        }
        Ok(Pool {
            jobs: Some(tx),
            limits,
            stats,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Jobs waiting for a worker now.
    pub fn queued(&self) -> usize {
        self.jobs.as_ref().map_or(0, Sender::len)
    }

    /// Queue `text` for `model`'s tokenizer. A prompt over `--max-prompt-chars` and a
    /// full queue are refused at once. Never blocks: the caller awaits the answer.
    pub fn submit(&self, model: Arc<Model>, text: Text) -> Result<Pending, PromptError> {
        if let Text::Prompt(p) = &text
            && let Err(e) = self.limits.caps.check_chars(p, "prompt")
        {
            self.stats.too_long.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let busy = || {
            self.stats.busy.fetch_add(1, Ordering::Relaxed);
            PromptError::Busy {
                queued: self.queued(),
            }
        };
        let jobs = self.jobs.as_ref().ok_or_else(busy)?;
        let (done, answer) = oneshot::channel();
        match jobs.try_send(Job { model, text, done }) {
            Ok(()) => Ok(Pending(answer)),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(busy()),
        }
    }
}

/// A submitted job's answer. Dropping it before it resolves withdraws the job: a
/// worker that has not taken it yet drops it.
pub struct Pending(oneshot::Receiver<Answer>);

impl Future for Pending {
    type Output = Answer;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        Pin::new(&mut self.0).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(PromptError::Encode {
                    model: String::new(),
                    field: "prompt",
                    msg: "the tokenizing thread stopped".into(),
                })
            })
        })
    }
}

/// A worker: take jobs until the pool is gone. A job whose requester left is
/// dropped before any work on it.
fn work(jobs: Receiver<Job>, stats: Arc<Stats>, caps: Caps) {
    lower_priority();
    while let Ok(job) = jobs.recv() {
        if job.done.is_canceled() {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let (model, text) = (job.model, job.text);
        // A tokenizer that panics on some input fails that request, not the worker.
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            model.encode_within(&text, caps)
        }))
        .unwrap_or_else(|_| {
            Err(PromptError::Encode {
                model: model.name().to_string(),
                field: text.field(),
                msg: "the tokenizer panicked on this input".into(),
            })
        });
        // Freed here, on the worker, not on the executor that receives the ids.
        drop(text);
        // Counted before the answer goes, so whoever reads the answer sees it counted.
        let outcome = if job.done.is_canceled() {
            &stats.discarded
        } else if matches!(answer, Err(PromptError::TooLong { .. })) {
            &stats.too_long
        } else {
            &stats.done
        };
        outcome.fetch_add(1, Ordering::Relaxed);
        let _ = job.done.send(answer);
    }
}

/// How much lower than the rest of kvix a worker runs: the executors and control
/// threads get the CPU first when both want it.
const NICE: libc::c_int = 10;

/// Lower the calling thread's CPU priority (Linux keeps a nice value per thread).
fn lower_priority() {
    // SAFETY: gettid and setpriority take and return plain integers; raising the
    // calling thread's own nice value needs no privilege and touches no memory.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE)
    };
    if r != 0 {
        tracing::debug!(
            "tokenizing thread keeps its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer: `tN` is id N.
    fn model() -> Arc<Model> {
        let vocab: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|n| (format!("t{n}"), n.into()))
            .chain([("[UNK]".to_string(), 100.into())])
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        });
        let dir = std::env::temp_dir().join(format!("kvix-tokenize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
        let p = crate::prompt::Prompts::load(&[format!("m={}", dir.display())]).unwrap();
        p.model_for("m", &Text::Prompt(String::new())).unwrap()
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        futures_lite::future::block_on(f)
    }

    #[test]
    fn a_prompt_is_tokenized_within_its_caps() {
        let caps = Caps {
            max_chars: 12,
            max_tokens: 2,
        };
        let pool = Pool::start(Limits {
            threads: 1,
            queue: 4,
            caps,
        })
        .unwrap();
        let ids = block_on(pool.submit(model(), Text::Prompt("t1 t2".into())).unwrap());
        assert_eq!(ids.unwrap(), vec![1, 2]);
        // Over the character cap: refused before it is queued.
        let e = pool
            .submit(model(), Text::Prompt("t1 t2 t3 t4 t5".into()))
            .err()
            .unwrap();
        assert!(
            matches!(e, PromptError::TooLong { unit: "chars", .. }),
            "{e}"
        );
        // Within it, over the token cap: refused once encoded.
        let e = block_on(
            pool.submit(model(), Text::Prompt("t1 t2 t3".into()))
                .unwrap(),
        );
        assert!(matches!(
            e,
            Err(PromptError::TooLong {
                unit: "tokens",
                len: 3,
                ..
            })
        ));
        let s = pool.stats().outcomes();
        assert_eq!(s[0], ("done", 1));
        assert_eq!(s[2], ("too_long", 2));
    }

    #[test]
    fn a_full_queue_refuses_and_withdrawn_jobs_are_dropped_unrun() {
        let long = (0..200_000)
            .map(|i| format!("t{} ", i % 100))
            .collect::<String>();
        let pool = Pool::start(Limits {
            threads: 1,
            queue: 2,
            caps: Caps::NONE,
        })
        .unwrap();
        // Fill the worker and the queue, then one more: refused.
        let mut waiting = Vec::new();
        let refused =
            (0..20).find_map(|_| match pool.submit(model(), Text::Prompt(long.clone())) {
                Ok(p) => {
                    waiting.push(p);
                    None
                }
                Err(e) => Some(e),
            });
        assert!(matches!(refused, Some(PromptError::Busy { .. })));
        // Withdraw everything: what no worker took is never run.
        let submitted = waiting.len() as u64;
        // On a loaded machine the one worker may finish a job while the queue fills.
        let done_before = pool.stats().done.load(Ordering::Relaxed);
        drop(waiting);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let s = pool.stats();
            let ended = s.done.load(Ordering::Relaxed)
                + s.dropped.load(Ordering::Relaxed)
                + s.discarded.load(Ordering::Relaxed);
            if ended == submitted {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "jobs never ended");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(pool.stats().dropped.load(Ordering::Relaxed) >= 1);
        // After the withdrawal only the job in the worker's hands may still finish.
        assert!(pool.stats().done.load(Ordering::Relaxed) - done_before <= 1);
    }
}
