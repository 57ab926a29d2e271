//! Text prompts: model name → tokenizer (and chat template), text → token ids.
//!
//! Owns the `--tokenizer MODEL=PATH` table, loaded once at start from local Hugging
//! Face files (`tokenizer.json`; beside it, optionally, `tokenizer_config.json` and
//! `chat_template.jinja`), and turns a `/query`'s `prompt` or `messages` into the
//! token ids an engine serving that model would see:
//! - a plain prompt is encoded with the tokenizer's special tokens added (its
//!   post-processor's BOS and the like), as vLLM's completions API and llm-d's scorer
//!   encode a prompt;
//! - messages are rendered through the chat template as transformers'
//!   `apply_chat_template` renders them, and the text is encoded without adding
//!   special tokens, as vLLM's chat API does: the template writes its own BOS.
//!
//! Never downloads anything, never touches the index, and never runs on an
//! executor: encoding a long prompt is CPU work of its own (see [`Model::encode`]).

use minijinja::{Environment, ErrorKind, Value};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// The template's name inside its environment (appears in render errors).
const TEMPLATE: &str = "chat_template";

/// Special tokens transformers passes to a chat template, by their config keys.
const SPECIAL_TOKENS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// A `--tokenizer` that cannot be loaded: kvix does not start.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("`{0}`: expected MODEL=PATH")]
    Spec(String),
    #[error("model `{0}` is given more than once")]
    Duplicate(String),
    #[error("{model}: cannot read {}: {msg}", path.display())]
    Read {
        model: String,
        path: PathBuf,
        msg: String,
    },
    #[error("{model}: {} is not a Hugging Face tokenizer.json: {msg}", path.display())]
    Tokenizer {
        model: String,
        path: PathBuf,
        msg: String,
    },
    #[error("{model}: {}: {msg}", path.display())]
    Config {
        model: String,
        path: PathBuf,
        msg: String,
    },
    #[error("{model}: the chat template in {} does not compile: {msg}", path.display())]
    Template {
        model: String,
        path: PathBuf,
        msg: String,
    },
}

/// Why a query's text has no token ids. Each names the request field to blame.
#[derive(Debug, Error)]
pub enum PromptError {
    #[error("no tokenizer for model `{model}` (start kvix with --tokenizer {model}=PATH)")]
    NoTokenizer { model: String, field: &'static str },
    #[error(
        "model `{model}` has no chat template (tokenizer_config.json `chat_template` or \
         chat_template.jinja beside its tokenizer.json); send `prompt` or `token_ids`"
    )]
    NoChatTemplate { model: String },
    /// The template refused the messages (`raise_exception`) or could not render them.
    #[error("the chat template of `{model}` failed: {msg}")]
    Render { model: String, msg: String },
    #[error("the tokenizer of `{model}` failed: {msg}")]
    Encode {
        model: String,
        field: &'static str,
        msg: String,
    },
    /// Over `--max-prompt-chars` or `--max-prompt-tokens` (`unit`: `chars`, `tokens`).
    #[error(
        "`{field}` is {len} {unit} long; at most {max} are tokenized (--max-prompt-{unit}); \
         send token_ids for longer prompts"
    )]
    TooLong {
        field: &'static str,
        unit: &'static str,
        len: usize,
        max: usize,
    },
    /// Every tokenizing thread is busy and the queue in front of them is full.
    #[error(
        "{queued} prompts already wait to be tokenized (--tokenize-queue); retry later, or \
         send token_ids"
    )]
    Busy { queued: usize },
}

impl PromptError {
    /// The request field the error is about: `prompt` or `messages`.
    pub fn field(&self) -> &'static str {
        match self {
            PromptError::NoTokenizer { field, .. }
            | PromptError::Encode { field, .. }
            | PromptError::TooLong { field, .. } => field,
            PromptError::NoChatTemplate { .. } | PromptError::Render { .. } => "messages",
            PromptError::Busy { .. } => "prompt",
        }
    }
}

