//! Text prompts end to end: the real binary started with `--tokenizer` on files this
//! test writes, blocks stored over real ZMQ, and `/query` with `prompt` or `messages`
//! answering exactly as `/query` with the same token ids; then the errors.

use crate::support::{self, Server, dir_with, error, kvix_bin, publishers, register, stored};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BOS: u32 = 1;
const EOS: u32 = 2;
const USER: u32 = 3;
const ASSISTANT: u32 = 4;

/// The tests' tokenizer (common/tokenizer.rs), without truncation.
fn tokenizer_json() -> String {
    support::tokenizer::tokenizer_json(Value::Null)
}

/// A Hugging Face style chat template: BOS from the config, Python's `.strip()`,
/// `raise_exception`, `add_generation_prompt`.
const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}\
{% if m['role'] == 'tool' %}{{ raise_exception('no tool messages here') }}{% endif %}\
<|{{ m['role'] }}|> {{ m['content'].strip() }} {{ eos_token }}{% endfor %}\
{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// kvix with a tokenizer and chat template for model `m` and a plain tokenizer (no
/// template) for `plain`; the two tokenizer directories, to remove at the end.
fn start_with_tokenizers() -> (Server, [PathBuf; 2]) {
    let chat = dir_with(
        "chat",
        &[
            ("tokenizer.json", tokenizer_json()),
            (
                "tokenizer_config.json",
                json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": TEMPLATE})
                    .to_string(),
            ),
        ],
    );
    let plain = dir_with("plain", &[("tokenizer.json", tokenizer_json())]);
    let s = Server::start(&[
        "--threads",
        "2",
        "--tokenizer",
        &format!("m={}", chat.display()),
        // A file rather than its directory; no chat template beside it.
        "--tokenizer",
        &format!("plain={}", plain.join("tokenizer.json").display()),
    ]);
    (s, [chat, plain])
}

#[test]
fn prompts_and_messages_answer_as_their_token_ids() {
    let (s, dirs) = start_with_tokenizers();
    let ctx = zmq::Context::new();
    let [mut w1, mut w2, mut w3] = publishers(&ctx);
    register(&s, "m", 1, &w1);
    register(&s, "m", 2, &w2);
    register(&s, "other", 3, &w3);

    // "t10 … t16" encodes, with the tokenizer's BOS, to these 8 ids: two blocks.
    let prompt = "t10 t11 t12\n t13  t14 t15 t16";
    let prompt_ids: Vec<u32> = [BOS].into_iter().chain(10..=16).collect();
    // The template writes BOS itself; nothing is added to the rendered text.
    let messages = json!([
        {"role": "user", "content": " t20 t21 t22 "},
        {"role": "assistant", "content": "t23 t24"},
    ]);
    let chat_ids = vec![
        BOS, USER, 20, 21, 22, EOS, ASSISTANT, 23, 24, EOS, ASSISTANT,
    ];
    w1.send(&stored(&[11, 12], None, &prompt_ids, 4));
    w1.send(&stored(&[13, 14], None, &chat_ids[..8], 4));
    w2.send(&stored(&[21], None, &prompt_ids[..4], 4));
    w3.send(&stored(&[31], None, &prompt_ids[..4], 4));

    s.wait_scores(
        &json!({"token_ids": prompt_ids, "model_name": "m"}),
        &json!({"1": {"0": 8}, "2": {"0": 4}}),
    );
    // In each API: `/query`, the conductor's shape, llm-d scoring.
    for (path, ids, text) in [
        (
            "/query",
            json!({"token_ids": prompt_ids, "model_name": "m"}),
            json!({"prompt": prompt, "model_name": "m"}),
        ),
        (
            "/conductor/query",
            json!({"token_ids": prompt_ids, "model": "m"}),
            json!({"prompt": prompt, "model": "m"}),
        ),
        (
            "/query",
            json!({"token_ids": prompt_ids, "model_name": "m", "scoring": "llm-d"}),
            json!({"prompt": prompt, "model_name": "m", "scoring": "llm-d"}),
        ),
    ] {
        answers_alike(&s, path, &ids, &text);
    }

    let chat_by_ids = json!({"token_ids": chat_ids, "model_name": "m"});
    s.wait_scores(&chat_by_ids, &json!({"1": {"0": 8}}));
    answers_alike(
        &s,
        "/query",
        &chat_by_ids,
        &json!({"messages": messages, "model_name": "m"}),
    );
    answers_alike(
        &s,
        "/query",
        &json!({"token_ids": chat_ids[..chat_ids.len() - 1], "model_name": "m"}),
        &json!({"messages": messages, "model_name": "m", "add_generation_prompt": false}),
    );

    refusals(&s, prompt, &prompt_ids, &messages);
    let log = s.stop();
    assert!(log.contains("tokenizers loaded"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    for d in dirs {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `path` answers `text` (a prompt or messages) as it answers `ids`.
fn answers_alike(s: &Server, path: &str, ids: &Value, text: &Value) {
    let want = s.post_ok(path, ids);
    assert_eq!(s.post_ok(path, text), want, "{path} {text}");
}

/// A model without a tokenizer, or without a chat template, a template's own
/// refusal, two inputs or none: 422 naming the field. A tokenizer but no index: 404.
fn refusals(s: &Server, prompt: &str, prompt_ids: &[u32], messages: &Value) {
    let (st, field, msg) = error(
        s,
        "/query",
        &json!({"prompt": prompt, "model_name": "other"}),
    );
    assert_eq!((st, field.as_str()), (422, "prompt"), "{msg}");
    assert!(msg.contains("--tokenizer other=PATH"), "{msg}");
    let (st, field, _) = error(
        s,
        "/query",
        &json!({"messages": messages, "model": "other"}),
    );
    assert_eq!((st, field.as_str()), (422, "messages"));
    let (st, field, msg) = error(
        s,
        "/query",
        &json!({"messages": messages, "model_name": "plain"}),
    );
    assert_eq!((st, field.as_str()), (422, "messages"), "{msg}");
    assert!(msg.contains("no chat template"), "{msg}");
    let tool = json!([{"role": "tool", "content": "t10"}]);
    let (st, field, msg) = error(s, "/query", &json!({"messages": tool, "model_name": "m"}));
    assert_eq!((st, field.as_str()), (422, "messages"), "{msg}");
    assert!(msg.contains("no tool messages here"), "{msg}");
    let both = json!({"prompt": prompt, "token_ids": prompt_ids, "model_name": "m"});
    assert_eq!(error(s, "/query", &both).1, "prompt");
    let none = json!({"model_name": "m"});
    assert_eq!(error(s, "/query", &none).1, "token_ids");
    let (st, _, msg) = error(
        s,
        "/query",
        &json!({"prompt": prompt, "model_name": "plain"}),
    );
    assert_eq!(st, 404, "{msg}");
}

/// Run kvix with `args` and `env`, expecting it to exit by itself: (code, stderr).
fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let log =
        std::env::temp_dir().join(format!("kvix-prompts-exit-{}-{n}.log", std::process::id()));
    let mut child = Command::new(kvix_bin())
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kvix {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(log);
    (code, text)
}

#[test]
fn a_bad_tokenizer_stops_kvix_with_a_message() {
    let d = dir_with("bad", &[("junk.json", "{\"model\": 1}".into())]);
    let missing = d.join("nowhere").join("tokenizer.json");
    let (code, err) = run_to_exit(&["--tokenizer", &format!("m={}", missing.display())], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--tokenizer") && err.contains("cannot read") && err.contains("nowhere"),
        "{err}"
    );
    // Through the environment, like every flag.
    let junk = format!("m={}", d.join("junk.json").display());
    let (code, err) = run_to_exit(&[], &[("KVIX_TOKENIZER", &junk)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a Hugging Face tokenizer.json"), "{err}");
    let (code, err) = run_to_exit(&["--tokenizer", "just-a-path"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected MODEL=PATH"), "{err}");
    std::fs::remove_dir_all(d).unwrap();
}
