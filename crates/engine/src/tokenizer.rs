//! A cheap, deterministic stand-in for a real tokenizer, and the deterministic output text.
//!
//! Real engines use BPE tokenizers whose vocabularies we do not ship. What a router cares about
//! is only that equal text gives equal token ids, that a shared text prefix gives a shared token
//! prefix (so the prefix cache behaves as in vLLM), and that token counts track text length
//! roughly as BPE does (about four bytes per token for English). So:
//!
//! - the text is cut into *pieces*: a run of ASCII letters/digits (with the single space before
//!   it, as BPE merges a leading space into the word), any other single character, and a run
//!   longer than [`MAX_PIECE_BYTES`] bytes is cut into pieces of at most that many bytes;
//! - each piece's id is `xxh3_64(piece) mod VOCAB_SIZE`, offset past the special ids.
//!
//! Chat requests are rendered with a fixed template (`<|role|>\ncontent\n` per message, then
//! `<|assistant|>\n`; see [`ChatEnd`] for vLLM's flags that change the end) before tokenizing, so a conversation that grows by turns keeps its prefix.
//!
//! Output text is a sequence of words from [`WORDS`], chosen from a hash of the request's prompt
//! tokens, the engine seed and the output position: the same request gives the same text.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Size of the emulated vocabulary (ids `0..VOCAB_SIZE`); a Llama-2-like 32,000.
pub const VOCAB_SIZE: u32 = 32_000;
/// Ids below this are reserved for special tokens and never produced from text.
const FIRST_TEXT_ID: u32 = 16;
/// The longest piece, in bytes, before a run of letters is cut.
pub const MAX_PIECE_BYTES: usize = 4;

/// The words output text is drawn from; each is one output token with a leading space.
pub const WORDS: [&str; 32] = [
    " the", " model", " cache", " token", " of", " and", " request", " block", " engine", " to",
    " a", " prefix", " batch", " in", " decode", " load", " is", " stream", " for", " router",
    " on", " queue", " with", " latency", " first", " time", " that", " memory", " by", " replica",
    " at", " step",
];

/// Appends the token ids of `text` to `out`.
pub fn tokenize_into(text: &str, out: &mut Vec<u32>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        // A single space directly before a word belongs to the word.
        let word_start =
            if bytes[i] == b' ' && bytes.get(i + 1).is_some_and(u8::is_ascii_alphanumeric) {
                i + 1
            } else {
                i
            };
        if bytes[word_start].is_ascii_alphanumeric() {
            let mut end = word_start;
            while end < bytes.len() && bytes[end].is_ascii_alphanumeric() {
                end += 1;
            }
            let mut piece_start = start;
            while piece_start < end {
                let piece_end = (piece_start + MAX_PIECE_BYTES).min(end);
                out.push(piece_id(&bytes[piece_start..piece_end]));
                piece_start = piece_end;
            }
            i = end;
        } else {
            // One character (all of its UTF-8 bytes).
            let len = text[i..].chars().next().map_or(1, char::len_utf8);
            out.push(piece_id(&bytes[i..i + len]));
            i += len;
        }
    }
}

/// The token ids of `text`.
pub fn tokenize(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 3 + 1);
    tokenize_into(text, &mut out);
    out
}

fn piece_id(piece: &[u8]) -> u32 {
    FIRST_TEXT_ID + (xxh3_64(piece) % u64::from(VOCAB_SIZE - FIRST_TEXT_ID)) as u32
}

/// How a rendered conversation ends, as vLLM's chat flags say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatEnd {
    /// `add_generation_prompt` (the default): a new assistant turn is opened.
    GenerationPrompt,
    /// `add_generation_prompt: false`: the render ends after the last message.
    Closed,
    /// `continue_final_message`: the last message is left open (no end of message after its
    /// content), so generation continues it; a gateway resuming a broken stream sends the text
    /// streamed so far this way.
    ContinueFinal,
}