/// Chat messages as a request sends them: any JSON values, passed to the template
/// as they are (object keys in the order sent, as Python's dicts keep them).
#[derive(Deserialize)]
#[serde(transparent)]
pub struct Messages(Vec<Value>);

/// A query's text, for its model's tokenizer.
pub enum Text {
    Prompt(String),
    Messages {
        messages: Messages,
        /// End with the template's assistant header (vLLM's chat API default: true).
        add_generation_prompt: bool,
    },
}

impl Text {
    /// The request field that carried the text.
    pub fn field(&self) -> &'static str {
        match self {
            Text::Prompt(_) => "prompt",
            Text::Messages { .. } => "messages",
        }
    }
}

/// How long a text may be (`--max-prompt-chars`, `--max-prompt-tokens`): what one
/// prompt may cost a tokenizing thread, and the token ids it may produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub max_chars: usize,
    pub max_tokens: usize,
}

impl Caps {
    /// No cap (unit tests, benchmarks).
    pub const NONE: Caps = Caps {
        max_chars: usize::MAX,
        max_tokens: usize::MAX,
    };

    /// `s`, the text of `field`, is at most `max_chars` characters long.
    pub fn check_chars(&self, s: &str, field: &'static str) -> Result<(), PromptError> {
        // A string has at least as many bytes as characters: most texts need no count.
        if s.len() <= self.max_chars {
            return Ok(());
        }
        let len = s.chars().count();
        if len <= self.max_chars {
            return Ok(());
        }
        Err(PromptError::TooLong {
            field,
            unit: "chars",
            len,
            max: self.max_chars,
        })
    }

    fn check_tokens(&self, ids: &[u32], field: &'static str) -> Result<(), PromptError> {
        if ids.len() <= self.max_tokens {
            return Ok(());
        }
        Err(PromptError::TooLong {
            field,
            unit: "tokens",
            len: ids.len(),
            max: self.max_tokens,
        })
    }
}

/// Every model given by `--tokenizer`. Empty by default: text queries then get a
/// 422 naming their field.
#[derive(Default)]
pub struct Prompts {
    models: HashMap<String, Arc<Model>>,
}

impl std::fmt::Debug for Prompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompts")
            .field("models", &self.names())
            .finish()
    }
}

impl Prompts {
    /// Load every `MODEL=PATH` (PATH: a `tokenizer.json`, or a directory holding one).
    pub fn load(specs: &[String]) -> Result<Prompts, LoadError> {
        let mut models = HashMap::new();
        for spec in specs {
            let (name, path) = spec
                .split_once('=')
                .filter(|(m, p)| !m.trim().is_empty() && !p.trim().is_empty())
                .ok_or_else(|| LoadError::Spec(spec.clone()))?;
            let name = name.trim().to_string();
            if models.contains_key(&name) {
                return Err(LoadError::Duplicate(name));
            }
            let model = Model::load(&name, Path::new(path.trim()))?;
            models.insert(name, Arc::new(model));
        }
        Ok(Prompts { models })
    }

    /// Model names, sorted (for the startup log).
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.models.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The model that can turn `text` into token ids: it has a tokenizer and, for
    /// messages, a chat template. Cheap: callers check before the costlier steps.
    pub fn model_for(&self, model: &str, text: &Text) -> Result<Arc<Model>, PromptError> {
        let m = self
            .models
            .get(model)
            .ok_or_else(|| PromptError::NoTokenizer {
                model: model.to_string(),
                field: text.field(),
            })?;
        if matches!(text, Text::Messages { .. }) && m.chat.is_none() {
            return Err(PromptError::NoChatTemplate {
                model: model.to_string(),
            });
        }
        Ok(m.clone())
    }
}

/// One model's tokenizer and chat template.
pub struct Model {
    name: String,
    tokenizer: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.name)
            .field("chat_template", &self.chat.is_some())
            .finish()
    }
}

/// A compiled chat template and the special tokens it is rendered with.
struct ChatTemplate {
    env: Environment<'static>,
    special: BTreeMap<&'static str, Value>,
}

