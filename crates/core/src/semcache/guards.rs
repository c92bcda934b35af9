//! Guards against false semantic hits: checks on the text of two messages whose embeddings
//! are close, for the differences a static or bag-of-words embedder cannot see.
//!
//! Such embedders average word vectors, so word order is invisible to them ("5 km to miles"
//! and "5 miles to km" embed identically) and a changed number or an added negation moves the
//! vector very little ("with" and "without alcohol" score about 0.97 on a 256-dimension static
//! model, questions with their numbers changed about 0.98, while paraphrases range 0.69 to
//! 0.94): no threshold separates them. So a similarity hit must also pass three textual
//! checks, each of which can be turned off:
//! - **numbers**: the same numbers, in the same order (digits, with the number words zero to
//!   twelve read as digits, so "five" and "5" agree; "one" is not, being a pronoun as often);
//! - **negation**: the same count of negation words ("not", "no", "never", "without", any
//!   "n't", ...);
//! - **order**: the content words the two messages share appear in the same relative order.

use serde::{Deserialize, Serialize};

/// Which guards apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Guards {
    /// The numbers must agree.
    pub numbers: bool,
    /// The negation words must agree.
    pub negation: bool,
    /// The shared content words must keep their order.
    pub order: bool,
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            numbers: true,
            negation: true,
            order: true,
        }
    }
}

/// The guard that stopped a similarity hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Guard {
    /// The numbers differ.
    Numbers,
    /// The negation words differ.
    Negation,
    /// The shared content words are in another order.
    Order,
}

impl Guard {
    /// A label for metrics.
    pub fn name(self) -> &'static str {
        match self {
            Guard::Numbers => "numbers",
            Guard::Negation => "negation",
            Guard::Order => "order",
        }
    }
}

/// Words that negate what follows them. Contractions ending in "n't" count too (see
/// [`is_negation`]).
const NEGATIONS: &[&str] = &[
    "not",
    "no",
    "never",
    "without",
    "nor",
    "none",
    "neither",
    "nobody",
    "nothing",
    "nowhere",
    "cannot",
    "cant",
    "dont",
    "doesnt",
    "didnt",
    "isnt",
    "arent",
    "wasnt",
    "werent",
    "wont",
    "shouldnt",
    "couldnt",
    "wouldnt",
    "except",
    "excluding",
];

/// Function words that carry no content: left out of the order check.
const STOPWORDS: &[&str] = &[
    "a", "an", "the", "to", "of", "in", "on", "at", "for", "from", "by", "with", "into", "and",
    "or", "but", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "i",
    "me", "my", "you", "your", "we", "our", "it", "its", "this", "that", "these", "those", "what",
    "which", "who", "whom", "how", "why", "when", "where", "please", "can", "could", "would",
    "should", "will", "shall", "may", "might", "must", "there", "here", "as", "so", "if", "then",
    "than", "about", "tell", "give", "some", "any", "s", "much", "many",
];

/// Number words read as digits. "one" is left out: it is a pronoun as often as a number
/// ("this one").
const NUMBER_WORDS: &[(&str, &str)] = &[
    ("zero", "0"),
    ("two", "2"),
    ("three", "3"),
    ("four", "4"),
    ("five", "5"),
    ("six", "6"),
    ("seven", "7"),
    ("eight", "8"),
    ("nine", "9"),
    ("ten", "10"),
    ("eleven", "11"),
    ("twelve", "12"),
];

/// The first guard among `guards` that `a` and `b` fail, or `Ok` when they pass them all.
pub fn check(a: &str, b: &str, guards: Guards) -> Result<(), Guard> {
    let (a, b) = (words(a), words(b));
    if guards.numbers && numbers(&a) != numbers(&b) {
        return Err(Guard::Numbers);
    }
    if guards.negation && negations(&a) != negations(&b) {
        return Err(Guard::Negation);
    }
    if guards.order && !same_order(&a, &b) {
        return Err(Guard::Order);
    }
    Ok(())
}

