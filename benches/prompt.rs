//! Tokenization cost of a text `/query`: a 1k-token prompt, and the same text as
//! chat messages (template render + encode), through `kvix::prompt` as the handler
//! runs it.
//!
//! The tokenizer is byte-level BPE (GPT-2's pre-tokenizer regex, as Llama 3's and
//! most current models' are), 32k merges trained here on this repository's own text,
//! so the bench needs no download; `KVIX_BENCH_TOKENIZER=PATH` (a tokenizer.json or
//! its directory) measures a real model's instead. Besides criterion's wall times it
//! prints the median thread CPU time per call, the steadier figure on a shared machine.
//! Run: `cargo bench --bench prompt`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvix::prompt::{Prompts, Text};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};

const TOKENS: usize = 1024;

/// ChatML, as Qwen's and many other templates write it.
const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + \
                      m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}\
                      {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Every text file of the repository that is prose or code: the training corpus and
/// the prompt text.
fn corpus() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = rd.filter_map(|e| Some(e.ok()?.path())).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs" || e == "md") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    walk(&root.join("src"), &mut out);
    out
}

/// Under `cargo test` (no `--bench`) each function runs once as a smoke test, in a
/// debug build: a small vocabulary from the two documents and no CPU-time rounds
/// keep that to seconds.
fn smoke_test() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// A directory holding the tokenizer (trained here unless `KVIX_BENCH_TOKENIZER`
/// names one) and a ChatML template beside it.
fn tokenizer_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvix-bench-prompt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokenizer.json");
    match std::env::var_os("KVIX_BENCH_TOKENIZER").map(PathBuf::from) {
        Some(p) if p.is_dir() => std::fs::copy(p.join("tokenizer.json"), &file).map(drop),
        Some(p) => std::fs::copy(p, &file).map(drop),
        None => {
            let mut trainer = BpeTrainerBuilder::new()
                .vocab_size(if smoke_test() { 2_000 } else { 32_000 })
                .min_frequency(2)
                .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
                .special_tokens(vec![
                    AddedToken::from("<|im_start|>", true),
                    AddedToken::from("<|im_end|>", true),
                ])
                .build();
            let mut tk = TokenizerBuilder::new()
                .with_model(BPE::default())
                .with_normalizer(None::<tokenizers::NormalizerWrapper>)
                .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
                .with_post_processor(Some(ByteLevel::new(false, true, true)))
                .with_decoder(Some(ByteLevel::new(false, true, true)))
                .build()
                .unwrap();
            let files = corpus()
                .iter()
                .take(if smoke_test() { 2 } else { usize::MAX })
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            tk.train_from_files(&mut trainer, files).unwrap();
            tk.save(&file, false).map_err(std::io::Error::other)
        }
    }
    .unwrap();
    let config = serde_json::json!({"chat_template": CHATML, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// Corpus text that encodes to about `TOKENS` tokens.
fn prompt_text(prompts: &Prompts) -> String {
    let text: String = corpus()
        .iter()
        .take(2)
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let m = prompts
        .model_for("m", &Text::Prompt(String::new()))
        .unwrap();
    // Halve the slice until it fits, then grow it line by line.
    let encode = |s: &str| m.encode(&Text::Prompt(s.to_string())).unwrap().len();
    let mut end = text.len();
    while encode(&text[..end]) > TOKENS {
        end = text.floor_char_boundary(end / 2);
    }
    for line in text[end..].split_inclusive('\n') {
        if encode(&text[..end + line.len()]) > TOKENS {
            break;
        }
        end += line.len();
    }
    text[..end].to_string()
}

/// This thread's CPU time: on a machine shared with other work, what an encode
/// occupies a core for, which wall time overstates when the core is taken away.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Median CPU time of `f` over rounds of 100 calls, per call.
fn cpu_per_call(mut f: impl FnMut()) -> Duration {
    let mut rounds: Vec<Duration> = (0..20)
        .map(|_| {
            let t0 = thread_cpu();
            for _ in 0..100 {
                f();
            }
            (thread_cpu() - t0) / 100
        })
        .collect();
    rounds.sort();
    rounds[rounds.len() / 2]
}

fn bench_tokenize(c: &mut Criterion) {
    let dir = tokenizer_dir();
    let prompts = Prompts::load(&[format!("m={}", dir.display())]).unwrap();
    let text = prompt_text(&prompts);
    let prompt = Text::Prompt(text.clone());
    let m = prompts.model_for("m", &prompt).unwrap();
    let n = m.encode(&prompt).unwrap().len();
    eprintln!(
        "prompt: {} bytes, {n} tokens ({})",
        text.len(),
        std::env::var("KVIX_BENCH_TOKENIZER").unwrap_or_else(|_| "trained here".into())
    );
    // The same text in four messages.
    let quarter = text.floor_char_boundary(text.len() / 4);
    let half = text.floor_char_boundary(text.len() / 2);
    let three = text.floor_char_boundary(3 * text.len() / 4);
    let messages = serde_json::json!([
        {"role": "system", "content": &text[..quarter]},
        {"role": "user", "content": &text[quarter..half]},
        {"role": "assistant", "content": &text[half..three]},
        {"role": "user", "content": &text[three..]},
    ]);
    let chat = Text::Messages {
        messages: serde_json::from_value(messages).unwrap(),
        add_generation_prompt: true,
    };

    eprintln!("messages: {} tokens", m.encode(&chat).unwrap().len());
    if !smoke_test() {
        eprintln!(
            "thread CPU time per call: encode {:?}, chat render and encode {:?}",
            cpu_per_call(|| drop(black_box(m.encode(&prompt).unwrap()))),
            cpu_per_call(|| drop(black_box(m.encode(&chat).unwrap()))),
        );
    }

    let mut g = c.benchmark_group("prompt");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("encode_1k_tokens", |b| {
        b.iter(|| m.encode(black_box(&prompt)).unwrap())
    });
    g.bench_function("chat_render_and_encode_1k_tokens", |b| {
        b.iter(|| m.encode(black_box(&chat)).unwrap())
    });
    g.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, bench_tokenize);
criterion_main!(benches);