/// What of `tokenizer_config.json` matters here.
#[derive(Deserialize, Default)]
struct TokenizerConfig {
    chat_template: Option<ChatTemplates>,
    #[serde(flatten)]
    rest: HashMap<String, serde_json::Value>,
}

/// One template, or named ones (`default`, `tool_use`, ...) as newer configs list them.
#[derive(Deserialize)]
#[serde(untagged)]
enum ChatTemplates {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

impl Model {
    /// The model's name, as `--tokenizer` gave it.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn load(name: &str, path: &Path) -> Result<Model, LoadError> {
        let (file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (path.to_path_buf(), dir)
        };
        let read_err = |path: &Path, e: std::io::Error| LoadError::Read {
            model: name.into(),
            path: path.to_path_buf(),
            msg: e.to_string(),
        };
        let bytes = std::fs::read(&file).map_err(|e| read_err(&file, e))?;
        let mut tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::Tokenizer {
                model: name.into(),
                path: file.clone(),
                msg: e.to_string(),
            })?;
        // transformers encodes without the file's truncation or padding unless a call
        // asks for them; a truncated prompt would score only its head.
        tokenizer
            .with_truncation(None)
            .map_err(|e| LoadError::Tokenizer {
                model: name.into(),
                path: file.clone(),
                msg: e.to_string(),
            })?;
        tokenizer.with_padding(None);