/// Renders chat messages with the emulator's template and tokenizes them.
pub fn tokenize_chat<'a>(
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    end: ChatEnd,
) -> Vec<u32> {
    let mut out = Vec::new();
    let mut messages = messages.into_iter().peekable();
    while let Some((role, content)) = messages.next() {
        tokenize_into("<|", &mut out);
        tokenize_into(role, &mut out);
        tokenize_into("|>\n", &mut out);
        tokenize_into(content, &mut out);
        if end != ChatEnd::ContinueFinal || messages.peek().is_some() {
            tokenize_into("\n", &mut out);
        }
    }
    if end == ChatEnd::GenerationPrompt {
        tokenize_into("<|assistant|>\n", &mut out);
    }
    out
}

/// A per-request seed for output text and length: the prompt's tokens mixed with the engine seed.
pub fn request_seed(prompt: &[u32], engine_seed: u64) -> u64 {
    let mut h = engine_seed;
    for chunk in prompt.chunks(64) {
        let mut buf = [0u8; 256];
        for (j, t) in chunk.iter().enumerate() {
            buf[j * 4..j * 4 + 4].copy_from_slice(&t.to_le_bytes());
        }
        h = xxh3_64_with_seed(&buf[..chunk.len() * 4], h);
    }
    h
}

/// The text of output token `position` of a request with seed `seed`.
pub fn output_word(seed: u64, position: u32) -> &'static str {
    let h = xxh3_64_with_seed(&position.to_le_bytes(), seed);
    WORDS[(h % WORDS.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn words_and_punctuation_become_pieces() {
        // "Hello" -> "Hell" + "o"; " world" -> " wor" + "ld"; "!" one piece.
        assert_eq!(tokenize("Hello world!").len(), 5);
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("a b c").len(), 3);
    }

    #[test]
    fn ids_are_in_vocabulary_and_stable() {
        let a = tokenize("The quick brown fox jumps over the lazy dog, twice.");
        assert!(a.iter().all(|&t| (FIRST_TEXT_ID..VOCAB_SIZE).contains(&t)));
        assert_eq!(
            a,
            tokenize("The quick brown fox jumps over the lazy dog, twice.")
        );
    }

    #[test]
    fn chat_template_keeps_the_conversation_prefix() {
        let end = ChatEnd::GenerationPrompt;
        let one = tokenize_chat([("system", "be brief"), ("user", "hi")], end);
        let two = tokenize_chat(
            [("system", "be brief"), ("user", "hi"), ("assistant", "yo")],
            end,
        );
        let shared = one.len() - tokenize("<|assistant|>\n").len();
        assert_eq!(one[..shared], two[..shared]);
    }

    #[test]
    fn continuing_the_final_message_extends_the_generation_prompt() {
        let asked = tokenize_chat([("user", "hi")], ChatEnd::GenerationPrompt);
        let continued = tokenize_chat(
            [("user", "hi"), ("assistant", " the model")],
            ChatEnd::ContinueFinal,
        );
        // The open assistant turn is the generation prompt followed by the text so far.
        assert_eq!(continued[..asked.len()], asked[..]);
        assert_eq!(continued[asked.len()..], tokenize(" the model")[..]);
        let closed = tokenize_chat([("user", "hi")], ChatEnd::Closed);
        assert_eq!(closed[..], asked[..closed.len()]);
        assert!(closed.len() < asked.len());
    }

    #[test]
    fn output_text_depends_on_seed_and_position() {
        let seed = request_seed(&tokenize("hello"), 7);
        let text: String = (0..16).map(|i| output_word(seed, i)).collect();
        let again: String = (0..16).map(|i| output_word(seed, i)).collect();
        let other: String = (0..16)
            .map(|i| output_word(request_seed(&[1], 7), i))
            .collect();
        assert_eq!(text, again);
        assert_ne!(text, other);
    }

    proptest! {
        #[test]
        fn a_text_prefix_ending_at_a_space_gives_a_token_prefix(a in "[a-z ,.]{0,60}", b in "[a-z ,.]{0,60}") {
            // Cutting at a non-word character is a piece boundary.
            let head = format!("{a}.");
            let whole = format!("{head}{b}");
            let t_head = tokenize(&head);
            let t_whole = tokenize(&whole);
            prop_assert_eq!(&t_whole[..t_head.len()], &t_head[..]);
        }

        #[test]
        fn token_count_is_bounded_by_bytes(text in "\\PC{0,200}") {
            let n = tokenize(&text).len();
            prop_assert!(n <= text.len());
            prop_assert!(n >= text.len() / (MAX_PIECE_BYTES + 1));
        }
    }
}