/// Lower-case words: runs of letters, digits and apostrophes, a point or comma kept between
/// two digits ("3.5", "1,000"), a trailing "'s" dropped.
fn words(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = (c == '.' || c == ',')
            && i > 0
            && chars[i - 1].is_ascii_digit()
            && chars.get(i + 1).is_some_and(char::is_ascii_digit);
        if c.is_alphanumeric() || c == '\'' || c == '\u{2019}' || between_digits {
            word.extend(c.to_lowercase());
        } else if !word.is_empty() {
            out.push(finish(std::mem::take(&mut word)));
        }
    }
    if !word.is_empty() {
        out.push(finish(word));
    }
    out.retain(|w| !w.is_empty());
    out
}

fn finish(word: String) -> String {
    let word = word.replace('\u{2019}', "'");
    let word = word.strip_suffix("'s").unwrap_or(&word);
    word.trim_matches('\'').to_string()
}

/// The numbers of a message in order, normalised ("1,000" is "1000", "5.0" is "5", "five" is
/// "5").
fn numbers(words: &[String]) -> Vec<String> {
    words
        .iter()
        .filter_map(|w| {
            if let Some((_, n)) = NUMBER_WORDS.iter().find(|(word, _)| word == w) {
                return Some((*n).to_string());
            }
            if !w.starts_with(|c: char| c.is_ascii_digit()) {
                return None;
            }
            let digits: String = w
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',')
                .filter(|c| *c != ',')
                .collect();
            let n = match digits.split_once('.') {
                Some((int, frac)) if frac.trim_end_matches('0').is_empty() => int.to_string(),
                Some((int, frac)) => format!("{int}.{}", frac.trim_end_matches('0')),
                None => digits,
            };
            // Units glued to the number ("5km") stay part of the word for the order check.
            Some(n)
        })
        .collect()
}

fn is_negation(word: &str) -> bool {
    NEGATIONS.contains(&word) || word.ends_with("n't")
}

fn negations(words: &[String]) -> usize {
    words.iter().filter(|w| is_negation(w)).count()
}

fn content(words: &[String]) -> Vec<&str> {
    words
        .iter()
        .map(String::as_str)
        .filter(|w| !STOPWORDS.contains(w) && !is_negation(w))
        .collect()
}

/// Whether the content words that occur once in each message keep their relative order.
fn same_order(a: &[String], b: &[String]) -> bool {
    let (a, b) = (content(a), content(b));
    let once = |list: &[&str], w: &str| list.iter().filter(|x| **x == w).count() == 1;
    let shared: Vec<&str> = a
        .iter()
        .copied()
        .filter(|w| once(&a, w) && once(&b, w))
        .collect();
    let in_b: Vec<usize> = shared
        .iter()
        .filter_map(|w| b.iter().position(|x| x == w))
        .collect();
    in_b.windows(2).all(|p| p[0] < p[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Guards {
        Guards::default()
    }

    #[test]
    fn swapped_units_fail_the_order_guard() {
        assert_eq!(
            check("5 km to miles", "5 miles to km", all()),
            Err(Guard::Order)
        );
        assert_eq!(
            check("5 km to miles", "convert 5 km to miles", all()),
            Ok(())
        );
    }

    #[test]
    fn numbers_must_agree() {
        let q = "Tom has 3 apples and buys 4 more. How many now?";
        let changed = "Tom has 3 apples and buys 5 more. How many now?";
        assert_eq!(check(q, changed, all()), Err(Guard::Numbers));
        assert_eq!(check("add five and 2", "add 5 and 2.0", all()), Ok(()));
        assert_eq!(
            check("costs 1,000 dollars", "costs 1000 dollars", all()),
            Ok(())
        );
    }

    #[test]
    fn negation_must_agree() {
        let with = "a cocktail recipe with alcohol";
        let without = "a cocktail recipe without alcohol";
        assert_eq!(check(with, without, all()), Err(Guard::Negation));
        assert_eq!(
            check("is it safe", "isn't it safe", all()),
            Err(Guard::Negation)
        );
        assert_eq!(check("don't stop", "do not stop", all()), Ok(()));
    }

    #[test]
    fn guards_can_be_turned_off() {
        let none = Guards {
            numbers: false,
            negation: false,
            order: false,
        };
        assert_eq!(check("5 km to miles", "6 miles to km", none), Ok(()));
    }
}