        let config_path = dir.join("tokenizer_config.json");
        let config = match std::fs::read(&config_path) {
            Ok(b) => {
                serde_json::from_slice::<TokenizerConfig>(&b).map_err(|e| LoadError::Config {
                    model: name.into(),
                    path: config_path.clone(),
                    msg: e.to_string(),
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokenizerConfig::default(),
            Err(e) => return Err(read_err(&config_path, e)),
        };
        // transformers prefers a chat_template.jinja file to the config's template.
        let jinja_path = dir.join("chat_template.jinja");
        let (source, source_path) = match std::fs::read_to_string(&jinja_path) {
            Ok(s) => (Some(s), jinja_path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let s = match config.chat_template {
                    None => None,
                    Some(ChatTemplates::One(s)) => Some(s),
                    Some(ChatTemplates::Named(list)) => {
                        let default = list.into_iter().find(|t| t.name == "default");
                        Some(
                            default
                                .map(|t| t.template)
                                .ok_or_else(|| LoadError::Config {
                                    model: name.into(),
                                    path: config_path.clone(),
                                    msg: "`chat_template` lists no template named \"default\""
                                        .into(),
                                })?,
                        )
                    }
                };
                (s, config_path.clone())
            }
            Err(e) => return Err(read_err(&jinja_path, e)),
        };
        let chat =
            match source {
                None => None,
                Some(source) => Some(ChatTemplate::new(source, &config.rest).map_err(|e| {
                    LoadError::Template {
                        model: name.into(),
                        path: source_path,
                        msg: e.to_string(),
                    }
                })?),
            };
        Ok(Model {
            name: name.into(),
            tokenizer,
            chat,
        })
    }

    /// The token ids of `text`: CPU work in proportion to its length, for a caller
    /// to run off the executor.
    pub fn encode(&self, text: &Text) -> Result<Vec<u32>, PromptError> {
        self.encode_within(text, Caps::NONE)
    }

    /// [`Model::encode`] within `caps`: a prompt (or rendered chat) longer than
    /// `max_chars` is refused before it is encoded, and one that encodes to more than
    /// `max_tokens` ids after.
    pub fn encode_within(&self, text: &Text, caps: Caps) -> Result<Vec<u32>, PromptError> {
        let (ids, field) = match text {
            Text::Prompt(p) => {
                caps.check_chars(p, "prompt")?;
                (self.encode_str(p, true, "prompt")?, "prompt")
            }
            Text::Messages {
                messages,
                add_generation_prompt,
            } => {
                let chat = self
                    .chat
                    .as_ref()
                    .ok_or_else(|| PromptError::NoChatTemplate {
                        model: self.name.clone(),
                    })?;
                let rendered = chat.render(messages, *add_generation_prompt).map_err(|e| {
                    PromptError::Render {
                        model: self.name.clone(),
                        msg: render_error(&e),
                    }
                })?;
                caps.check_chars(&rendered, "messages")?;
                (self.encode_str(&rendered, false, "messages")?, "messages")
            }
        };
        caps.check_tokens(&ids, field)?;
        Ok(ids)
    }

    fn encode_str(
        &self,
        s: &str,
        add_special_tokens: bool,
        field: &'static str,
    ) -> Result<Vec<u32>, PromptError> {
        // No offsets are needed: the fast variant skips computing them.
        self.tokenizer
            .encode_fast(s, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PromptError::Encode {
                model: self.name.clone(),
                field,
                msg: e.to_string(),
            })
    }
}

/// A render error with its cause: `raise_exception`'s message is the useful part.
fn render_error(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

impl ChatTemplate {
    /// Compile `source` the way transformers does: Jinja2 with `trim_blocks` and
    /// `lstrip_blocks`, loop controls, Python's string and dict methods,
    /// `raise_exception` and `strftime_now`.
    fn new(
        source: String,
        config: &HashMap<String, serde_json::Value>,
    ) -> Result<ChatTemplate, minijinja::Error> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE, source)?;
        let special = SPECIAL_TOKENS
            .iter()
            .filter_map(|&key| Some((key, Value::from(token_content(config.get(key)?)?))))
            .collect();
        Ok(ChatTemplate { env, special })
    }

    fn render(
        &self,
        messages: &Messages,
        add_generation_prompt: bool,
    ) -> Result<String, minijinja::Error> {
        let mut ctx = self.special.clone();
        ctx.insert("messages", Value::from(messages.0.clone()));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        // transformers passes these as None: templates test `tools is not none`, which
        // an undefined value would pass.
        ctx.insert("tools", Value::from(()));
        ctx.insert("documents", Value::from(()));
        self.env.get_template(TEMPLATE)?.render(ctx)
    }
}

/// A special token as `tokenizer_config.json` writes it: a string, or an
/// `AddedToken` object whose `content` is the string.
fn token_content(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// transformers' `strftime_now(format)`: the local time, formatted by the C
/// library's `strftime` as Python's is (Llama 3's templates date their system
/// message with it, so the engine's prompt carries today's date).
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let bad = |msg: &str| minijinja::Error::new(ErrorKind::InvalidOperation, msg.to_string());
    let fmt = std::ffi::CString::new(format).map_err(|_| bad("strftime_now: NUL in format"))?;
    // SAFETY: `time` with a null pointer only returns the time.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: `tm` is integers and a pointer, for which all zeros are valid.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: `localtime_r` reads `now` and writes only the `tm` we pass.
    if unsafe { libc::localtime_r(&now, &mut tm) }.is_null() {
        return Err(bad("strftime_now: no local time"));
    }
    // 0 is both "empty result" and "too small": grow a few times, then accept it.
    let mut cap = 64 + 4 * fmt.as_bytes().len();
    for _ in 0..4 {
        let mut buf = vec![0u8; cap];
        // SAFETY: `strftime` writes at most `buf.len()` bytes into `buf` and reads
        // the NUL-terminated format and the `tm` filled above.
        let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm) };
        if n > 0 || fmt.as_bytes().is_empty() {
            buf.truncate(n);
            return String::from_utf8(buf).map_err(|_| bad("strftime_now: not UTF-8"));
        }
        cap *= 4;
    }
    Ok(String::new())
}

