//! The tests' tokenizer, one for the black-box tests and `src/prompt.rs`'s unit
//! tests (which include this file by path): a word-level tokenizer.json whose ids
//! are known by construction.

use serde_json::{Value, json};

/// Special tokens of the test vocabulary, by id.
pub const SPECIAL: [&str; 6] = [
    "[UNK]",
    "<s>",
    "</s>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
];

/// The tokenizer.json: the special tokens above, then word `tN` is id N
/// (10 ≤ N < 1000); a plain encode puts `<s>` in front (its post-processor).
/// `truncation` is the file's own setting (`null`: none).
pub fn tokenizer_json(truncation: Value) -> String {
    let mut vocab = serde_json::Map::new();
    for (i, t) in SPECIAL.iter().enumerate() {
        vocab.insert((*t).into(), i.into());
    }
    for n in 10..1000 {
        vocab.insert(format!("t{n}"), n.into());
    }
    let added: Vec<Value> = (1..SPECIAL.len())
        .map(|id| {
            json!({"id": id, "content": SPECIAL[id], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": truncation,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}
