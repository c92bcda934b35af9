//! The fast path against the tokenizers crate, on the test tokenizer and on texts made to hit
//! every branch of the pattern: contractions, the optional space, Unicode letters, numbers and
//! whitespace (including characters whose class differs between Unicode versions), text that
//! is not in NFC, and long runs.

use super::*;
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::LazyLock;
use tokenizers::Tokenizer;

fn json() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../test-data/tokenizer/tokenizer.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn reference(json: &Value) -> Tokenizer {
    serde_json::from_value(json.clone()).unwrap()
}

fn hf(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode_fast(text, false).unwrap().get_ids().to_vec()
}

fn fast(bpe: &ByteLevelBpe, text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    bpe.encode(text, &mut out).then_some(out)
}

const ATOMS: &[&str] = &[
    "the",
    " the",
    "router",
    "Router",
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'x",
    "'",
    " '",
    "'S",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u{b}",
    "\u{c}",
    "\u{85}",
    "\u{a0}",
    "\u{1680}",
    "\u{2003}",
    "\u{2028}",
    "\u{3000}",
    "\u{200b}",
    "\u{feff}",
    "\u{180e}",
    "0",
    "42",
    " 7",
    "٣",
    "²",
    "Ⅻ",
    "½",
    "é",
    "e\u{301}",
    "Å",
    "東京",
    "ñ",
    "ß",
    "Ω",
    "ǅ",
    "ʰ",
    "\u{5d0}",
    "🙂",
    "👩‍💻",
    "!",
    "?!",
    ".",
    ",",
    "-",
    "_",
    "()",
    "{\"a\": 1}",
    "<|im",
    "\u{0}",
    "\u{7f}",
    "\u{ad}",
    "ﬁ",
    "ｔｅｓｔ",
    "\u{e000}",
    "\u{10ffff}",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(ATOMS).prop_map(str::to_owned),
            1 => any::<char>().prop_map(String::from),
            1 => "[ a-zA-Z0-9'\n]{1,40}",
        ],
        0..60,
    )
    .prop_map(|parts| parts.concat())
}

/// The test tokenizer, loaded once for every case.
static TEST_TOKENIZER: LazyLock<(Tokenizer, ByteLevelBpe)> = LazyLock::new(|| {
    let json = json();
    (reference(&json), ByteLevelBpe::from_json(&json).unwrap())
});

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn fast_path_equals_the_tokenizers_crate(text in text()) {
        let (tok, bpe) = &*TEST_TOKENIZER;
        // Non-NFC text is declined, never encoded differently.
        if let Some(ids) = fast(bpe, &text) {
            prop_assert_eq!(ids, hf(tok, &text));
        } else {
            prop_assert!(!unicode_normalization_alignments::is_nfc(&text));
        }
    }
}

#[test]
fn the_same_text_twice_comes_from_the_cache_unchanged() {
    let json = json();
    let (tok, bpe) = (reference(&json), ByteLevelBpe::from_json(&json).unwrap());
    let text = "It's the router's cache: 12,345 prefixes   hit\n\n and  miss. ".repeat(50);
    let first = fast(&bpe, &text).unwrap();
    assert_eq!(first, hf(&tok, &text));
    assert_eq!(fast(&bpe, &text).unwrap(), first);
    assert!(!bpe.cache.lock().unwrap().is_empty());
}

#[test]
fn ignore_merges_takes_whole_vocabulary_words() {
    let mut json = json();
    json["model"]["ignore_merges"] = Value::Bool(true);
    let (tok, bpe) = (reference(&json), ByteLevelBpe::from_json(&json).unwrap());
    assert!(bpe.whole_words.is_some());
    for text in [
        "the router sends each request",
        " hello world",
        "Ġ weird",
        "x",
    ] {
        assert_eq!(fast(&bpe, text).unwrap(), hf(&tok, text), "{text:?}");
    }
}

#[test]
fn shapes_it_cannot_reproduce_are_declined() {
    let base = json();
    let mut cases = Vec::new();
    let mut prefix_space = base.clone();
    prefix_space["pre_tokenizer"]["add_prefix_space"] = Value::Bool(true);
    cases.push(("add_prefix_space", prefix_space));
    let mut nfkc = base.clone();
    nfkc["normalizer"] = serde_json::json!({"type": "NFKC"});
    cases.push(("NFKC", nfkc));
    let mut suffix = base.clone();
    suffix["model"]["end_of_word_suffix"] = Value::String("</w>".into());
    cases.push(("suffix", suffix));
    let mut dropout = base.clone();
    dropout["model"]["dropout"] = serde_json::json!(0.1);
    cases.push(("dropout", dropout));
    let mut split = base.clone();
    split["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "▁"});
    cases.push(("metaspace", split));
    let mut missing_byte = base.clone();
    missing_byte["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .remove("Ġ");
    cases.push(("a byte missing", missing_byte));
    for (name, json) in cases {
        assert!(ByteLevelBpe::from_json(&json).is_none(), "{name}");
    }
    assert!(ByteLevelBpe::from_json(&base).is_some());
}