/// The tests' tokenizer, shared with the black-box tests.
#[cfg(test)]
#[path = "../tests/it/support/tokenizer.rs"]
mod test_tokenizer;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The tests' word-level tokenizer (`[UNK]` 0, `<s>` 1, `</s>` 2, `<|user|>` 3,
    /// `<|assistant|>` 4, `<|system|>` 5, word `tN` id N for N in 10..1000), its file
    /// truncating to 4 tokens.
    pub fn tokenizer_json() -> String {
        test_tokenizer::tokenizer_json(serde_json::json!(
            {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
        ))
    }

    /// A chat template in HF style: BOS from the config, `raise_exception`, Python's
    /// `.strip()`, a loop control, `add_generation_prompt`, and `tools` none.
    pub const TEMPLATE_SRC: &str = "{{ bos_token }}
{% for m in messages %}
{% if m['role'] not in ['system', 'user', 'assistant'] %}
{{ raise_exception('unknown role ' + m['role']) }}
{% endif %}
{% if m['role'] == 'system' and loop.index0 > 0 %}{% continue %}{% endif %}
<|{{ m['role'] }}|> {{ m['content'].strip() }} {{ eos_token }}
{% endfor %}
{% if tools is not none %}tools{% endif %}
{% if add_generation_prompt %}<|assistant|>{% endif %}";

    pub fn config_json() -> String {
        serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "special": true},
            "eos_token": "</s>",
            "chat_template": TEMPLATE_SRC,
        })
        .to_string()
    }

    /// A fresh directory under the system temp dir.
    pub fn temp_dir(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("kvix-prompt-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn with_chat() -> (PathBuf, Prompts) {
        let d = temp_dir("chat");
        std::fs::write(d.join("tokenizer.json"), tokenizer_json()).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), config_json()).unwrap();
        let spec = format!("m={}", d.display());
        (d, Prompts::load(&[spec]).unwrap())
    }

    fn messages(v: serde_json::Value) -> Text {
        Text::Messages {
            messages: serde_json::from_value(v).unwrap(),
            add_generation_prompt: true,
        }
    }

    #[test]
    fn a_prompt_gets_the_tokenizers_special_tokens_and_no_truncation() {
        let (d, p) = with_chat();
        let m = p.model_for("m", &Text::Prompt(String::new())).unwrap();
        // The file truncates to 4 tokens; transformers does not, and neither does kvix.
        let text = Text::Prompt("t10 t11  t12\nt13 t999 nope".into());
        assert_eq!(m.encode(&text).unwrap(), vec![1, 10, 11, 12, 13, 999, 0]);
        // Added tokens inside a prompt are themselves.
        let text = Text::Prompt("<|user|> t10</s>".into());
        assert_eq!(m.encode(&text).unwrap(), vec![1, 3, 10, 2]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn messages_render_like_transformers_and_encode_without_added_special_tokens() {
        let (d, p) = with_chat();
        let text = messages(serde_json::json!([
            {"role": "system", "content": " t20 "},
            {"role": "user", "content": "t21 t22"},
            {"role": "system", "content": "t23"},
            {"role": "assistant", "content": "t24"},
        ]));
        let m = p.model_for("m", &text).unwrap();
        let Text::Messages { messages, .. } = &text else {
            unreachable!()
        };
        // Python's Jinja2, configured as transformers configures it, renders exactly
        // this: block lines leave nothing behind (trim_blocks, lstrip_blocks).
        assert_eq!(
            m.chat.as_ref().unwrap().render(messages, true).unwrap(),
            "<s>\n<|system|> t20 </s>\n<|user|> t21 t22 </s>\n<|assistant|> t24 </s>\n<|assistant|>"
        );
        // The template's own BOS only: no second one from the post-processor.
        assert_eq!(
            m.encode(&text).unwrap(),
            vec![1, 5, 20, 2, 3, 21, 22, 2, 4, 24, 2, 4]
        );
        let Text::Messages { messages, .. } = text else {
            unreachable!()
        };
        let no_gen = Text::Messages {
            messages,
            add_generation_prompt: false,
        };
        assert_eq!(
            m.encode(&no_gen).unwrap(),
            vec![1, 5, 20, 2, 3, 21, 22, 2, 4, 24, 2]
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn template_refusals_and_missing_models_name_their_field() {
        let (d, p) = with_chat();
        let bad = messages(serde_json::json!([{"role": "tool", "content": "x"}]));
        let e = p.model_for("m", &bad).unwrap().encode(&bad).unwrap_err();
        assert_eq!(e.field(), "messages");
        assert!(e.to_string().contains("unknown role tool"), "{e}");

        let e = p
            .model_for("other", &Text::Prompt("t10".into()))
            .unwrap_err();
        assert_eq!(e.field(), "prompt");
        assert!(e.to_string().contains("--tokenizer other=PATH"), "{e}");
        let e = p.model_for("other", &bad).unwrap_err();
        assert_eq!(e.field(), "messages");

        // A tokenizer without a config has no template: messages are refused.
        let plain = temp_dir("plain");
        let file = plain.join("tokenizer.json");
        std::fs::write(&file, tokenizer_json()).unwrap();
        let p = Prompts::load(&[format!("p={}", file.display())]).unwrap();
        let e = p.model_for("p", &bad).unwrap_err();
        assert!(matches!(e, PromptError::NoChatTemplate { .. }), "{e}");
        assert_eq!(e.field(), "messages");
        assert_eq!(
            p.model_for("p", &Text::Prompt("t10".into()))
                .unwrap()
                .encode(&Text::Prompt("t10".into()))
                .unwrap(),
            vec![1, 10]
        );
        std::fs::remove_dir_all(d).unwrap();
        std::fs::remove_dir_all(plain).unwrap();
    }

    #[test]
    fn chat_template_jinja_wins_and_named_templates_pick_default() {
        let d = temp_dir("jinja");
        std::fs::write(d.join("tokenizer.json"), tokenizer_json()).unwrap();
        let config = serde_json::json!({
            "bos_token": "<s>",
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
            ],
        });
        std::fs::write(d.join("tokenizer_config.json"), config.to_string()).unwrap();
        let spec = [format!("m={}", d.display())];
        let text = messages(serde_json::json!([{"role": "user", "content": "t42"}]));
        let m = Prompts::load(&spec).unwrap().model_for("m", &text).unwrap();
        assert_eq!(m.encode(&text).unwrap(), vec![1, 42]);

        std::fs::write(
            d.join("chat_template.jinja"),
            "{{ messages[0]['content'] }} t43",
        )
        .unwrap();
        let m = Prompts::load(&spec).unwrap().model_for("m", &text).unwrap();
        assert_eq!(m.encode(&text).unwrap(), vec![42, 43]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn bad_specs_and_files_are_load_errors() {
        let d = temp_dir("bad");
        let load = |s: &str| Prompts::load(&[s.to_string()]).unwrap_err().to_string();
        assert!(load("no-equals").contains("expected MODEL=PATH"));
        assert!(load("=x").contains("expected MODEL=PATH"));
        let missing = d.join("missing.json");
        let e = load(&format!("m={}", missing.display()));
        assert!(
            e.contains("cannot read") && e.contains("missing.json"),
            "{e}"
        );

        let junk = d.join("junk.json");
        std::fs::write(&junk, "{\"model\": 1}").unwrap();
        let e = load(&format!("m={}", junk.display()));
        assert!(e.contains("not a Hugging Face tokenizer.json"), "{e}");

        std::fs::write(d.join("tokenizer.json"), tokenizer_json()).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), "{").unwrap();
        let e = load(&format!("m={}", d.display()));
        assert!(e.contains("tokenizer_config.json"), "{e}");
        let broken = serde_json::json!({"chat_template": "{% for %}"}).to_string();
        std::fs::write(d.join("tokenizer_config.json"), broken).unwrap();
        let e = load(&format!("m={}", d.display()));
        assert!(e.contains("does not compile"), "{e}");

        std::fs::remove_file(d.join("tokenizer_config.json")).unwrap();
        let twice = [format!("m={}", d.display()), format!("m={}", d.display())];
        let e = Prompts::load(&twice).unwrap_err().to_string();
        assert!(e.contains("more than once"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn strftime_now_formats_the_local_date() {
        let year = strftime_now("%Y".into()).unwrap();
        assert_eq!(year.len(), 4, "{year}");
        assert!(year.chars().all(|c| c.is_ascii_digit()));
        assert_eq!(strftime_now(String::new()).unwrap(), "");
        assert!(strftime_now("a\0b".into()).is_err());
    }
}
