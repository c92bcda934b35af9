//! Hugging Face's `ByteLevel` pre-tokenizer (with `use_regex`), written out by hand: the text is
//! cut where GPT-2's pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` cuts it, and
//! each piece's bytes are then spelt in GPT-2's byte alphabet.
//!
//! Why by hand: the tokenizers crate runs the pattern through a backtracking regex engine over
//! a string that tracks every byte's alignment, and that is most of its 2 MB/s on chat text
//! (`cargo bench -p kvgate-tokenize`). The pattern is simple enough to follow with one look at
//! each character: its alternatives start with a distinct class, and the one lookahead only
//! leaves a run of whitespace's last character to the next piece when something follows.
//! Letters and numbers are Unicode's `L` and `N` categories from regex-syntax's tables,
//! whitespace is the `White_Space` property, as in Oniguruma's `\s`; the property test in
//! `bpe_tests.rs` holds both against the tokenizers crate.

use regex_syntax::hir::{Class as HirClass, HirKind};
use std::cmp::Ordering;
use std::sync::LazyLock;

/// Which alternative of the pattern a character can start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

struct Tables {
    ascii: [Class; 128],
    letters: Vec<(char, char)>,
    numbers: Vec<(char, char)>,
}

/// The ranges of a Unicode class such as `\p{L}`, from regex-syntax's tables.
fn ranges(class: &str) -> Vec<(char, char)> {
    let hir = regex_syntax::Parser::new()
        .parse(class)
        .expect("a Unicode class regex-syntax knows");
    match hir.kind() {
        HirKind::Class(HirClass::Unicode(c)) => {
            c.ranges().iter().map(|r| (r.start(), r.end())).collect()
        }
        other => unreachable!("{class} parsed as {other:?}"),
    }
}

fn in_ranges(ranges: &[(char, char)], c: char) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                Ordering::Less
            } else if lo > c {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        })
        .is_ok()
}

static TABLES: LazyLock<Tables> = LazyLock::new(|| {
    let letters = ranges(r"\p{L}");
    let numbers = ranges(r"\p{N}");
    let mut ascii = [Class::Other; 128];
    for (b, class) in ascii.iter_mut().enumerate() {
        let c = b as u8 as char;
        *class = if c.is_whitespace() {
            Class::Space
        } else if in_ranges(&letters, c) {
            Class::Letter
        } else if in_ranges(&numbers, c) {
            Class::Number
        } else {
            Class::Other
        };
    }
    Tables {
        ascii,
        letters,
        numbers,
    }
});

fn class(tables: &Tables, c: char) -> Class {
    if c.is_ascii() {
        tables.ascii[c as usize]
    } else if c.is_whitespace() {
        Class::Space
    } else if in_ranges(&tables.letters, c) {
        Class::Letter
    } else if in_ranges(&tables.numbers, c) {
        Class::Number
    } else {
        Class::Other
    }
}

/// The character at byte `at` of `text` (a char boundary before its end).
fn char_at(text: &str, at: usize) -> char {
    text[at..].chars().next().expect("inside the text")
}

/// Length of the contraction (`s`, `t`, `re`, `ve`, `m`, `ll`, `d`) that `rest` starts with.
fn contraction(rest: &[u8]) -> Option<usize> {
    match rest {
        [b'r', b'e', ..] | [b'v', b'e', ..] | [b'l', b'l', ..] => Some(2),
        [b's' | b't' | b'm' | b'd', ..] => Some(1),
        _ => None,
    }
}

/// Calls `piece` with each piece of `text`, in order; together they are the whole text.
pub(crate) fn split<'t>(text: &'t str, mut piece: impl FnMut(&'t str)) {
    let tables = &*TABLES;
    let bytes = text.as_bytes();
    let end = text.len();
    let mut at = 0;
    while at < end {
        let c = char_at(text, at);
        if c == '\'' {
            if let Some(n) = contraction(&bytes[at + 1..]) {
                piece(&text[at..at + 1 + n]);
                at += 1 + n;
                continue;
            }
        }
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
        let (run_from, first) = if c == ' ' && at + 1 < end {
            (at + 1, char_at(text, at + 1))
        } else {
            (at, c)
        };
        let run_class = class(tables, first);
        if run_class != Class::Space {
            let mut to = run_from + first.len_utf8();
            while to < end {
                let next = char_at(text, to);
                if class(tables, next) != run_class {
                    break;
                }
                to += next.len_utf8();
            }
            piece(&text[at..to]);
            at = to;
            continue;
        }
        // `\s+(?!\S)|\s+`: a run of whitespace, less its last character when something follows
        // and the run is longer than one.
        let mut to = at;
        let mut last = at;
        while to < end {
            let next = char_at(text, to);
            if class(tables, next) != Class::Space {
                break;
            }
            last = to;
            to += next.len_utf8();
        }
        if to < end && last > at {
            to = last;
        }
        piece(&text[at..to]);
        at = to;
    }
}

/// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the others for the
/// characters from U+0100 on, in byte order (`bytes_to_unicode` in GPT-2's encoder).
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        *slot = if printable {
            b as u8 as char
        } else {
            let c = char::from_u32(next).expect("below the surrogates");
            next += 1;
            c
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(text, |p| out.push(p));
        out
    }

    #[test]
    fn cuts_as_the_gpt2_pattern() {
        assert_eq!(
            pieces("Hello world, it's 2024!!  \n\tok  "),
            ["Hello", " world", ",", " it", "'s", " 2024", "!!", "  \n", "\t", "ok", "  "]
        );
        assert_eq!(pieces(" 'x"), [" '", "x"]);
        assert_eq!(pieces("we'll 're"), ["we", "'ll", " '", "re"]);
        assert_eq!(pieces("  a"), [" ", " a"]);
        assert_eq!(pieces("\n\nb"), ["\n", "\n", "b"]);
        assert_eq!(pieces(" "), [" "]);
        assert_eq!(pieces("東京 ２３"), ["東京", " ２３"]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let chars = byte_chars();
        assert_eq!(chars[b'a' as usize], 'a');
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[0], 'Ā');
        let distinct: std::collections::HashSet<char> = chars.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
